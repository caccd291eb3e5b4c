"""Builders for the objects a Kubeflow Trainer v2 TrainJob leaves in a cluster.

The local control plane runs no controllers and no kubelet, so these helpers
play their parts: they create the TrainJob, the JobSet and batch Job that
Trainer and JobSet would create, and the rank-0 trainer Pod with the labels
those controllers put on it; and they write pod status (IP, phase, container
states, termination message) through the status subresource as a kubelet would.
"""

from __future__ import annotations

import functools
import secrets
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from kubernetes import client

from exporter_lib.status import API_GROUP, API_VERSION, TRAINJOB_PLURAL

JOBSET_GROUP = "jobset.x-k8s.io"
JOBSET_VERSION = "v1alpha2"
JOBSET_PLURAL = "jobsets"
#: The container Kubeflow Trainer v2 runs the training code in.
TRAINER_CONTAINER = "node"
#: Annotation the scraper reads for the exporter's port.
PORT_ANNOTATION = "trainjob-progress.dev/port"
#: Node name put on trainer pods; no such Node object exists (nothing checks).
NODE_NAME = "devcluster-node"
TRAINER_IMAGE = "ghcr.io/kubeflow/trainer/torch-distributed:latest"
#: Attempts for a read-modify-write of pod status that hits a conflict.
STATUS_RETRIES = 5

LABEL_JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"
LABEL_REPLICATED_JOB = "jobset.sigs.k8s.io/replicatedjob-name"
LABEL_JOB_INDEX = "jobset.sigs.k8s.io/job-index"
LABEL_COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _owner(obj: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": obj["apiVersion"], "kind": obj["kind"],
        "name": obj["metadata"]["name"], "uid": obj["metadata"]["uid"],
        "controller": True, "blockOwnerDeletion": True,
    }


def create_trainjob(api_client: client.ApiClient, namespace: str, name: str,
                    runtime: str = "torch-distributed") -> dict[str, Any]:
    """Create a TrainJob referring to ClusterTrainingRuntime ``runtime``; return it.

    Raises:
        kubernetes.client.ApiException: e.g. 409 when it exists, 404 without the CRD.
    """
    body = {
        "apiVersion": f"{API_GROUP}/{API_VERSION}",
        "kind": "TrainJob",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "runtimeRef": {"name": runtime, "apiGroup": API_GROUP,
                           "kind": "ClusterTrainingRuntime"},
            "trainer": {"numNodes": 1},
        },
    }
    result: dict[str, Any] = client.CustomObjectsApi(api_client).create_namespaced_custom_object(
        API_GROUP, API_VERSION, namespace, TRAINJOB_PLURAL, body)
    return result


def apply_trainjob_status(api_client: client.ApiClient, namespace: str, name: str,
                          status: Mapping[str, Any], *, field_manager: str,
                          force: bool = True, dry_run: bool = False) -> dict[str, Any]:
    """Server-side apply ``status`` to TrainJob ``namespace/name`` via ``/status``; return it.

    The generated CustomObjectsApi only sends merge patches, so this posts the
    apply patch (``application/apply-patch+yaml``; JSON is valid YAML) itself.

    Raises:
        kubernetes.client.ApiException: e.g. 422 naming the field that breaks the
            schema, 404 for a missing TrainJob, 403 without RBAC permission.
    """
    body = {
        "apiVersion": f"{API_GROUP}/{API_VERSION}", "kind": "TrainJob",
        "metadata": {"name": name, "namespace": namespace},
        "status": dict(status),
    }
    query: list[tuple[str, str]] = [("fieldManager", field_manager)]
    if force:
        query.append(("force", "true"))
    if dry_run:
        query.append(("dryRun", "All"))
    result: dict[str, Any] = api_client.call_api(
        f"/apis/{API_GROUP}/{API_VERSION}/namespaces/{{namespace}}/{TRAINJOB_PLURAL}"
        "/{name}/status",
        "PATCH",
        path_params={"namespace": namespace, "name": name},
        query_params=query,
        header_params={"Content-Type": "application/apply-patch+yaml",
                       "Accept": "application/json"},
        body=body,
        response_type="object",
        auth_settings=["BearerToken"],
        _return_http_data_only=True,
    )
    return result


def _get_or_create(read: Callable[[], Any], create: Callable[[], Any]) -> Any:
    # Create first: most calls make a new object, and a 409 costs one more request.
    try:
        return create()
    except client.ApiException as exc:
        if exc.status != 409:  # it exists (made earlier or concurrently): read it
            raise
    return read()


