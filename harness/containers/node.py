"""Container node handles: the local provider's Node interface (harness/node.py) on containers.

Each node is two containers on the run's network:
- ``<name>-net``, a network holder (``sleep infinity`` in the Debian base) with the node's fixed address, and
- ``<name>``, the server, created through testcontainers-python with ``network_mode=container:<holder>``.
The holder keeps the node's network namespace (and address) while the server is stopped or killed, so a
dead node *refuses* connections like a dead local process, instead of vanishing from the network; and a
network fault keyed on the node's address still means the same node after a restart.

start = create once, then start the same container again (same writable layer, same named volume at
/data: "restart with the same volume"); stop = SIGTERM, SIGKILL after the timeout (docker stop); kill =
SIGKILL; pause/resume = container pause (cgroup freezer) / unpause.  ``pid`` is the server's PID as the
harness sees it (mapped from the sandbox's PID namespace), so faults/ reads /proc as with local nodes."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from harness.containers.engine import ROLE_LABEL, RUN_LABEL, Engine
from harness.node import Node, NodeError, port_accepts

HOLDER_IMAGE = "debian-base"


def outer_pid(inner_pid: int, sandbox_pid: int | None) -> int | None:
    """The PID, in this process' PID namespace, of the process that has ``inner_pid`` in the sandbox's PID
    namespace (its PID 1 is ``sandbox_pid`` here).  /proc/P/status NSpid lists a process' PID in every
    namespace from ours down; candidates are confirmed by walking their parents up to the sandbox."""
    if sandbox_pid is None:
        return inner_pid  # a Docker engine on this host: its PIDs are ours
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/status") as status:
                fields = dict(line.split(":", 1) for line in status if ":" in line)
        except OSError:
            continue
        nspid = fields.get("NSpid", "").split()
        if len(nspid) >= 2 and int(nspid[1]) == inner_pid and _descends_from(int(entry.name), sandbox_pid):
            return int(entry.name)
    return None


def _descends_from(pid: int, ancestor: int) -> bool:
    for _ in range(16):
        if pid == ancestor:
            return True
        try:
            with open(f"/proc/{pid}/stat") as stat:
                pid = int(stat.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return False
        if pid <= 1:
            return False
    return False


class ContainerNode(Node):
    def __init__(self, engine: Engine, name: str, role: str, image: str, host: str, port: int,
                 command: Sequence[str], *, network: str, run_dir: Path, env: dict[str, str] | None = None,
                 binds: dict[str, str] | None = None, ready_check: Callable[[ContainerNode], bool] | None = None,
                 after_ready: Callable[[ContainerNode], None] | None = None, volume: bool = True,
                 cgroup_parent: str | None = None) -> None:
        self.engine = engine
        self.name, self.role, self.image, self.host, self.port = name, role, image, host, port
        self.argv = [str(part) for part in command]
        self.network, self.run_dir = network, Path(run_dir)
        self.env = dict(env or {})
        self.binds = dict(binds or {})
        self.log_path = self.run_dir / "logs" / f"{name}.log"
        self.data_dir = self.run_dir / "data" / name
        self.ready_check = ready_check or (lambda node: port_accepts(node.host, node.port))
        self.after_ready = after_ready
        self.volume = f"ordeal-{engine.run_id}-{name}" if volume else None
        self.cgroup_parent = cgroup_parent
        self.binds_mode = "ro"
        self.paused = False
        self.started_at: float | None = None
        self._holder: Any = None
        self._server: Any = None  # testcontainers DockerContainer
        self._pid: int | None = None
        self._log_offset = 0

    # -- creation ----------------------------------------------------------------------------------
    def _labels(self) -> dict[str, str]:
        return {RUN_LABEL: self.engine.run_id, ROLE_LABEL: self.role, "org.ordeal.node": self.name}

    def _extra(self) -> dict[str, Any]:
        return {"cgroup_parent": self.cgroup_parent} if self.cgroup_parent else {}

    def _create_holder(self) -> None:
        from harness.containers.images import image_reference

        client = self.engine.client
        self._holder = client.containers.create(
            image_reference(HOLDER_IMAGE), ["sleep", "infinity"], name=f"{self.name}-net", labels=self._labels(),
            hostname=self.name, network=self.network, detach=True, **self._extra(),
            networking_config={self.network: client.api.create_endpoint_config(ipv4_address=self.host)})
        self._holder.start()

    def _create_server(self) -> None:
        from testcontainers.core.container import DockerContainer

        client = self.engine.client
        if self.volume:
            client.volumes.create(self.volume, labels=self._labels())
        container = DockerContainer(self.image, docker_client_kw=self.engine.docker_client_kw,
                                    command=self.argv, name=self.name, env=self.env)
        if self.volume:
            container.with_volume_mapping(self.volume, "/data", "rw")  # a named volume: kept across restarts
        for host, inside in self.binds.items():
            container.with_volume_mapping(host, inside, self.binds_mode)
        # init: catatonit as PID 1 forwards SIGTERM to the server (Tansu ignores it as PID 1) and reaps
        container.with_kwargs(labels=self._labels(), network_mode=f"container:{self._holder.id}", init=True,
                              **self._extra())
        container.start()
        self._server = container

    @property
    def container(self) -> Any:
        """The docker SDK Container of the server (None before the first start)."""
        return self._server.get_wrapped_container() if self._server is not None else None

    # -- the Node interface ------------------------------------------------------------------------
    @property
    def pid(self) -> int | None:
        return self._pid if self.is_alive() else None

    def _state(self) -> dict:
        container = self.container
        if container is None:
            return {}
        try:
            container.reload()
        except Exception:  # noqa: BLE001 - removed or engine gone: not alive
            return {}
        return container.attrs.get("State") or {}

    def status(self) -> str:
        """The engine's word on the container (an API call): running, paused, exited, ..., or absent."""
        return str(self._state().get("Status") or "absent")

    def is_alive(self) -> bool:
        """Running or paused.  Asked very often (cluster views, heal_all), so once the server's PID is known
        the answer comes from /proc — an engine call costs 0.1-1 s on loaded cores — and the engine is asked
        only when that process is gone (it may have died on its own) or not yet known."""
        if self._pid is not None and not probes_pid_gone(self._pid):
            return True
        state = self._state()
        if str(state.get("Status")) not in ("running", "paused"):
            self._pid = None
            return False
        inner = int(state.get("Pid") or 0)
        if inner:
            sandbox = _sandbox_pid1(self.engine.process.pid) if self.engine.process is not None else None
            self._pid = outer_pid(inner, sandbox)
        return True

    def start(self) -> None:
        if self._holder is None:
            self._create_holder()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._pid = None
        if self._server is None:
            self._log_offset = 0
            self._create_server()
        else:
            if self.is_alive():
                raise NodeError(f"{self.name}: already running")
            self._log_offset = len(self._logs())
            self.container.start()
        self.paused = False
        self.started_at = time.monotonic()

    def _logs(self) -> bytes:
        container = self.container
        if container is None:
            return b""
        try:
            return container.logs(stdout=True, stderr=True)
        except Exception:  # noqa: BLE001 - gone
            return b""

    def log_since_start(self) -> str:
        return self._logs()[self._log_offset:].decode(errors="replace")

    def save_log(self) -> None:
        """Write the server's whole output (every start) to logs/<name>.log."""
        logs = self._logs()
        if logs:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self.log_path.write_bytes(logs)

    def wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if not self.is_alive():
                status = self.status()
                raise NodeError(f"{self.name} is not running (container {status}, exit code "
                                f"{self._state().get('ExitCode')}); output:\n{_tail(self._logs())}")
            if self.ready_check(self):
                break
            if time.monotonic() > deadline:
                raise NodeError(f"{self.name} ({self.address}) not ready after {timeout:.1f} s; output:\n"
                                f"{_tail(self._logs())}")
            time.sleep(0.05)
        if self.after_ready:
            self.after_ready(self)

    # stop and kill signal the server's process from here, as the local provider does: Podman's Docker-API
    # kill and stop wait for the container's exit and took ~20 s each under load (a fault scheduled at 4 s
    # landed after the workload had ended).  catatonit (init=True) forwards SIGTERM to the server; SIGKILL
    # of catatonit ends the container.
    def _send(self, sig: int) -> bool:
        pid = self._pid if self.is_alive() else None
        if pid is None:
            return False
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return False
        return True

    def stop(self, timeout: float = 10.0) -> None:
        """Graceful: SIGTERM, SIGKILL after ``timeout`` seconds (a paused container is resumed first)."""
        if self.container is None:
            return
        if self.paused or self.status() == "paused":
            self.resume()
        if self._send(signal.SIGTERM):
            deadline = time.monotonic() + timeout
            while self.is_alive() and time.monotonic() < deadline:
                time.sleep(0.05)
        if self.is_alive():
            self.kill()
        self._await_exit()
        self.paused = False

    def kill(self) -> None:
        """SIGKILL, and wait until the engine reports the container exited.  A frozen (paused) process takes
        the signal the moment it is thawed, before it runs again."""
        if self.container is None:
            return
        paused = self.paused
        if not self._send(signal.SIGKILL) and self.is_alive():
            self.container.kill()  # no PID known here: ask the engine
        if paused:
            try:
                self.container.unpause()
            except Exception:  # noqa: BLE001 - already gone
                pass
        self._await_exit()
        self.paused = False

    def _await_exit(self, timeout: float = 15.0) -> None:
        deadline = time.monotonic() + timeout
        while self.is_alive():
            if time.monotonic() > deadline:
                raise NodeError(f"{self.name}: container still {self.status()} {timeout} s after stop/kill")
            time.sleep(0.02)
        self._pid = None

    def pause(self) -> None:
        if not self.is_alive():
            raise NodeError(f"{self.name}: cannot pause, the container is not running")
        self.container.pause()
        self.paused = True

    def resume(self) -> None:
        if not self.is_alive():
            raise NodeError(f"{self.name}: cannot resume, the container is not running")
        if self.status() == "paused":
            self.container.unpause()
        self.paused = False

    def remove(self) -> None:
        """Save the output, then remove the server and its network holder (volumes go with the run)."""
        self.save_log()
        for container in (self.container, self._holder):
            if container is not None:
                try:
                    container.remove(force=True, v=True)
                except Exception:  # noqa: BLE001 - the sandbox reaps what is left
                    pass
        self._server = self._holder = None

    def describe(self) -> dict:
        return {**super().describe(), "image": self.image, "container": self.name,
                "volume": self.volume, "provider": "containers"}


def probes_pid_gone(pid: int) -> bool:
    """True when no live process has this PID (gone or a zombie): /proc/PID/stat's state."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (OSError, IndexError):
        return True


def _tail(data: bytes, lines: int = 15) -> str:
    return "\n".join(data.decode(errors="replace").splitlines()[-lines:]) or "(no output)"


def _sandbox_pid1(unshare_pid: int) -> int | None:
    """The sandbox's PID 1 (unshare's only child), as this process sees it."""
    try:
        with open(f"/proc/{unshare_pid}/task/{unshare_pid}/children") as children:
            found = children.read().split()
    except OSError:
        return None
    return int(found[0]) if found else None
