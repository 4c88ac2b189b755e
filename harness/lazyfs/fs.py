"""The lazyfs-style FUSE file system: a passthrough of a backing directory whose file data is held in a page
cache until the file is fsynced.

The durability model:
- File data (write, truncate, O_TRUNC) is held per file in memory (harness/lazyfs/cache.py) until fsync or
  fdatasync of that file, or ``sync-all``.  Reads see the held data.  Closing a file does not sync it.
- Metadata operations (create, mkdir, rename, unlink, rmdir, symlink, link, chmod, chown, utimes) reach the
  backing directory at once: they are durable immediately, as in Jepsen's lazyfs.  So a file created and
  never fsynced survives a power loss with the size its last fsync left (0 for a new file).
- ``drop-unsynced`` forgets every held page: the backing directory is then what a power loss would leave.
  There is no background writeback: a power loss loses *all* unsynced data, the worst case a kernel allows.
- ``ignore_fsync`` (a planted failure for the tests of this file system) makes fsync a no-op.

Inode numbers are the backing file system's; the inode -> path map follows pyfuse3's passthroughfs example.
Every handler is synchronous inside the trio loop: one request at a time, so no locking is needed.
"""

from __future__ import annotations

import errno
import os
import stat as stat_m
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from os import fsdecode, fsencode

import pyfuse3
from pyfuse3 import EntryAttributes, FileInfo, FUSEError

from harness.lazyfs.cache import FileCache


@dataclass
class Counters:
    writes: int = 0
    write_bytes: int = 0
    fsyncs: int = 0
    synced_bytes: int = 0
    drops: int = 0
    dropped_bytes: int = 0


def _oserror(exc: OSError) -> FUSEError:
    return FUSEError(exc.errno or errno.EIO)


