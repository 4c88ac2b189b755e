"""The shared contracts between Ordeal's stages: the bottom layer every stage may import.

``contracts`` imports no stage (docs/architecture.md, the import-linter contract in pyproject.toml): the
scenario model (``scenario.py``; stage knowledge such as fault kinds is registered into it), the history
schema (``history_schema.py``), the payload identity (``payload.py``), the invariants' ids
(``invariants.py``), the schema versions of the run directory's documents (``versions.py``), the one
validation vocabulary of configuration tables (``validation.py``), the usage-error base class
(``errors.py``), the exit codes (``exit_codes.py``), the Ordeal-side MQTT topic matcher (``topics.py``) and
the declared Target/Topology interface (``topology.py``).
"""
