"""Shared by the three suites (library, lessons, course): tests/hindi.py, the glossary's checks, imports as `hindi`."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
