"""The run's container engine and its reaper, in one process: ``python -m harness.containers.sandbox``.

The containers provider (harness/containers/engine.py) starts this program as

    unshare --mount --propagation private --pid --fork --mount-proc -- python -m harness.containers.sandbox ...

so it is PID 1 of a PID namespace and owns a private mount namespace, while it shares the harness' network
namespace (the run's private one: container networking never touches the host's).  It

1. mounts a tmpfs over the run's Podman state directory (graphroot, runroot, network configs, volumes)
   and over /run/netns, and writes a containers.conf + storage.conf of the run's own, whose storage sees
   the images of ``ordeal images build`` as a read-only *additional image store*: no run can change the
   shared image store, and no run's container records can outlive it (docs/recipes.md: a namespace that dies
   with containers registered poisons Podman's state; here that state dies with the run);
2. starts ``podman system service`` on a unix socket (the Docker API for testcontainers / the docker SDK);
3. is the reaper (testcontainers' Ryuk image cannot be pulled here): it waits until its ``--watch-fd`` pipe
   reaches end of file — the harness holds the write end, so that happens when the harness stops the
   topology *or dies in any way, SIGKILL included* — then removes every container, volume and network
   labelled with the run, stops the service and exits.  Being PID 1, its exit makes the kernel kill every
   process left in the namespace (conmon, container processes) and drop the mounts (tmpfs state, container
   netns bind mounts), so even a SIGKILL of this reaper leaves nothing on the host.
Everything is done by label, PID or path; never by process name."""

from __future__ import annotations

import argparse
import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

RUN_LABEL = "org.ordeal.run"
SHARED_STORE = "/var/lib/containers/storage"


def write_configs(state: Path, shared_store: str) -> dict[str, str]:
    """containers.conf + storage.conf of the run; returns the environment that makes podman use them."""
    (state / "root").mkdir(parents=True, exist_ok=True)
    (state / "run").mkdir(parents=True, exist_ok=True)
    (state / "networks").mkdir(parents=True, exist_ok=True)
    (state / "tmp").mkdir(parents=True, exist_ok=True)
    storage = state / "storage.conf"
    storage.write_text("\n".join([
        "[storage]", 'driver = "overlay"', f'graphroot = "{state / "root"}"', f'runroot = "{state / "run"}"',
        "[storage.options]", f'additionalimagestores = ["{shared_store}"]', ""]))
    conf = state / "containers.conf"
    conf.write_text("\n".join([
        "[containers]",
        "default_ulimits = []",  # the default nofile/nproc exceed this sandbox's hard limits (docs/recipes.md)
        "[engine]",
        'runtime = "runc"',  # crun fails here: cgroups in hybrid mode
        'cgroup_manager = "cgroupfs"',
        'events_logger = "file"',
        f'events_logfile_path = "{state / "events.log"}"',
        f'tmp_dir = "{state / "tmp"}"',
        f'volume_path = "{state / "root" / "volumes"}"',
        "[network]",
        f'network_config_dir = "{state / "networks"}"',
        ""]))
    return {"CONTAINERS_CONF": str(conf), "CONTAINERS_STORAGE_CONF": str(storage),
            "XDG_RUNTIME_DIR": str(state / "run")}


