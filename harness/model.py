"""The whole scenario model: import this module before loading or planning a scenario.

``contracts/scenario.py`` imports no stage, so the stages register what they know into it: the fault kinds
(faults/catalog.py, at import), the ``[topology]`` table (harness/topology_config.py, at import) and the
reference broker's ``[broker]`` table (here: the harness is what hands that table to the reference broker,
which validates its own configuration and stays free of Ordeal's packages).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import faults.catalog  # noqa: F401  (registers the fault kinds)
import harness.topology_config  # noqa: F401  (registers the [topology] table)
from contracts import scenario as scenario_model
from reference_broker.config import BrokerConfig


def _validate_broker(table: Mapping[str, Any], source: str) -> dict[str, Any]:
    return BrokerConfig.from_mapping(table, source=source).to_dict()


scenario_model.register_broker_validator(_validate_broker)
