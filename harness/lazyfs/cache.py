"""The page cache of one file: the writes it got since its last fsync, held in memory.

Pure bookkeeping over a backing file descriptor: ``read`` merges the held pages over what the backing file
has, ``write`` and ``truncate`` change only the held state, ``flush`` puts the held state into the backing
file (then the caller fsyncs it) and ``dropped`` is what a power loss throws away.  The backing file is the
disk: after a drop it is exactly what the last fsync left.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

PAGE = 64 * 1024  # large pages: fewer Python objects per byte held; a small write loads one page


@dataclass
class FileCache:
    """Unsynced state of one backing file.  ``fd`` is the cache's own descriptor of the backing inode (kept
    open while anything is held, so a rename or unlink of the path does not lose the way to it)."""

    fd: int
    size: int  # the file's size as readers see it
    # Backing bytes at offsets >= valid_below are stale (a truncate cut them off since the last sync):
    # they read as zeros unless a held page covers them.
    valid_below: int
    pages: dict[int, bytearray] = field(default_factory=dict)
    unsynced_bytes: int = 0  # bytes written (or cut) since the last sync, what a power loss loses

    @classmethod
    def open_for(cls, fd: int) -> FileCache:
        size = os.fstat(fd).st_size
        return cls(fd=fd, size=size, valid_below=size)

    def _backing_page(self, index: int) -> bytearray:
        start = index * PAGE
        page = bytearray(PAGE)
        if start < self.valid_below:
            data = os.pread(self.fd, min(PAGE, self.valid_below - start), start)
            page[:len(data)] = data
        return page

    def read(self, offset: int, size: int) -> bytes:
        end = min(offset + size, self.size)
        if offset >= end:
            return b""
        out = bytearray()
        position = offset
        while position < end:
            index, within = divmod(position, PAGE)
            take = min(PAGE - within, end - position)
            page = self.pages.get(index)
            if page is not None:
                out += page[within:within + take]
            else:
                start = index * PAGE + within
                chunk = b""
                if start < self.valid_below:
                    chunk = os.pread(self.fd, min(take, self.valid_below - start), start)
                out += chunk + bytes(take - len(chunk))
            position += take
        return bytes(out)

    def write(self, offset: int, data: bytes) -> int:
        position, view = offset, memoryview(data)
        while view:
            index, within = divmod(position, PAGE)
            page = self.pages.get(index)
            if page is None:
                page = self.pages[index] = self._backing_page(index)
            take = min(PAGE - within, len(view))
            page[within:within + take] = view[:take]
            view, position = view[take:], position + take
        self.size = max(self.size, offset + len(data))
        self.unsynced_bytes += len(data)
        return len(data)

    def truncate(self, size: int) -> None:
        if size < self.size:
            self.unsynced_bytes += self.size - size
            self.valid_below = min(self.valid_below, size)
            last = size // PAGE
            for index in [index for index in self.pages if index > last or index * PAGE >= size]:
                del self.pages[index]
            page = self.pages.get(last)
            if page is not None:  # the cut-off tail of a held page must read as zeros when the file grows again
                page[size - last * PAGE:] = bytes(PAGE - (size - last * PAGE))
        else:
            self.unsynced_bytes += size - self.size
        self.size = size

    def flush(self) -> int:
        """Write the held state into the backing file (no fsync: the caller does that); returns bytes written."""
        written = 0
        if os.fstat(self.fd).st_size > self.valid_below:
            os.ftruncate(self.fd, self.valid_below)
        for index in sorted(self.pages):
            start = index * PAGE
            end = min(start + PAGE, self.size)
            if end > start:
                written += os.pwrite(self.fd, bytes(self.pages[index][:end - start]), start)
        if os.fstat(self.fd).st_size != self.size:
            os.ftruncate(self.fd, self.size)
        return written

    @property
    def held_bytes(self) -> int:
        return len(self.pages) * PAGE