class LazyOperations(pyfuse3.Operations):
    def __init__(self, backing: str, ignore_fsync: bool = False) -> None:
        super().__init__()
        self.backing = os.path.abspath(backing)
        self.ignore_fsync = ignore_fsync
        self._paths: dict[int, str | set[str]] = {pyfuse3.ROOT_INODE: self.backing}
        self._lookups: defaultdict[int, int] = defaultdict(int)
        self._handles: dict[int, tuple[int, int, int]] = {}  # fh -> (inode, backing fd, open flags)
        self._next_fh = 1
        self.caches: dict[int, FileCache] = {}  # inode -> held (unsynced) state
        self.counters = Counters()

    # ---- inode <-> path -------------------------------------------------------------------------------------
    def _path(self, inode: int) -> str:
        try:
            value = self._paths[inode]
        except KeyError:
            raise FUSEError(errno.ENOENT) from None
        return next(iter(value)) if isinstance(value, set) else value

    def _add_path(self, inode: int, path: str) -> None:
        self._lookups[inode] += 1
        value = self._paths.get(inode)
        if value is None:
            self._paths[inode] = path
        elif isinstance(value, set):
            value.add(path)
        elif value != path:
            self._paths[inode] = {path, value}

    def _forget_path(self, inode: int, path: str) -> None:
        value = self._paths.get(inode)
        if isinstance(value, set):
            value.discard(path)
            if len(value) == 1:
                self._paths[inode] = next(iter(value))
        elif value is not None:
            del self._paths[inode]

    async def forget(self, inode_list: Sequence[tuple[int, int]]) -> None:
        for inode, nlookup in inode_list:
            if self._lookups[inode] > nlookup:
                self._lookups[inode] -= nlookup
                continue
            self._lookups.pop(inode, None)
            self._paths.pop(inode, None)
            cache = self.caches.get(inode)
            # A held file nobody can reach any more (unlinked, last lookup gone): its data is lost anyway.
            if cache is not None and os.fstat(cache.fd).st_nlink == 0:
                self._discard(inode)

    # ---- attributes ---------------------------------------------------------------------------------------
    def _attr(self, path: str | None = None, fd: int | None = None) -> EntryAttributes:
        try:
            st = os.lstat(path) if fd is None else os.fstat(fd)
        except OSError as exc:
            raise _oserror(exc) from None
        entry = EntryAttributes()
        for name in ("st_ino", "st_mode", "st_nlink", "st_uid", "st_gid", "st_rdev", "st_size",
                     "st_atime_ns", "st_mtime_ns", "st_ctime_ns"):
            setattr(entry, name, getattr(st, name))
        cache = self.caches.get(st.st_ino)
        if cache is not None:
            entry.st_size = cache.size  # what readers see, not what the disk has
        entry.generation = 0
        # Short kernel caching; after a drop the affected inodes are invalidated explicitly.
        entry.entry_timeout = 1
        entry.attr_timeout = 1
        entry.st_blksize = 4096
        entry.st_blocks = (entry.st_size + 511) // 512
        return entry

    async def lookup(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> EntryAttributes:
        path = os.path.join(self._path(parent_inode), fsdecode(name))
        attr = self._attr(path=path)
        if name not in (b".", b".."):
            self._add_path(attr.st_ino, path)
        return attr

    async def getattr(self, inode: int, ctx: pyfuse3.RequestContext | None = None) -> EntryAttributes:
        cache = self.caches.get(inode)
        if cache is not None:
            return self._attr(fd=cache.fd)
        return self._attr(path=self._path(inode))

    async def setattr(self, inode: int, attr: EntryAttributes, fields: pyfuse3.SetattrFields,
                      fh: int | None, ctx: pyfuse3.RequestContext) -> EntryAttributes:
        try:
            if fields.update_size:
                self._cache_for(inode).truncate(attr.st_size)
            path = self._path(inode) if inode not in self.caches else None
            target: int | str = self.caches[inode].fd if path is None else path
            if fields.update_mode:
                os.chmod(target, stat_m.S_IMODE(attr.st_mode))
            if fields.update_uid or fields.update_gid:
                os.chown(target, attr.st_uid if fields.update_uid else -1,
                         attr.st_gid if fields.update_gid else -1, **({} if isinstance(target, int) else
                                                                       {"follow_symlinks": False}))
            if fields.update_atime or fields.update_mtime:
                old = os.stat(target) if isinstance(target, int) else os.lstat(target)
                atime = attr.st_atime_ns if fields.update_atime else old.st_atime_ns
                mtime = attr.st_mtime_ns if fields.update_mtime else old.st_mtime_ns
                os.utime(target, ns=(atime, mtime), **({} if isinstance(target, int) else
                                                        {"follow_symlinks": False}))
        except OSError as exc:
            raise _oserror(exc) from None
        return await self.getattr(inode, ctx)

    # ---- directories and other metadata: straight through (durable at once) ---------------------------------
    async def readlink(self, inode: int, ctx: pyfuse3.RequestContext) -> bytes:
        try:
            return fsencode(os.readlink(self._path(inode)))
        except OSError as exc:
            raise _oserror(exc) from None

    async def opendir(self, inode: int, ctx: pyfuse3.RequestContext) -> int:
        return inode

    async def readdir(self, fh: int, start_id: int, token: pyfuse3.ReaddirToken) -> None:
        path = self._path(fh)
        try:
            names = os.listdir(path)
        except OSError as exc:
            raise _oserror(exc) from None
        entries = []
        for name in names:
            try:
                attr = self._attr(path=os.path.join(path, name))
            except FUSEError:
                continue  # removed meanwhile
            entries.append((attr.st_ino, name, attr))
        for inode, name, attr in sorted(entries):
            if inode <= start_id:
                continue
            if not pyfuse3.readdir_reply(token, fsencode(name), attr, inode):
                break
            self._add_path(attr.st_ino, os.path.join(path, name))

    async def fsyncdir(self, fh: int, datasync: bool) -> None:
        self.counters.fsyncs += 1
        if self.ignore_fsync:
            return
        fd = os.open(self._path(fh), os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def _new_entry(self, parent_inode: int, name: bytes, make) -> EntryAttributes:
        """Create an entry in the backing directory (``make(path)``: metadata is durable at once) and look it up."""
        path = os.path.join(self._path(parent_inode), fsdecode(name))
        try:
            make(path)
        except OSError as exc:
            raise _oserror(exc) from None
        attr = self._attr(path=path)
        self._add_path(attr.st_ino, path)
        return attr

    async def mkdir(self, parent_inode: int, name: bytes, mode: int, ctx: pyfuse3.RequestContext) -> EntryAttributes:
        def make(path: str) -> None:
            os.mkdir(path, mode=mode & ~ctx.umask)
            os.chown(path, ctx.uid, ctx.gid)
        return self._new_entry(parent_inode, name, make)

    async def mknod(self, parent_inode: int, name: bytes, mode: int, rdev: int,
                    ctx: pyfuse3.RequestContext) -> EntryAttributes:
        def make(path: str) -> None:
            os.mknod(path, mode=mode & ~ctx.umask, device=rdev)
            os.chown(path, ctx.uid, ctx.gid)
        return self._new_entry(parent_inode, name, make)

    async def symlink(self, parent_inode: int, name: bytes, target: bytes,
                      ctx: pyfuse3.RequestContext) -> EntryAttributes:
        def make(path: str) -> None:
            os.symlink(fsdecode(target), path)
            os.lchown(path, ctx.uid, ctx.gid)
        return self._new_entry(parent_inode, name, make)

    async def link(self, inode: int, new_parent_inode: int, new_name: bytes,
                   ctx: pyfuse3.RequestContext) -> EntryAttributes:
        path = os.path.join(self._path(new_parent_inode), fsdecode(new_name))
        try:
            os.link(self._path(inode), path, follow_symlinks=False)
        except OSError as exc:
            raise _oserror(exc) from None
        self._add_path(inode, path)
        return await self.getattr(inode, ctx)

    async def unlink(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> None:
        path = os.path.join(self._path(parent_inode), fsdecode(name))
        try:
            inode = os.lstat(path).st_ino
            os.unlink(path)
        except OSError as exc:
            raise _oserror(exc) from None
        self._forget_path(inode, path)

    async def rmdir(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> None:
        path = os.path.join(self._path(parent_inode), fsdecode(name))
        try:
            inode = os.lstat(path).st_ino
            os.rmdir(path)
        except OSError as exc:
            raise _oserror(exc) from None
        self._forget_path(inode, path)

    async def rename(self, parent_inode_old: int, name_old: bytes, parent_inode_new: int, name_new: bytes,
                     flags: int, ctx: pyfuse3.RequestContext) -> None:
        if flags != 0:
            raise FUSEError(errno.EINVAL)
        old = os.path.join(self._path(parent_inode_old), fsdecode(name_old))
        new = os.path.join(self._path(parent_inode_new), fsdecode(name_new))
        try:
            replaced = os.lstat(new).st_ino if os.path.lexists(new) else None
            os.rename(old, new)
            inode = os.lstat(new).st_ino
        except OSError as exc:
            raise _oserror(exc) from None
        if replaced is not None and replaced != inode:
            self._forget_path(replaced, new)
        value = self._paths.get(inode)
        if isinstance(value, set):
            value.discard(old)
            value.add(new)
        elif value is not None:
            self._paths[inode] = new

    async def statfs(self, ctx: pyfuse3.RequestContext) -> pyfuse3.StatvfsData:
        data = pyfuse3.StatvfsData()
        try:
            st = os.statvfs(self.backing)
        except OSError as exc:
            raise _oserror(exc) from None
        for name in ("f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail", "f_files", "f_ffree", "f_favail"):
            setattr(data, name, getattr(st, name))
        data.f_namemax = st.f_namemax
        return data

    # ---- file data: held until fsync ----------------------------------------------------------------------
    def _open_backing(self, path: str) -> int:
        # The page cache reads clean pages and flushes held ones through this descriptor, whatever the
        # caller's access mode; truncation and appends are the cache's business, never the backing file's.
        return os.open(path, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)

    def _new_handle(self, inode: int, fd: int, flags: int) -> FileInfo:
        fh = self._next_fh
        self._next_fh += 1
        self._handles[fh] = (inode, fd, flags)
        return FileInfo(fh=fh)

    def _cache_for(self, inode: int) -> FileCache:
        cache = self.caches.get(inode)
        if cache is None:
            try:
                fd = self._open_backing(self._path(inode))
            except OSError as exc:
                raise _oserror(exc) from None
            cache = self.caches[inode] = FileCache.open_for(fd)
        return cache

    async def open(self, inode: int, flags: int, ctx: pyfuse3.RequestContext) -> FileInfo:
        try:
            fd = self._open_backing(self._path(inode))
        except OSError as exc:
            raise _oserror(exc) from None
        if flags & os.O_TRUNC:
            self._cache_for(inode).truncate(0)
        return self._new_handle(inode, fd, flags)

    async def create(self, parent_inode: int, name: bytes, mode: int, flags: int,
                     ctx: pyfuse3.RequestContext) -> tuple[FileInfo, EntryAttributes]:
        path = os.path.join(self._path(parent_inode), fsdecode(name))
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | (flags & os.O_EXCL), mode & ~ctx.umask)
            os.fchown(fd, ctx.uid, ctx.gid)
        except OSError as exc:
            raise _oserror(exc) from None
        attr = self._attr(fd=fd)
        self._add_path(attr.st_ino, path)
        if flags & os.O_TRUNC and attr.st_size:
            self._cache_for(attr.st_ino).truncate(0)
            attr.st_size = 0
        return self._new_handle(attr.st_ino, fd, flags), attr

    async def read(self, fh: int, off: int, size: int) -> bytes:
        inode, fd, _ = self._handles[fh]
        cache = self.caches.get(inode)
        try:
            return cache.read(off, size) if cache is not None else os.pread(fd, size, off)
        except OSError as exc:
            raise _oserror(exc) from None

    async def write(self, fh: int, off: int, buf: bytes) -> int:
        inode, _, flags = self._handles[fh]
        cache = self._cache_for(inode)
        if flags & os.O_APPEND:
            off = cache.size
        self.counters.writes += 1
        self.counters.write_bytes += len(buf)
        return cache.write(off, buf)

    async def flush(self, fh: int) -> None:
        return None  # close(2) does not make anything durable

    async def release(self, fh: int) -> None:
        _, fd, _ = self._handles.pop(fh)
        os.close(fd)  # the held pages stay: closing a file does not sync it

    async def fsync(self, fh: int, datasync: bool) -> None:
        inode, _, _ = self._handles[fh]
        self.counters.fsyncs += 1
        if not self.ignore_fsync:
            self.sync_inode(inode, datasync)

    # ---- control ------------------------------------------------------------------------------------------
    def sync_inode(self, inode: int, datasync: bool = False) -> int:
        cache = self.caches.pop(inode, None)
        if cache is None:
            return 0
        try:
            written = cache.flush()
            (os.fdatasync if datasync else os.fsync)(cache.fd)
        except OSError as exc:
            self.caches[inode] = cache  # still held: the sync failed, as on a real disk error
            raise _oserror(exc) from None
        os.close(cache.fd)
        self.counters.synced_bytes += cache.unsynced_bytes
        return written

    def _discard(self, inode: int) -> int:
        cache = self.caches.pop(inode)
        os.close(cache.fd)
        self.counters.dropped_bytes += cache.unsynced_bytes
        return cache.unsynced_bytes

    def sync_all(self) -> dict:
        inodes = list(self.caches)
        written = sum(self.sync_inode(inode) for inode in inodes)
        return {"files": len(inodes), "bytes_written": written}

    def drop_unsynced(self) -> dict:
        inodes = list(self.caches)
        lost = sum(self._discard(inode) for inode in inodes)
        self.counters.drops += 1
        for inode in inodes:  # the kernel's own caches of these files still show the dropped data
            try:
                pyfuse3.invalidate_inode(inode, attr_only=False)
            except OSError:
                pass  # the kernel no longer knows this inode: nothing cached
        return {"files": len(inodes), "bytes_dropped": lost}

    def stats(self) -> dict:
        return {
            "unsynced_files": len(self.caches),
            "unsynced_bytes": sum(cache.unsynced_bytes for cache in self.caches.values()),
            "held_bytes": sum(cache.held_bytes for cache in self.caches.values()),
            "open_handles": len(self._handles),
            "ignore_fsync": self.ignore_fsync,
            **vars(self.counters),
        }