def _mount_tmpfs(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=0700", "tmpfs", str(path)], check=True)


def podman(env: dict[str, str], *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(["podman", *args], env=env, capture_output=True, text=True, timeout=timeout)


def reap(env: dict[str, str], run_id: str, log) -> dict:
    """Remove everything labelled with the run (containers first: they hold volumes and networks)."""
    label = f"label={RUN_LABEL}={run_id}"
    done: dict = {}
    # twice: a node's container depends on its network holder ("container:" network mode) and podman
    # refuses to remove the holder first
    for what, args in (("containers", ("rm", "-f", "-t", "0", "--filter", label, "--all")),
                       ("containers", ("rm", "-f", "-t", "0", "--filter", label, "--all")),
                       ("volumes", ("volume", "prune", "-f", "--filter", label)),
                       ("networks", ("network", "prune", "-f", "--filter", label))):
        try:
            result = podman(env, *args)
            done[what] = done.get(what, []) + result.stdout.split()
            if result.returncode != 0:
                done[f"{what}_error"] = result.stderr.strip()[-400:]
            else:
                done.pop(f"{what}_error", None)
        except subprocess.TimeoutExpired:
            done[f"{what}_error"] = "timed out"
    left = podman(env, "ps", "-a", "-q")
    done["containers_left"] = left.stdout.split()
    print(f"ordeal-sandbox: reaped {json.dumps(done)}", file=log, flush=True)
    return done


CGROUP_ROOT = Path("/sys/fs/cgroup")


def cgroup_parent(run_id: str) -> str:
    """The cgroup every container of the run is created under (one per run: removable as a whole)."""
    return f"/ordeal-{run_id}"


def sweep_cgroups(name: str = "ordeal-*") -> list[str]:
    """rmdir the (empty) cgroup directories of runs, deepest first, in every hierarchy.  rmdir succeeds only
    on a cgroup without processes, so a live run's cgroups are never taken."""
    removed = []
    for top in sorted(CGROUP_ROOT.glob(f"*/{name}")) + sorted(CGROUP_ROOT.glob(name)):
        for directory in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
            try:
                directory.rmdir()
            except OSError:
                pass
        try:
            top.rmdir()
            removed.append(str(top))
        except OSError:
            pass
    return removed


def kill_the_rest() -> None:
    """As PID 1: SIGKILL every other process of the namespace (conmon, container processes) and reap them."""
    try:
        os.kill(-1, signal.SIGKILL)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
                time.sleep(0.02)
        except ChildProcessError:
            return


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--state", required=True, type=Path, help="the run's podman state directory (tmpfs)")
    parser.add_argument("--socket", required=True, help="unix socket path for the Docker API")
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--watch-fd", required=True, type=int, help="read end of the harness' lifeline pipe")
    parser.add_argument("--shared-store", default=SHARED_STORE)
    args = parser.parse_args(argv)
    log = sys.stderr
    if os.getpid() != 1:
        print("ordeal-sandbox: must be PID 1 of its own PID namespace (run it under unshare --pid --fork)",
              file=log)
        return 2
    os.setsid()  # out of the harness' process group: a group kill of unshare must not skip the reaping
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, lambda *_: None)  # only the lifeline ends this process (then it reaps)
    _mount_tmpfs(args.state)
    _mount_tmpfs(Path("/run/netns"))  # the containers' netns bind mounts live and die with this namespace
    env = {**os.environ, **write_configs(args.state, args.shared_store)}
    socket_path = Path(args.socket)
    socket_path.unlink(missing_ok=True)
    service = subprocess.Popen(["podman", "system", "service", "--time=0", f"unix://{socket_path}"],
                               env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
    print(f"ordeal-sandbox: podman service pid {service.pid} on {socket_path}", file=log, flush=True)
    # Wait for the lifeline's end of file (or data: any byte means "stop now" too).  Reap zombies meanwhile:
    # as PID 1 every orphan of the namespace becomes our child.
    while True:
        ready, _, _ = select.select([args.watch_fd], [], [], 1.0)
        try:
            while os.waitpid(-1, os.WNOHANG)[0] > 0:
                pass
        except ChildProcessError:
            pass
        if ready:
            break
    began = time.monotonic()
    reap(env, args.run_id, log)
    service.terminate()
    try:
        service.wait(10)
    except subprocess.TimeoutExpired:
        service.kill()
    socket_path.unlink(missing_ok=True)
    kill_the_rest()
    swept = sweep_cgroups(cgroup_parent(args.run_id).strip("/"))
    print(f"ordeal-sandbox: cgroups removed {swept}", file=log, flush=True)
    print(f"ordeal-sandbox: done in {time.monotonic() - began:.2f} s; exiting (the kernel ends the rest)",
          file=log, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