def _ensure_jobset(api_client: client.ApiClient, namespace: str, trainjob: Mapping[str, Any],
                   replicated_job: str) -> dict[str, Any]:
    custom = client.CustomObjectsApi(api_client)
    name = trainjob["metadata"]["name"]
    body = {
        "apiVersion": f"{JOBSET_GROUP}/{JOBSET_VERSION}", "kind": "JobSet",
        "metadata": {"name": name, "namespace": namespace, "ownerReferences": [_owner(trainjob)]},
        "spec": {"replicatedJobs": [{"name": replicated_job, "replicas": 1,
                                     "template": {"spec": {"template": {"spec": {
                                         "containers": [{"name": TRAINER_CONTAINER,
                                                         "image": TRAINER_IMAGE}]}}}}}]},
    }
    result: dict[str, Any] = _get_or_create(
        lambda: custom.get_namespaced_custom_object(
            JOBSET_GROUP, JOBSET_VERSION, namespace, JOBSET_PLURAL, name),
        lambda: custom.create_namespaced_custom_object(
            JOBSET_GROUP, JOBSET_VERSION, namespace, JOBSET_PLURAL, body),
    )
    return result


def _ensure_job(api_client: client.ApiClient, namespace: str, job_name: str,
                jobset: Mapping[str, Any] | None, labels: Mapping[str, str]) -> dict[str, Any]:
    batch = client.BatchV1Api(api_client)
    body = {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": job_name, "namespace": namespace, "labels": dict(labels),
                     "ownerReferences": [_owner(jobset)] if jobset else []},
        "spec": {
            "completionMode": "Indexed", "completions": 1, "parallelism": 1,
            "template": {"metadata": {"labels": dict(labels)}, "spec": {
                "restartPolicy": "Never",
                "containers": [{"name": TRAINER_CONTAINER, "image": TRAINER_IMAGE}]}},
        },
    }
    job = _get_or_create(lambda: batch.read_namespaced_job(job_name, namespace),
                         lambda: batch.create_namespaced_job(namespace, body))
    result: dict[str, Any] = api_client.sanitize_for_serialization(job)
    return result


