"""The defect catalog is the one source: docs/defects.md is generated from it, every switch is validated."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from reference_broker.config import BrokerConfig, ConfigError
from reference_broker.defects import CATALOG, UnknownDefectError

REPO = Path(__file__).resolve().parents[2]


def test_docs_defects_md_is_what_the_catalog_gives():
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "defects_doc.py"), "--check"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_an_unknown_defect_switch_is_a_start_up_error_naming_the_valid_ones():
    with pytest.raises(ConfigError, match=r"unknown 'no_dup_on_resnd'; known defects: .*no_dup_on_resend"):
        BrokerConfig.from_mapping({"defects": ["no_dup_on_resnd"]}, source="x.toml [broker]")


def test_has_refuses_a_name_that_is_not_in_the_catalog():
    config = BrokerConfig(defects=("trim_newest",))
    assert config.has("trim_newest") and not config.has("trim_off_by_one")
    with pytest.raises(UnknownDefectError, match=r"BrokerConfig.has: unknown defect\(s\) 'trim_newst'.*trim_newest"):
        config.has("trim_newst")  # a misspelt switch in the broker's code: never silently off


def test_every_switch_in_the_broker_code_and_every_where_is_real():
    """Every defect name the broker's code or save script tests is in the catalog, and each catalog entry's
    ``where`` is a file that exists and names the defect (docs/defects.md once named a missing file)."""
    sources = list((REPO / "reference_broker").glob("*.py")) + list((REPO / "lua").glob("*.lua"))
    used = set()
    for path in sources:
        used |= set(re.findall(r"""(?:\.has\(|defect\()["']([a-z_0-9]+)["']\)""", path.read_text()))
    assert used and used <= set(CATALOG), sorted(used - set(CATALOG))
    for defect in CATALOG.values():
        where = REPO / defect.where
        assert where.is_file(), f"{defect.name}: where = {defect.where!r} does not exist"
        assert defect.name in where.read_text(), f"{defect.name} is not switched in {defect.where}"
