"""``--isolated/--no-isolated``, the option of every command that starts runs (run, replay, shrink, explore,
selftest), and ``enter_isolation``: the command re-run inside private network + PID namespaces."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import click

from contracts.errors import UsageError
from harness import netns

ISOLATION_HELP = ("Run inside private network + PID namespaces (default when root): network faults are real "
                  "packet drops and a SIGKILL of ordeal leaves no process behind.  --no-isolated: on the host's "
                  "127.0.0.1; network faults are then refused (fault_error, verdict unknown).")


def isolation_option(command):
    """``--isolated/--no-isolated`` for every command that starts runs (run, replay, shrink, explore, selftest)."""
    return click.option("--isolated/--no-isolated", "isolated", default=True, show_default=True,
                        help=ISOLATION_HELP)(command)


def enter_isolation(isolated: bool) -> str:
    """Put this ``ordeal`` command's work in its own network + PID namespaces, like ``ordeal up --isolated``:
    the same command line runs again under ``unshare --net --pid --fork --kill-child --mount-proc``
    (harness/netns.py), in the same working directory (relative --out paths hold), and this process exits
    with its exit code (does not return).  Unlike an exec, this process stays as a thin parent because
    unshare blocks SIGTERM/SIGINT: the parent forwards them to the run, and it holds unshare with
    PR_SET_PDEATHSIG, so a SIGKILL of ``ordeal`` kills unshare, whose --kill-child kills the namespace's
    PID 1, and the kernel then every process in the namespace.
    Returns where the runs live, for the user: "private" inside the namespace, else why not (not root:
    said once on stderr).  Call it after the input was validated and before any thread starts."""
    if netns.finish_reexec() or netns.in_private_netns():
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # the namespace has only lo: Spark must bind it
        return "private"
    if not isolated:
        return "host (--no-isolated): network faults are refused"
    if not netns.is_root():
        click.echo(f"not isolated: {netns.refusal_message()}", err=True)
        return f"host (not root, uid {os.geteuid()}): network faults are refused"
    context = click.get_current_context()
    if context.info_name not in sys.argv[1:]:  # e.g. click's test runner: sys.argv is not this command
        raise UsageError(
            f"cannot re-run `ordeal {context.info_name}` isolated: sys.argv {sys.argv!r} is not its command "
            "line; pass --no-isolated, or run it as `ordeal ...` / `python -m ordeal.cli ...`")
    try:
        argv = netns.isolated_argv([sys.executable, "-m", "ordeal.cli", *sys.argv[1:]])
    except netns.IsolationUnavailable as error:
        raise UsageError(str(error)) from error
    sys.exit(_run_isolated(argv))


def _die_with_parent() -> None:
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() == 1:  # the parent already died before the prctl
        os._exit(1)


def _run_isolated(argv: list[str]) -> int:
    environment = {**os.environ, netns.MARKER: "reexec"}  # the child brings lo up (netns.finish_reexec)
    child = subprocess.Popen(argv, env=environment, preexec_fn=_die_with_parent)  # noqa: PLW1509

    def forward(signum: int, frame: object) -> None:
        # unshare itself blocks SIGTERM/SIGINT: hand them to its child, the run (PID 1 of the namespace).
        for task in Path(f"/proc/{child.pid}/task").glob("*/children"):
            for pid in task.read_text().split():
                os.kill(int(pid), signum)

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, forward)
    while True:
        try:
            code = child.wait()
            break
        except InterruptedError:
            continue
    return code if code >= 0 else 128 - code