def create_trainer_pod(
    api_client: client.ApiClient,
    namespace: str,
    trainjob_name: str,
    *,
    port: int,
    ip: str = "127.0.0.1",
    phase: str = "Running",
    rank0: bool = True,
    replicated_job: str = "node",
    annotations: Mapping[str, str] | None = None,
    owner_chain: bool = True,
    sidecars: Sequence[str] = (),
    trainjob: Mapping[str, Any] | None = None,
) -> client.V1Pod:
    """Create a trainer Pod of TrainJob ``trainjob_name`` as JobSet and Job would.

    Labels are those of a Trainer v2 / JobSet pod (``jobset-name``,
    ``replicatedjob-name=<replicated_job>``, ``job-index=0``,
    ``job-completion-index=0`` for rank 0, ``1`` otherwise, plus job-name and
    controller-uid labels); annotation ``trainjob-progress.dev/port=<port>``
    plus ``annotations``.  With ``owner_chain`` the TrainJob must exist and the
    Pod is owned by a batch Job owned by a JobSet owned by the TrainJob (the
    JobSet and Job are created if missing).

    ``sidecars`` are names of native sidecars (``initContainers`` with
    ``restartPolicy: Always``), running beside ``node``.  ``trainjob`` is the TrainJob
    as :func:`create_trainjob` returned it (saves reading it again).

    ``phase`` "Running" writes status like a kubelet would: podIP/podIPs
    ``ip``, Ready conditions, container ``node`` (and the sidecars) running.  "Pending" leaves the
    pod without an IP and the container waiting.

    Raises:
        ValueError: ``phase`` is neither "Running" nor "Pending".
        kubernetes.client.ApiException: the API refused (e.g. 404: no TrainJob
            while ``owner_chain``).
    """
    if phase not in ("Running", "Pending"):
        raise ValueError(f"phase must be Running or Pending, not {phase!r}; "
                         "use terminate_pod() for Succeeded/Failed")
    completion_index = "0" if rank0 else "1"
    job_name = f"{trainjob_name}-{replicated_job}-0"
    labels = {
        LABEL_JOBSET_NAME: trainjob_name,
        LABEL_REPLICATED_JOB: replicated_job,
        "jobset.sigs.k8s.io/replicatedjob-replicas": "1",
        LABEL_JOB_INDEX: "0",
        "jobset.sigs.k8s.io/job-global-index": "0",
        "jobset.sigs.k8s.io/job-key": secrets.token_hex(20),
        "trainer.kubeflow.org/trainjob-ancestor-step": "trainer",
    }
    owner: dict[str, Any] | None = None
    job_uid = str(uuid.uuid4())
    if owner_chain:
        if trainjob is None:
            trainjob = client.CustomObjectsApi(api_client).get_namespaced_custom_object(
                API_GROUP, API_VERSION, namespace, TRAINJOB_PLURAL, trainjob_name)
        jobset = _ensure_jobset(api_client, namespace, trainjob, replicated_job)
        labels["jobset.sigs.k8s.io/jobset-uid"] = jobset["metadata"]["uid"]
        job = _ensure_job(api_client, namespace, job_name, jobset, labels)
        owner = _owner(job)
        job_uid = job["metadata"]["uid"]
    pod_labels = {
        **labels,
        LABEL_COMPLETION_INDEX: completion_index,
        "batch.kubernetes.io/job-name": job_name, "job-name": job_name,
        "batch.kubernetes.io/controller-uid": job_uid, "controller-uid": job_uid,
    }
    pod_annotations = {
        LABEL_COMPLETION_INDEX: completion_index,
        LABEL_JOBSET_NAME: trainjob_name,
        LABEL_REPLICATED_JOB: replicated_job,
        PORT_ANNOTATION: str(port),
        **(annotations or {}),
    }
    body = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": f"{job_name}-{completion_index}-{secrets.token_hex(3)[:5]}",
            "namespace": namespace, "labels": pod_labels, "annotations": pod_annotations,
            "ownerReferences": [owner] if owner else [],
        },
        "spec": {
            "nodeName": NODE_NAME,
            "restartPolicy": "Never",
            "subdomain": trainjob_name,
            "containers": [{"name": TRAINER_CONTAINER, "image": TRAINER_IMAGE,
                            "ports": [{"containerPort": port, "protocol": "TCP"}]}],
        },
    }
    if sidecars:
        body["spec"]["initContainers"] = [  # type: ignore[index]
            {"name": name, "image": TRAINER_IMAGE, "restartPolicy": "Always"}
            for name in sidecars]
    core = client.CoreV1Api(api_client)
    created: dict[str, Any] = api_client.sanitize_for_serialization(
        core.create_namespaced_pod(namespace, body))
    now = _now()
    if phase == "Running":
        status = {
            "phase": "Running", "hostIP": ip, "hostIPs": [{"ip": ip}],
            "podIP": ip, "podIPs": [{"ip": ip}], "startTime": now,
            "conditions": [_condition(t, "True", now) for t in (
                "PodScheduled", "Initialized", "ContainersReady", "Ready")],
            "containerStatuses": [{
                "name": TRAINER_CONTAINER, "image": TRAINER_IMAGE, "imageID": "",
                "ready": True, "started": True, "restartCount": 0,
                "state": {"running": {"startedAt": now}},
            }],
        }
        if sidecars:
            status["initContainerStatuses"] = [{
                "name": name, "image": TRAINER_IMAGE, "imageID": "", "ready": True,
                "started": True, "restartCount": 0, "state": {"running": {"startedAt": now}},
            } for name in sidecars]
    else:
        status = {
            "phase": "Pending",
            "conditions": [_condition("PodScheduled", "True", now)],
            "containerStatuses": [{
                "name": TRAINER_CONTAINER, "image": TRAINER_IMAGE, "imageID": "",
                "ready": False, "started": False, "restartCount": 0,
                "state": {"waiting": {"reason": "ContainerCreating"}},
            }],
        }
    return _write_status(api_client, namespace, created["metadata"]["name"],
                         lambda _: status, first=created)


def _condition(kind: str, status: str, now: str) -> dict[str, Any]:
    return {"type": kind, "status": status, "lastTransitionTime": now}


def _write_status(api_client: client.ApiClient, namespace: str, name: str,
                  mutate: Callable[[dict[str, Any]], dict[str, Any]],
                  first: dict[str, Any] | None = None) -> client.V1Pod:
    """Read-modify-replace pod status, retrying on conflicts (bounded); ``first`` is the
    pod as just written (the first try starts from it instead of a read)."""
    core = client.CoreV1Api(api_client)
    for attempt in range(STATUS_RETRIES):
        pod: dict[str, Any] = first if first is not None else (
            api_client.sanitize_for_serialization(core.read_namespaced_pod(name, namespace)))
        first = None
        pod["status"] = mutate(pod.get("status") or {})
        try:
            return core.replace_namespaced_pod_status(name, namespace, pod)
        except client.ApiException as exc:
            if exc.status != 409 or attempt == STATUS_RETRIES - 1:
                raise
            time.sleep(0.05)
    raise AssertionError("unreachable")


