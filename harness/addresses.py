"""Where each node listens.

- "distinct" (inside a private network namespace): every node on its own 127.0.0.x address with its
  usual port, so a network fault can target one node by address.  Addresses are handed out once per
  process (127.0.0.2 upwards, then 127.0.1.1 ...), so several topologies in one test session never clash.
- "loopback" (host network): every node on 127.0.0.1 with a free port (the host may run other
  services); a Redis node also needs its cluster bus port (port + 10000) free.  Ports come from
  12000-22000 (buses 22000-32000), under the ephemeral range that outgoing connections draw from."""

from __future__ import annotations

import random
import socket
import threading

BUS_OFFSET = 10000
PORT_RANGE = (12000, 22000)  # with the bus: up to 32000, below the ephemeral range (ip_local_port_range)


def bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
            return True
        except OSError:
            return False


class AddressAllocator:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._next_host = 2  # 127.0.0.1 stays the clients' default source address
        self._given_ports: set[int] = set()
        self._random = random.Random()

    def _next_address(self) -> str:
        index = self._next_host
        self._next_host += 1
        high, low = divmod(index - 1, 254)
        if high > 255:
            raise RuntimeError("ran out of 127.x.y.z addresses for nodes")
        return f"127.0.{high}.{low + 1}"

    def distinct(self, port: int, with_bus: bool = False) -> tuple[str, int]:
        with self._lock:
            while True:  # skip addresses some earlier process in this namespace still holds
                host = self._next_address()
                if bindable(host, port) and (not with_bus or bindable(host, port + BUS_OFFSET)):
                    return host, port

    def loopback(self, with_bus: bool = False) -> tuple[str, int]:
        with self._lock:
            # random probing below the kernel's ephemeral range (32768+), bus ports (+10000) included, so
            # an outgoing connection can never take a port between this probe and the server's bind
            for _ in range(2000):
                port = self._random.randrange(PORT_RANGE[0], PORT_RANGE[1] + 1)
                if port in self._given_ports or (with_bus and port + BUS_OFFSET in self._given_ports):
                    continue
                if bindable("127.0.0.1", port) and (not with_bus or bindable("127.0.0.1", port + BUS_OFFSET)):
                    self._given_ports.add(port)
                    if with_bus:
                        self._given_ports.add(port + BUS_OFFSET)
                    return "127.0.0.1", port
        raise RuntimeError(f"no free port (and bus port) found on 127.0.0.1 in {PORT_RANGE[0]}-{PORT_RANGE[1]}")


ALLOCATOR = AddressAllocator()


class AddressPlan:
    """mode "distinct" or "loopback"; see the module docstring."""

    def __init__(self, mode: str) -> None:
        if mode not in ("distinct", "loopback"):
            raise ValueError(f"address mode must be 'distinct' or 'loopback', not {mode!r}")
        self.mode = mode

    def allocate(self, usual_port: int, with_bus: bool = False) -> tuple[str, int]:
        if self.mode == "distinct":
            return ALLOCATOR.distinct(usual_port, with_bus)
        return ALLOCATOR.loopback(with_bus)
