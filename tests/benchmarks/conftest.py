"""Make the repository's ``benchmarks`` package importable (it is not installed), and
mark the tests of this folder that start a control plane of their own ``cluster``."""

import sys
from pathlib import Path

import pytest

ROOT = str(Path(__file__).resolve().parents[2])
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

#: Tests that start a control plane in their body (``make check`` leaves them out; if one
#: is renamed, ``make check`` fails it by name: tests/conftest.py, docs/testing.md).
_OWN_CONTROL_PLANE = ("test_vs_push.py::test_audit_log_counts_status_writes_by_field_manager",
                      "test_vs_push.py::test_quick_run_writes_both_designs")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if any(name in item.nodeid for name in _OWN_CONTROL_PLANE):
            item.add_marker("cluster")