def terminate_pod(api_client: client.ApiClient, namespace: str, name: str, message: str,
                  exit_code: int = 0, container: str = TRAINER_CONTAINER,
                  sidecar_messages: Mapping[str, str] | None = None) -> client.V1Pod:
    """Mark ``container`` terminated with termination ``message`` and end the pod.

    ``sidecar_messages`` maps native sidecars (of :func:`create_trainer_pod`) to the
    termination message each leaves; they end with exit code 143 (SIGTERM), as a
    sidecar stopped by the kubelet after the main containers does.

    The pod phase becomes Succeeded for ``exit_code`` 0, Failed otherwise; the
    message lands in ``status.containerStatuses[].state.terminated.message``
    as a kubelet copies ``/dev/termination-log``.

    Raises:
        kubernetes.client.ApiException: e.g. 404 for a missing pod, 422 when
            ``container`` is not in the pod spec.
    """
    now = _now()

    def mutate(status: dict[str, Any]) -> dict[str, Any]:
        started = status.get("startTime") or now
        statuses = [s for s in status.get("containerStatuses") or []
                    if s.get("name") != container]
        statuses.append({
            "name": container, "image": TRAINER_IMAGE, "imageID": "",
            "ready": False, "started": False, "restartCount": 0,
            "state": {"terminated": {
                "exitCode": exit_code, "reason": "Completed" if exit_code == 0 else "Error",
                "message": message, "startedAt": started, "finishedAt": now}},
        })
        if sidecar_messages:
            status["initContainerStatuses"] = [{
                "name": sidecar, "image": TRAINER_IMAGE, "imageID": "", "ready": False,
                "started": False, "restartCount": 0,
                "state": {"terminated": {"exitCode": 143, "reason": "Error", "message": text,
                                         "startedAt": started, "finishedAt": now}},
            } for sidecar, text in sidecar_messages.items()]
        conditions = [c for c in status.get("conditions") or []
                      if c.get("type") not in ("Ready", "ContainersReady")]
        conditions += [_condition("ContainersReady", "False", now),
                       _condition("Ready", "False", now)]
        return {**status, "phase": "Succeeded" if exit_code == 0 else "Failed",
                "containerStatuses": statuses, "conditions": conditions}

    return _write_status(api_client, namespace, name, mutate)


def delete_pod(api_client: client.ApiClient, namespace: str, name: str) -> None:
    """Delete a pod immediately (grace period 0: no kubelet would confirm a graceful one).

    A missing pod is not an error.
    """
    try:
        client.CoreV1Api(api_client).delete_namespaced_pod(name, namespace,
                                                           grace_period_seconds=0)
    except client.ApiException as exc:
        if exc.status != 404:
            raise


def delete_trainjob(api_client: client.ApiClient, namespace: str, name: str,
                    *, cascade: bool = True) -> None:
    """Delete a TrainJob; with ``cascade`` also its pods, Jobs and JobSet.

    There is no garbage collector here, so ``cascade`` does its job: it deletes
    everything labelled ``jobset.sigs.k8s.io/jobset-name=<name>`` and the JobSet.
    Missing objects are not an error.
    """
    selector = f"{LABEL_JOBSET_NAME}={name}"
    custom = client.CustomObjectsApi(api_client)
    if cascade:
        core = client.CoreV1Api(api_client)
        for pod in core.list_namespaced_pod(namespace, label_selector=selector).items:
            delete_pod(api_client, namespace, pod.metadata.name)
        batch = client.BatchV1Api(api_client)
        for job in batch.list_namespaced_job(namespace, label_selector=selector).items:
            # Background: the batch/v1 default (orphan) adds a finalizer only the
            # garbage collector would remove.
            _ignore_404(functools.partial(batch.delete_namespaced_job, job.metadata.name,
                                          namespace, propagation_policy="Background"))
        _ignore_404(lambda: custom.delete_namespaced_custom_object(
            JOBSET_GROUP, JOBSET_VERSION, namespace, JOBSET_PLURAL, name,
            propagation_policy="Background"))
    _ignore_404(lambda: custom.delete_namespaced_custom_object(
        API_GROUP, API_VERSION, namespace, TRAINJOB_PLURAL, name,
        propagation_policy="Background"))


def _ignore_404(call: Callable[[], Any]) -> None:
    try:
        call()
    except client.ApiException as exc:
        if exc.status != 404:
            raise
