"""A lazyfs-style FUSE file system: a node's data directory whose unsynced writes a power loss can drop.

``python -m harness.lazyfs BACKING MOUNTPOINT --control SOCK`` serves it (harness/lazyfs/__main__.py);
``LazyFsMount`` (harness/lazyfs/control.py) starts and ends that process and speaks its control channel
(``drop-unsynced``, ``sync-all``, ``stats``).  The durability model is in harness/lazyfs/fs.py.
"""

from harness.lazyfs.control import LazyFsError, LazyFsMount, command, is_mounted, mount_points

__all__ = ["LazyFsError", "LazyFsMount", "command", "is_mounted", "mount_points"]
