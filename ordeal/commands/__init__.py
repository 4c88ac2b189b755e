"""The ``ordeal`` sub-commands, one module per command (or per small family: ``check``/``report``,
``broker``/``defects``, ``run``/``plan``/``scenarios``), loaded lazily by ordeal/cli.py.  They parse options
and call the drivers; a usage error is raised as ``contracts.errors.UsageError`` and exits 3 in cli.py."""
