"""``python -m harness.lazyfs BACKING MOUNTPOINT --control SOCK [--ignore-fsync]``: serve the lazyfs-style
file system until SIGTERM/SIGINT (or the parent's death), then unmount.

Control channel: a unix socket; a client sends one command line and gets one JSON line back:
``drop-unsynced``, ``sync-all``, ``stats`` (harness/lazyfs/control.py is the client).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import signal
import socket
import sys

import pyfuse3
import trio

from harness.lazyfs.fs import LazyOperations

PR_SET_PDEATHSIG = 1
COMMANDS = ("drop-unsynced", "sync-all", "stats")


def _die_gently_with_parent() -> None:
    # The harness spawns children with PDEATHSIG=SIGKILL; a FUSE server killed that way leaves its mount
    # behind ("transport endpoint is not connected").  SIGTERM instead lets it unmount on the way out.
    libc = ctypes.CDLL(None, use_errno=True)
    parent = os.getppid()
    libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    if os.getppid() != parent:  # the parent died before prctl took effect
        os.kill(os.getpid(), signal.SIGTERM)


async def _control(ops: LazyOperations, sock_path: str) -> None:
    if os.path.exists(sock_path):
        os.unlink(sock_path)
    raw = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    await raw.bind(sock_path)
    raw.listen(8)
    listener = trio.SocketListener(raw)

    async def serve(stream: trio.SocketStream) -> None:
        async with stream:
            data = b""
            while not data.endswith(b"\n") and len(data) < 256:
                chunk = await stream.receive_some(256)
                if not chunk:
                    break
                data += chunk
            command = data.decode(errors="replace").strip()
            if command == "drop-unsynced":
                reply = {"ok": True, "before": ops.stats(), **ops.drop_unsynced()}
            elif command == "sync-all":
                reply = {"ok": True, **ops.sync_all()}
            elif command == "stats":
                reply = {"ok": True, **ops.stats()}
            else:
                reply = {"ok": False, "error": f"unknown command {command!r}; allowed: {', '.join(COMMANDS)}"}
            if command != "stats":
                reply["stats"] = ops.stats()
            await stream.send_all(json.dumps(reply).encode() + b"\n")

    await trio.serve_listeners(serve, [listener])


async def _serve(ops: LazyOperations, sock_path: str) -> None:
    async with trio.open_nursery() as nursery:
        async def until_signal() -> None:
            with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
                async for _ in signals:
                    break
            nursery.cancel_scope.cancel()

        async def fuse_main() -> None:
            await pyfuse3.main()
            nursery.cancel_scope.cancel()  # unmounted from outside: nothing left to serve

        nursery.start_soon(until_signal)
        nursery.start_soon(_control, ops, sock_path)
        nursery.start_soon(fuse_main)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.lazyfs", description=__doc__.split("\n\n")[0])
    parser.add_argument("backing", help="the directory that plays the disk")
    parser.add_argument("mountpoint", help="where the file system appears")
    parser.add_argument("--control", required=True, help="unix socket path of the control channel")
    parser.add_argument("--ignore-fsync", action="store_true",
                        help="make fsync a no-op (a planted failure: nothing ever becomes durable)")
    args = parser.parse_args(argv)
    for name, path in (("BACKING", args.backing), ("MOUNTPOINT", args.mountpoint)):
        if not os.path.isdir(path):
            parser.error(f"{name} {path!r} is not a directory")
    if os.path.realpath(args.backing) == os.path.realpath(args.mountpoint):
        parser.error("BACKING and MOUNTPOINT must differ")
    _die_gently_with_parent()
    ops = LazyOperations(args.backing, ignore_fsync=args.ignore_fsync)
    options = set(pyfuse3.default_options)
    options.add("fsname=ordeal-lazyfs")
    if os.geteuid() == 0:  # brokers that drop root (mosquitto, rabbitmq) must reach their data directory too
        options.add("allow_other")
    # auto_unmount: libfuse's fusermount3 helper unmounts even when this process is SIGKILLed.
    options.add("auto_unmount")
    pyfuse3.init(ops, args.mountpoint, options)
    print(f"lazyfs: serving {args.backing} at {args.mountpoint}, control {args.control}", flush=True)
    try:
        trio.run(_serve, ops, args.control)
    finally:
        pyfuse3.close(unmount=True)
        if os.path.exists(args.control):
            os.unlink(args.control)
        print("lazyfs: unmounted", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
