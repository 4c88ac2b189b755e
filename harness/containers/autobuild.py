"""The containers provider's images on first use: the images a run needs that are not in the image store are
built then and there, as testcontainers builds an image it lacks, through the same code as ``ordeal images
build`` (harness/containers/images.py build_all), saying its progress.

Where: the build needs the host's network (debootstrap and apt-get inside ``podman build`` reach the Debian
mirror), and a containers run always plays inside its private network namespace (the podman sandbox refuses
to start elsewhere: harness/containers/engine.py), which has only ``lo``.  So the commands that start runs
(``ordeal run``, ``replay``, ``shrink``, ``explore``, ``up``) build before they enter that namespace
(ordeal/commands/images.py ``build_missing_images``); the topology and the external target check again when
they start, inside the namespace, and there only refuse, naming why (``not_built_message``).

``ORDEAL_BUILD_IMAGES=0`` turns the build off: a missing image is then the error it always was.
``decide`` is the whole decision, a pure function of what is missing and of the conditions here."""

from __future__ import annotations

import os
import shutil
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from urllib.parse import urlparse

from harness.containers.images import (
    BY_NAME,
    ImageError,
    build_all,
    debian_mirror,
    image_hash,
    image_reference,
)

ENV = "ORDEAL_BUILD_IMAGES"  # "0" / "false" / "no" / "off": never build on first use
OFF_VALUES = ("0", "false", "no", "off")
PROBE_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Conditions:
    """What decides whether an image can be built here (``here()`` reads them; tests write them)."""

    switch: str = ""  # ORDEAL_BUILD_IMAGES as set ("" = unset: on)
    netns: str = ""  # ORDEAL_NETNS (harness/netns.py MARKER): "private" / "reexec" inside a run's namespace
    docker_host: str = ""  # ORDEAL_DOCKER_HOST: the run's engine is another one (Docker), not this Podman
    uid: int = 0
    podman: bool = True  # podman is on PATH
    debootstrap: bool = True  # debootstrap is on PATH (the Debian base needs it)
    overrides: Mapping[str, str] = field(default_factory=dict)  # image name -> ORDEAL_IMAGE_<NAME>
    mirror: str = ""  # the Debian mirror the build fetches from
    mirror_error: str = ""  # "" = reachable (or not probed)

    @property
    def enabled(self) -> bool:
        return self.switch.strip().lower() not in OFF_VALUES

    @classmethod
    def here(cls, names: Sequence[str], environ: Mapping[str, str] | None = None, *, probe: bool = True) -> Conditions:
        environ = os.environ if environ is None else environ
        mirror = debian_mirror()
        conditions = cls(
            switch=environ.get(ENV, ""),
            netns=environ.get("ORDEAL_NETNS", ""), docker_host=environ.get("ORDEAL_DOCKER_HOST", ""),
            uid=os.geteuid(), podman=shutil.which("podman") is not None,
            debootstrap=shutil.which("debootstrap") is not None,
            overrides={name: environ[override_variable(name)] for name in names
                       if environ.get(override_variable(name))},
            mirror=mirror)
        if probe and not decide(names, conditions).refused:  # the network is asked only when all else allows it
            conditions = replace(conditions, mirror_error=mirror_unreachable(mirror, environ))
        return conditions


@dataclass(frozen=True)
class Decision:
    build: tuple[str, ...]  # image names to hand to build_all ("" when nothing is missing)
    why_not: str = ""  # "" = nothing missing or buildable; else why the missing images cannot be built here

    @property
    def refused(self) -> bool:
        return bool(self.why_not)


def override_variable(name: str) -> str:
    """ORDEAL_IMAGE_<NAME>: the user's own image for a role (harness/containers/images.py image_reference)."""
    return f"ORDEAL_IMAGE_{name.upper().replace('-', '_')}"


def decide(missing: Sequence[str], conditions: Conditions) -> Decision:
    """Which of the missing image names (harness/containers/images.py IMAGES) to build, or why none can be
    built here.  Pure: ``missing`` comes from the image store (``missing_names``), ``conditions`` from
    ``Conditions.here``."""
    if not missing:
        return Decision(())
    if not conditions.enabled:
        return Decision((), f"building on first use is off ({ENV}={conditions.switch})")
    own = [name for name in missing if name in conditions.overrides]
    if own:
        return Decision((), "; ".join(f"{override_variable(name)} names your own image "
                                      f"{conditions.overrides[name]!r}, which is not built here" for name in own))
    unknown = [name for name in missing if name not in BY_NAME]
    if unknown:
        return Decision((), "; ".join(
            f"there is no recipe for an image {name!r} (images/<name>/Containerfile; known: {', '.join(BY_NAME)}): "
            f"build your own and name it with {override_variable(name)}" for name in unknown))
    if conditions.docker_host:
        return Decision((), f"ORDEAL_DOCKER_HOST={conditions.docker_host} is the run's engine, and the images "
                            "are built into Podman's store: build them and load them into that engine "
                            "(docs/containers.md, On a Docker host)")
    if conditions.netns in ("private", "reexec"):
        return Decision((), "this process is inside the run's private network namespace "
                            f"(ORDEAL_NETNS={conditions.netns}), where debootstrap and apt-get cannot reach the "
                            "Debian mirror; the commands that start runs build before they enter it")
    if conditions.uid != 0:
        return Decision((), f"building needs root (rootful Podman's image store, debootstrap); this is uid "
                            f"{conditions.uid}")
    if not conditions.podman:
        return Decision((), "podman is not installed (scripts/bootstrap.sh installs it as root)")
    if "debian-base" in missing and not conditions.debootstrap:
        return Decision((), "debootstrap is not installed (apt-get install debootstrap; scripts/bootstrap.sh does)")
    if conditions.mirror_error:
        return Decision((), f"no network: the Debian mirror {conditions.mirror} is not reachable from here "
                            f"({conditions.mirror_error})")
    return Decision(tuple(missing))


