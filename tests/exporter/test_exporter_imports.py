"""The library imports cleanly with no framework installed, and costs nothing on import."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from exporter_lib.ranks import is_reporting_process

ROOT = Path(__file__).resolve().parents[2]

BLOCK = """
import sys
for name in ("torch", "transformers", "lightning", "pytorch_lightning", "keras",
             "tensorflow", "kubeflow", "numpy"):
    sys.modules[name] = None  # makes any import of them fail, as if not installed
import exporter_lib, exporter_lib.callbacks, exporter_lib.__main__
exporter_lib.update(progress_percentage=1)
assert exporter_lib.current_status().progress_percentage == 1
for module in ("transformers", "lightning", "keras"):
    try:
        __import__("exporter_lib.callbacks." + module)
    except ImportError as exc:
        assert module in str(exc), exc
    else:
        raise AssertionError(module + " callback imported without its framework")
import threading
assert threading.active_count() == 1, "importing must not start threads"
print("ok")
"""


def test_imports_without_frameworks() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, "-c", BLOCK], env=env, capture_output=True,
                            timeout=60, check=False)
    assert result.returncode == 0, result.stderr.decode()
    assert result.stdout.strip() == b"ok"


def test_reporting_rank_rules() -> None:
    assert is_reporting_process({})
    assert is_reporting_process({"RANK": "0", "WORLD_SIZE": "4"})
    assert not is_reporting_process({"RANK": "1", "LOCAL_RANK": "0", "WORLD_SIZE": "4"})
    assert is_reporting_process({"RANK": "2"}, reporting_rank=2)
    assert not is_reporting_process({"LOCAL_RANK": "1"})
    assert is_reporting_process({"LOCAL_RANK": "0"})
    assert not is_reporting_process({"OMPI_COMM_WORLD_RANK": "3"})
    assert is_reporting_process({"PMI_RANK": "0"})
    assert is_reporting_process({"RANK": "garbage"})  # unparsable: treated as unset
