"""The containers provider's images on first use, against real Podman: a missing image is built through
``ordeal images build``'s code with progress, then found; inside the run's namespace a missing image is the
not-built error naming why; a run whose image is missing stops with that error.

Nothing shared is touched: the shared image store (/var/lib/containers/storage, which the other container tests
run) is only read.  The build goes into a throwaway image store of the test's own (CONTAINERS_STORAGE_CONF, the
shared store as a read-only additional store so the Debian base is there) under a throwaway tag, and it builds
the kafka image, the one image whose build needs no network: this test session lives in a private network
namespace without a route to the Debian mirror (tests/conftest.py), so the build is told it is on the host."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.capabilities import missing_capability

from harness import netns

pytestmark = [pytest.mark.integration, pytest.mark.containers, pytest.mark.root, pytest.mark.timeout(600)]
ROOT = Path(__file__).resolve().parents[2]
SHARED_STORE = "/var/lib/containers/storage"


@pytest.fixture(scope="module", autouse=True)
def podman_and_base() -> None:
    if not netns.is_root():
        missing_capability("the containers provider needs root (rootful Podman)")
    if shutil.which("podman") is None:
        missing_capability("podman is not installed (scripts/bootstrap.sh installs it as root)")
    if not netns.in_private_netns():
        missing_capability("the test session is not in its own network namespace (tests/conftest.py)")
    from harness.containers.images import missing_images

    if missing_images(["debian-base"]):
        missing_capability("the Debian base image is not built (run `ordeal images build` first; scripts/test.sh "
                           "does)")


@pytest.fixture()
def throwaway_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An image store of this test's own, seeing the shared store read-only; removed at the end (with the
    mount Podman's overlay driver makes of its own directory)."""
    store = tmp_path / "store"
    conf = tmp_path / "storage.conf"
    conf.write_text("\n".join(["[storage]", 'driver = "overlay"', f'graphroot = "{store / "root"}"',
                               f'runroot = "{store / "run"}"', "[storage.options]",
                               f'additionalimagestores = ["{SHARED_STORE}"]', ""]))
    monkeypatch.setenv("CONTAINERS_STORAGE_CONF", str(conf))
    yield store
    # the driver bind-mounts its own directory (same device: os.path.ismount cannot tell), deepest first
    mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
    for mount in sorted((m for m in mounts if m.startswith(f"{store}/")), key=len, reverse=True):
        subprocess.run(["umount", mount], check=True)
    shutil.rmtree(store, ignore_errors=True)


def _throwaway_tag(monkeypatch: pytest.MonkeyPatch, name: str) -> str:
    """Give one role image a reference nobody else uses (both modules that name images see it)."""
    from harness.containers import autobuild, images

    tag = f"localhost/ordeal-test/{name}-{uuid.uuid4().hex[:8]}:bookworm"
    original = images.image_reference

    def reference(role: str) -> str:
        return tag if role == name else original(role)

    monkeypatch.setattr(images, "image_reference", reference)
    monkeypatch.setattr(autobuild, "image_reference", reference)
    return tag


def test_a_missing_image_is_built_on_first_use_with_progress(throwaway_store, monkeypatch):
    from harness.containers import autobuild
    from harness.containers.images import BY_NAME, expected_hash, image_hash

    base = BY_NAME["debian-base"]
    base_hash = expected_hash(base, {})
    if image_hash(base.reference) != base_hash:  # the build would make the base again: not in this test
        missing_capability(f"the shared {base.reference} is not the current one (run `ordeal images build`)")
    tag = _throwaway_tag(monkeypatch, "kafka")
    assert autobuild.missing_names(["debian-base", "kafka"]) == ["kafka"]
    lines: list[str] = []
    monkeypatch.delenv("ORDEAL_NETNS")  # build_all's own refusal inside a run's namespace: as on the host

    def on_the_host(missing):
        return dataclasses.replace(autobuild.Conditions.here(missing, probe=False), netns="")

    try:
        outcome = autobuild.ensure_images(["debian-base", "kafka"], lines.append, conditions=on_the_host)
        assert outcome.missing == ("kafka",) and outcome.why_not == ""
        assert [(r["name"], r["action"]) for r in outcome.records] == [("debian-base", "reused"), ("kafka", "built")]
        assert autobuild.missing_names(["debian-base", "kafka"]) == []
        assert image_hash(tag) == expected_hash(BY_NAME["kafka"], {"debian-base": base_hash})
        text = "\n".join(lines)
        assert lines[0].startswith("images [") and f"not built yet: {tag}" in lines[0], text
        assert "kafka: STEP 1/" in text and "kafka: COMMIT" in text and lines[-1].endswith("] ready"), text
    finally:
        subprocess.run(["podman", "rmi", "--force", tag], capture_output=True)  # ours only: the throwaway tag
    assert subprocess.run(["podman", "image", "exists", tag]).returncode != 0


def test_inside_the_namespace_a_missing_image_is_the_error_naming_why(throwaway_store, monkeypatch):
    from harness.containers.autobuild import missing_message

    tag = _throwaway_tag(monkeypatch, "kafka")
    assert missing_message(["debian-base"], "hint") == ""
    message = missing_message(["debian-base", "kafka"], "in the host's network namespace, as root")
    assert message.startswith(f"container image(s) not built: {tag}; run `ordeal images build` (in the host's"), message
    assert "not built on first use: this process is inside the run's private network namespace" in message


def test_a_run_whose_image_is_missing_stops_with_the_not_built_error(tmp_path: Path):
    """An external target without an image recipe, on the containers provider: the run stops at its start
    (exit 2, the error in summary.json), naming the image and why it was not built."""
    from support.scenarios import EXTERNAL

    name = f"absent{uuid.uuid4().hex[:6]}"
    scenario = tmp_path / "absent.toml"
    scenario.write_text(EXTERNAL.replace('name = "mq"', f'name = "{name}"')
                        .replace('start = ["mosquitto", "-c", "{run_dir}/m.conf"]',
                                 'start = ["mosquitto"]\nport = 1883') + "\n[workload]\npairs = 1\n")
    out = tmp_path / "out"
    result = subprocess.run([sys.executable, "-m", "ordeal.cli", "run", str(scenario), "--provider", "containers",
                             "--out", str(out), "--no-check"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, result.stderr[-3000:]
    (run_dir,) = out.iterdir()
    error = json.loads((run_dir / "summary.json").read_text())["error"]
    assert f"container image(s) not built: localhost/ordeal/{name}:bookworm; run `ordeal images build`" in error
    assert f"not built on first use: there is no recipe for an image {name!r}" in error, error