def mirror_unreachable(mirror: str, environ: Mapping[str, str] | None = None) -> str:
    """"" when a TCP connection to the mirror (or to the HTTP proxy apt would use) opens, else why not."""
    environ = os.environ if environ is None else environ
    proxy = environ.get("http_proxy") or environ.get("HTTP_PROXY") or ""
    url = urlparse(proxy or mirror)
    host, port = url.hostname or "", url.port or (443 if url.scheme == "https" else 80)
    if not host:
        return ""  # a file: or odd mirror: nothing to probe; the build says what fails
    try:
        with socket.create_connection((host, port), timeout=PROBE_TIMEOUT_S):
            return ""
    except OSError as error:
        return f"{'proxy ' if proxy else ''}{host}:{port}: {error}"


def missing_names(names: Sequence[str]) -> list[str]:
    """The image names among these whose image (image_reference) is not in the image store."""
    return [name for name in dict.fromkeys(names) if image_hash(image_reference(name)) is None]


def not_built_message(missing: Sequence[str], why_not: str, hint: str) -> str:
    """The error of a run whose images are missing: the references, what to run, and why they were not built."""
    return (f"container image(s) not built: {', '.join(image_reference(name) for name in missing)}; run `ordeal "
            f"images build` ({hint}); not built on first use: {why_not}")


def reference_images(config) -> list[str]:
    """The images a reference-broker topology (harness.topology_config.TopologyConfig) runs."""
    names = ["debian-base", "redis"]
    if config.kafka_storage != "none":
        names.append("kafka")
    if config.storage_kind():
        names.append("s3")
    if config.broker_nodes:
        names.append("broker")
    return names


def external_images(name: str, environ: Mapping[str, str] | None = None) -> list[str]:
    """The images an external target named ``name`` runs as a container: the image named like it, built on the
    Debian base; none to check when ORDEAL_IMAGE_<NAME> names the user's own (the engine may pull it)."""
    environ = os.environ if environ is None else environ
    return [] if environ.get(override_variable(name)) else ["debian-base", name]


def images_for_scenario(scenario) -> list[str]:
    """The images a scenario (contracts.scenario.Scenario) runs on the containers provider; [] when it does not
    run on that provider."""
    if scenario.target.kind == "external":
        if (scenario.topology or {}).get("provider") != "containers":
            return []
        return external_images(scenario.target.name)
    from harness.topology_config import TopologyConfig

    config = TopologyConfig.from_mapping(scenario.topology, source=str(scenario.source))
    return reference_images(config) if config.provider == "containers" else []


@dataclass(frozen=True)
class Outcome:
    missing: tuple[str, ...]  # names missing when asked
    why_not: str = ""  # "" = nothing missing, or all built
    records: tuple[dict, ...] = ()  # build_all's records when it built
    seconds: float = 0.0


def ensure_images(names: Sequence[str], log: Callable[[str], None], *,
                  check: Callable[[Sequence[str]], list[str]] | None = None,
                  conditions: Callable[[Sequence[str]], Conditions] | None = None) -> Outcome:
    """Build the missing ones among these images when that can be done here, saying progress through log
    (each line: elapsed seconds, image, step); when it cannot, say nothing and return why (the caller
    decides whether that is an error).  A build that was started and failed raises ImageError.
    check: the image store's answer (default ``missing_names``); conditions: default ``Conditions.here``."""
    check = check or missing_names
    missing = check(names)
    if not missing:
        return Outcome(())
    decision = decide(missing, (conditions or Conditions.here)(missing))
    if decision.refused:
        return Outcome(tuple(missing), decision.why_not)
    began = time.monotonic()

    def say(text: str) -> None:
        log(f"images [{time.monotonic() - began:6.1f} s] {text}")

    say(f"not built yet: {', '.join(image_reference(name) for name in missing)}; building them now (the first "
        f"time takes minutes; later runs reuse them; {ENV}=0 turns this off)")
    records = build_all(list(decision.build), log=say)
    still = check(names)
    if still:
        raise ImageError(f"built {', '.join(r['name'] for r in records)}, but still missing: {', '.join(still)}")
    say("ready")
    return Outcome(tuple(missing), records=tuple(records), seconds=round(time.monotonic() - began, 1))


def missing_message(names: Sequence[str], hint: str) -> str:
    """For a run that is starting its containers (inside its namespace, the engine up): "" when every image is
    there, else the error naming the missing images and why they were not built on first use."""
    missing = missing_names(names)
    if not missing:
        return ""
    why_not = decide(missing, Conditions.here(missing, probe=False)).why_not or (
        "a run builds them before it enters its private network namespace, and this one is past that")
    return not_built_message(missing, why_not, hint)
