"""Ordeal's top layer: the ``ordeal`` command (``cli``, one module per command under ``commands/``), the one
pipeline joining the stages (``pipeline``: plan -> run -> check -> report), and the drivers that run many
plans: ``replay``, ``shrink``, ``explore`` and the ``selftest`` package."""
