"""Shared test material that is not a test: cases and helpers imported by test modules of several tiers
(importable as ``support`` because pytest puts tests/, the folder of the root conftest.py, on sys.path)."""
