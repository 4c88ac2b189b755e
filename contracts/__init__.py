"""The shared contracts between Ordeal's stages: the bottom layer every stage may import.

``contracts`` imports no stage (docs/architecture.md, the import-linter contract in pyproject.toml): the
scenario model (``scenario.py``; stage knowledge such as fault kinds is registered into it), the history
schema (``history_schema.py``), the payload identity (``payload.py``).
"""
