"""``python -m harness.toxiproxy --listen 127.0.0.1:0``: the proxy process (harness/toxiproxy/server.py)."""

import sys

from harness.toxiproxy.server import main

sys.exit(main())
