"""The harness' own toxiproxy: a TCP proxy serving the subset of toxiproxy's HTTP API Ordeal uses
(server.py), started and ended by PID (process.py), and the routing of a run's links through it (routing.py).
"""

from harness.toxiproxy.process import ToxiproxyProcess, running_toxiproxy
from harness.toxiproxy.routing import LinkRouter, proxied_endpoints, route_client_links

__all__ = ["ToxiproxyProcess", "running_toxiproxy", "route_client_links", "proxied_endpoints", "LinkRouter"]
