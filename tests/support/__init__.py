"""Helpers the tests share (imported as ``support.*``; conftest.py puts tests/ on the path)."""

from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent
ROOT = TESTS.parent
DOUBLES = TESTS / "doubles"
DATA = TESTS / "data"
