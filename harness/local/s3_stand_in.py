"""moto's S3 server for Tansu's storage, with one cost memoized (run as a script: ``python s3_stand_in.py -H
HOST -p PORT``, the same arguments as ``moto_server``).

Tansu 0.6.0 LISTs a partition's whole ``records/`` prefix on every fetch that has something to read, so a
LIST answers with every batch object the partition ever got.  moto 5 serializes each listed key's
LastModified by parsing its own ISO 8601 string again with dateutil (``botocore.utils.parse_to_aware_datetime``),
most of a LIST's CPU (docs/measurements.md).  The same strings come back in every LIST, so the parse is
memoized: a pure function of an immutable value, the same datetime comes out, nothing else of moto changes.

Imports nothing of Ordeal (it runs in the S3 node's own process)."""

from __future__ import annotations

import functools
import sys


def patch_moto() -> None:
    import moto.core.serialize as serialize

    original = serialize.parse_to_aware_datetime
    if not hasattr(original, "cache_info"):  # once
        serialize.parse_to_aware_datetime = functools.lru_cache(maxsize=1 << 16)(original)


def main(argv: list[str] | None = None) -> None:
    patch_moto()
    from moto.server import main as moto_main

    moto_main(argv if argv is not None else sys.argv[1:])


if __name__ == "__main__":
    main()
