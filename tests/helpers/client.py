"""Helpers of the kubectl plugin and SDK helper tests."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client

from exporter_lib.status import format_time, now
from localdev.cluster import objects

REPO = Path(__file__).resolve().parents[2]
#: The field manager the tests write status with (server-side apply, like the scraper).
FIELD_MANAGER = "trainjob-progress-test"
#: Seconds one plugin run may take (the commands finish in about a second).
PLUGIN_TIMEOUT_SECONDS = 60

Kubectl = Callable[..., subprocess.CompletedProcess[str]]


@dataclass(frozen=True)
class PluginDir:
    """Where the wheel was installed: ``bin`` holds ``kubectl-trainjob``."""

    root: Path

    @property
    def bin(self) -> Path:
        return self.root / "bin"

    def env(self, **extra: str) -> dict[str, str]:
        env = dict(os.environ)
        env["PATH"] = f"{self.bin}{os.pathsep}{env.get('PATH', '')}"
        # The installed wheel first: the code under test is this checkout's, not an
        # editable install's.
        env["PYTHONPATH"] = str(self.root)
        env.pop("KUBECONFIG", None)
        env.update(extra)
        return env


def apply_status(kube_api: client.ApiClient, namespace: str, name: str,
                 **status: Any) -> dict[str, Any]:
    """Server-side apply ``status`` (camelCase keys) to the TrainJob's /status."""
    return objects.apply_trainjob_status(kube_api, namespace, name, status,
                                         field_manager=FIELD_MANAGER)


def condition(kind: str, reason: str = "Test") -> dict[str, str]:
    """A True TrainJob condition of ``kind`` (Complete, Failed, ...)."""
    return {"type": kind, "status": "True", "reason": reason, "message": f"{kind} (test)",
            "lastTransitionTime": format_time(now())}
