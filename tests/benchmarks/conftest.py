"""Make the repository's ``benchmarks`` package importable (it is not installed).

Tests here that start a control plane of their own carry ``@pytest.mark.cluster``
(``make check`` leaves them out; one that forgets fails there by name:
tests/conftest.py, docs/testing.md)."""

import sys
from pathlib import Path

ROOT = str(Path(__file__).resolve().parents[2])
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
