"""The run's container engine, seen from the harness: a Podman API service in a sandbox of the run's own
(harness/containers/sandbox.py), reached through ``DOCKER_HOST`` by testcontainers-python and the docker SDK.

    engine = Engine.start(run_dir, run_id)      # podman system service inside the run's network namespace
    engine.client                               # docker.DockerClient on its socket
    engine.stop()                               # reaps every container/volume/network of the run, waits

Where a Docker engine is the container engine (a CI runner with Docker), set ``ORDEAL_DOCKER_HOST`` to its
socket: no sandbox is started, and the run's containers are removed by label at the end (there, Ryuk-less
cleanup after a SIGKILL is the CI job's own teardown: ``docker rm -f $(docker ps -aq --filter label=...)``).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from harness import reaper
from harness.node import NodeError, log_tail, spawn

RUN_LABEL = "org.ordeal.run"  # the same key as harness/containers/sandbox.py (which must not import harness)
ROLE_LABEL = "org.ordeal.role"
SOCKET_MAX = 100  # sun_path holds 108 bytes


class EngineUnavailable(NodeError):
    """No container engine can be used here; the message says what to install or set."""


def require_podman() -> str:
    """The podman binary, or EngineUnavailable naming what to do."""
    found = shutil.which("podman")
    if found is None:
        raise EngineUnavailable("the containers provider needs Podman (or a Docker engine through "
                                "ORDEAL_DOCKER_HOST): `podman` is not on PATH.  Run scripts/bootstrap.sh as root "
                                "(apt-get install podman runc), or choose provider = \"local\"")
    if os.geteuid() != 0:
        raise EngineUnavailable(f"the containers provider runs rootful Podman and needs root (uid {os.geteuid()})")
    if shutil.which("unshare") is None:
        raise EngineUnavailable("`unshare` (util-linux) is not installed; apt-get install util-linux")
    return found


def _socket_path(run_dir: Path, run_id: str) -> Path:
    path = run_dir / "podman" / "api.sock"
    if len(str(path)) <= SOCKET_MAX:
        return path
    short = hashlib.blake2b(run_id.encode(), digest_size=6).hexdigest()
    return Path(tempfile.gettempdir()) / f"ordeal-{short}.sock"


@dataclass
class Engine:
    run_id: str
    socket: Path
    log_path: Path
    state_dir: Path | None = None
    process: object | None = None  # the sandbox (unshare) Popen
    lifeline: int | None = None  # write end of the sandbox's lifeline pipe
    timings: dict = field(default_factory=dict)
    _client: object | None = None

    @classmethod
    def start(cls, run_dir: Path, run_id: str, timeout_s: float = 30.0) -> Engine:
        external = os.environ.get("ORDEAL_DOCKER_HOST")
        if external:
            engine = cls(run_id, Path(external.removeprefix("unix://")), run_dir / "logs" / "engine.log")
            engine._set_docker_host(external)
            return engine
        require_podman()
        if os.environ.get("ORDEAL_NETNS") != "private":
            raise EngineUnavailable(
                "the containers provider runs its container network only inside the run's private network "
                "namespace (ORDEAL_NETNS=private, harness/netns.py); start the run isolated (`ordeal run` "
                "does so by default as root)")
        began = time.monotonic()
        # Empty cgroups of runs whose whole PID namespace was SIGKILLed at once (no reaper could run): rmdir
        # takes only cgroups without processes, so a live run loses nothing (runc recreates on restart).
        from harness.containers.sandbox import sweep_cgroups

        sweep_cgroups()
        (run_dir / "podman").mkdir(parents=True, exist_ok=True)
        (run_dir / "logs").mkdir(parents=True, exist_ok=True)
        state = run_dir / "podman" / "state"
        socket = _socket_path(run_dir, run_id)
        log_path = run_dir / "logs" / "engine.log"
        read_end, write_end = os.pipe()  # both non-inheritable: only the sandbox gets the read end
        argv = ["unshare", "--mount", "--propagation", "private", "--pid", "--fork", "--mount-proc", "--",
                sys.executable, "-m", "harness.containers.sandbox", "--state", str(state),
                "--socket", str(socket), "--run-id", run_id, "--watch-fd", str(read_end)]
        repo = Path(__file__).resolve().parents[2]
        with open(log_path, "ab") as log:
            process = spawn(argv, pass_fds=(read_end,), stdin=subprocess.DEVNULL, stdout=log,
                            stderr=subprocess.STDOUT, cwd=repo,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join(
                                filter(None, [str(repo), os.environ.get("PYTHONPATH")]))})
        os.close(read_end)
        engine = cls(run_id, socket, log_path, state, process, write_end)
        engine._set_docker_host(f"unix://{socket}")
        deadline = time.monotonic() + timeout_s
        while True:
            if process.poll() is not None:
                engine.stop()
                raise EngineUnavailable(f"the podman sandbox exited ({process.returncode}) before serving; "
                                        f"log {log_path}:\n{log_tail(log_path)}")
            if socket.exists():
                try:
                    engine.client.ping()
                    break
                except Exception:  # noqa: BLE001 - not serving yet
                    pass
            if time.monotonic() > deadline:
                engine.stop()
                raise EngineUnavailable(f"podman system service did not answer on {socket} within {timeout_s} s; "
                                        f"log {log_path}:\n{log_tail(log_path)}")
            time.sleep(0.05)
        engine.timings["engine_ready_s"] = round(time.monotonic() - began, 3)
        return engine

    def _set_docker_host(self, url: str) -> None:
        # testcontainers-python and docker.from_env() read these; Ryuk's image cannot be pulled here and the
        # sandbox is the reaper instead.
        os.environ["DOCKER_HOST"] = url
        os.environ["TESTCONTAINERS_RYUK_DISABLED"] = "true"
        from testcontainers.core.config import testcontainers_config

        testcontainers_config.ryuk_disabled = True
        self.url = url

    @property
    def client(self):
        """A docker SDK client on the engine's socket, one per thread (nodes start in parallel)."""
        import threading

        if self._client is None:
            self._client = threading.local()
        client = getattr(self._client, "value", None)
        if client is None:
            import docker

            client = self._client.value = docker.DockerClient(base_url=self.url, timeout=60)
        return client

    @property
    def docker_client_kw(self) -> dict:
        return {}  # testcontainers reads DOCKER_HOST (set by _set_docker_host)

    def remove_run_objects(self) -> list[str]:
        """Remove every container, volume and network labelled with this run (through the API)."""
        removed = []
        label = f"{RUN_LABEL}={self.run_id}"
        client = self.client
        for container in client.containers.list(all=True, filters={"label": label}):
            try:
                container.remove(force=True, v=True)
                removed.append(f"container {container.name}")
            except Exception:  # noqa: BLE001 - the sandbox reaps what is left
                pass
        for volume in client.volumes.list(filters={"label": label}):
            try:
                volume.remove(force=True)
                removed.append(f"volume {volume.name}")
            except Exception:  # noqa: BLE001
                pass
        for network in client.networks.list(filters={"label": label}):
            try:
                network.remove()
                removed.append(f"network {network.name}")
            except Exception:  # noqa: BLE001
                pass
        return removed

    def stop(self, timeout_s: float = 60.0) -> None:
        """End the engine: the sandbox reaps the run's objects and exits (closing the lifeline tells it)."""
        if self._client is not None:
            try:
                client = getattr(self._client, "value", None)
                if client is not None:
                    client.close()
            except Exception:  # noqa: BLE001
                pass
            self._client = None
        if self.lifeline is not None:
            os.close(self.lifeline)
            self.lifeline = None
        process = self.process
        if process is not None:
            try:
                process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                reaper.kill_group(process.pid)  # the kernel then ends its namespace
                process.wait()
            reaper.untrack(process.pid)
            self.process = None
