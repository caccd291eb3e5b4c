"""TrainJobs on the local cluster's shipped runtimes, as a user creates them.

Only the API a user has: a TrainJob (``spec.trainer.command``, ``env``,
``numNodes``, ``runtimePatches``; ``podSpecOverrides`` on Trainer v2.0.0) on a
ClusterTrainingRuntime.  The Trainer,
JobSet and Job controllers make the JobSet, Jobs and pods; the scheduler binds
them, kwok and the pod runner (:mod:`localdev.cluster.podrunner`) run them.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from kubernetes import client

from exporter_lib.status import API_GROUP, API_VERSION, TRAINJOB_PLURAL
from localdev.cluster.stack import runner_pod_overrides, runner_runtime_patches

#: The replicated job that runs the trainer command in the shipped runtimes (torch,
#: torchtune: ``node``; deepspeed, mlx, mpi: ``launcher``, while their ``node`` pods run
#: sshd, which cannot run here, so kwok simulates them).
TRAINER_JOBS = {"torch-distributed": ("node",), "deepspeed-distributed": ("launcher",),
                "mlx-distributed": ("launcher",), "mpi-distributed": ("launcher",)}
LABEL_JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"


def trainjob_body(namespace: str, name: str, *, runtime: str = "torch-distributed",
                  command: Sequence[str] | None = None,
                  env: Mapping[str, str | dict[str, Any]] | None = None,
                  num_nodes: int | None = None, run_jobs: Sequence[str] | None = None,
                  suspend: bool | None = None, legacy: bool = False) -> dict[str, Any]:
    """A TrainJob on ClusterTrainingRuntime ``runtime``.

    ``run_jobs`` are the replicated jobs whose pods the pod runner runs (default:
    :data:`TRAINER_JOBS` of the runtime, else ``node``); the others are simulated
    by kwok.  ``command`` replaces the trainer container's command.  ``legacy``:
    for Trainer v2.0.0 (``podSpecOverrides`` instead of v2.3.0's ``runtimePatches``).
    """
    trainer: dict[str, Any] = {}
    if command is not None:
        trainer["command"] = list(command)
    if env:
        # A dict value is an EnvVarSource (``valueFrom``), e.g. a fieldRef to a label.
        trainer["env"] = [{"name": k, "value": v} if isinstance(v, str)
                          else {"name": k, "valueFrom": v} for k, v in env.items()]
    if num_nodes is not None:
        trainer["numNodes"] = num_nodes
    jobs = run_jobs if run_jobs is not None else TRAINER_JOBS.get(runtime, ("node",))
    spec: dict[str, Any] = {
        "runtimeRef": {"name": runtime, "apiGroup": API_GROUP, "kind": "ClusterTrainingRuntime"},
    }
    if legacy:
        spec["podSpecOverrides"] = runner_pod_overrides(*jobs)
    else:
        spec["runtimePatches"] = runner_runtime_patches(*jobs)
    if trainer:
        spec["trainer"] = trainer
    if suspend is not None:
        spec["suspend"] = suspend
    return {"apiVersion": f"{API_GROUP}/{API_VERSION}", "kind": "TrainJob",
            "metadata": {"name": name, "namespace": namespace}, "spec": spec}


def create(api: client.ApiClient, body: Mapping[str, Any]) -> dict[str, Any]:
    """Create the TrainJob ``body``; return it as stored.

    Raises:
        kubernetes.client.ApiException: e.g. 409 when it exists, 403 from the
            Trainer's admission webhook for an unknown runtime.
    """
    result: dict[str, Any] = client.CustomObjectsApi(api).create_namespaced_custom_object(
        API_GROUP, API_VERSION, body["metadata"]["namespace"], TRAINJOB_PLURAL, dict(body))
    return result


def get(api: client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    """TrainJob ``namespace/name``.

    Raises:
        kubernetes.client.ApiException: 404 when missing.
    """
    result: dict[str, Any] = client.CustomObjectsApi(api).get_namespaced_custom_object(
        API_GROUP, API_VERSION, namespace, TRAINJOB_PLURAL, name)
    return result


def condition(trainjob: Mapping[str, Any], kind: str) -> bool:
    """True when the TrainJob's condition ``kind`` (Complete, Failed, Suspended) is True."""
    return any(c.get("type") == kind and c.get("status") == "True"
               for c in (trainjob.get("status") or {}).get("conditions") or [])


def wait_finished(api: client.ApiClient, namespace: str, name: str,
                  timeout: float) -> dict[str, Any]:
    """Wait until the TrainJob is Complete or Failed; return it.

    Raises:
        TimeoutError: neither within ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while True:
        obj = get(api, namespace, name)
        if condition(obj, "Complete") or condition(obj, "Failed"):
            return obj
        if time.monotonic() > deadline:
            raise TimeoutError(f"TrainJob {namespace}/{name} not finished after {timeout:.0f}s: "
                               f"{(obj.get('status') or {}).get('conditions')}")
        time.sleep(0.3)


def pods(api: client.ApiClient, namespace: str, name: str) -> list[client.V1Pod]:
    """The pods of TrainJob ``name`` (by the JobSet label), oldest first."""
    items = client.CoreV1Api(api).list_namespaced_pod(
        namespace, label_selector=f"{LABEL_JOBSET_NAME}={name}").items
    return sorted(items, key=lambda p: (p.metadata.creation_timestamp, p.metadata.name))


def wait_pods(api: client.ApiClient, namespace: str, name: str, *, count: int,
              phase: str = "Running", timeout: float = 60.0) -> list[client.V1Pod]:
    """Wait until ``count`` pods of the TrainJob are in ``phase`` with an IP; return them.

    Raises:
        TimeoutError: not within ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while True:
        found = [p for p in pods(api, namespace, name)
                 if p.status.phase == phase and p.status.pod_ip
                 and not p.metadata.deletion_timestamp]
        if len(found) >= count:
            return found
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(found)}/{count} pods of TrainJob {namespace}/{name} "
                               f"{phase} after {timeout:.0f}s")
        time.sleep(0.2)
