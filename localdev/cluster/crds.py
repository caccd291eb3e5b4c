"""Install the CRDs of the local control plane and wait until they serve.

Manifests live in ``localdev/cluster/manifests/``:

* ``trainjob-crd.yaml``: TrainJob with ``status.trainerStatus`` (current Trainer).
* ``trainjob-crd-legacy.yaml``: TrainJob from Trainer releases before that field;
  a ``trainerStatus`` written to it is pruned.
* ``jobset-crd.yaml``: a minimal JobSet for TrainJob -> JobSet -> Job -> Pod chains.
"""

from __future__ import annotations

import time
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from exporter_lib.status import API_GROUP, API_VERSION, TRAINJOB_PLURAL

TRAINJOB_CRD = "trainjob-crd.yaml"
TRAINJOB_CRD_LEGACY = "trainjob-crd-legacy.yaml"
JOBSET_CRD = "jobset-crd.yaml"
#: Namespace of the object used to probe which TrainJob schema is in effect.
PROBE_NAMESPACE = "devcluster-system"
PROBE_NAME = "schema-probe"
#: Default wait for a CRD to be Established / a schema to take effect (seconds).
CRD_TIMEOUT_SECONDS = 30.0


class CrdError(RuntimeError):
    """A CRD did not become Established, or its schema did not take effect, in time."""


def load_manifest(name: str) -> dict[str, Any]:
    """The parsed manifest ``name`` from the package's ``manifests/`` directory."""
    text = resources.files("localdev.cluster").joinpath("manifests", name).read_text()
    data = yaml.safe_load(text)
    if not isinstance(data, dict):
        raise ValueError(f"manifest {name} is not a single YAML object")
    return data


def install_crd(api_client: client.ApiClient, manifest: str | dict[str, Any],
                timeout: float = CRD_TIMEOUT_SECONDS) -> dict[str, Any]:
    """Create or replace a CRD and wait until it is Established; return the stored CRD.

    ``manifest`` is a file name in ``manifests/`` or a parsed CRD.  Replacing
    keeps existing custom objects (the API server re-validates them lazily).

    Raises:
        CrdError: not Established within ``timeout`` seconds.
        kubernetes.client.ApiException: the API server rejected the CRD.
    """
    body = load_manifest(manifest) if isinstance(manifest, str) else dict(manifest)
    name = body["metadata"]["name"]
    ext = client.ApiextensionsV1Api(api_client)
    try:
        ext.create_custom_resource_definition(body)
    except client.ApiException as exc:
        if exc.status != 409:
            raise
        # Optimistic concurrency: replace the version we read, retry on conflict.
        deadline = time.monotonic() + timeout
        while True:
            current = api_client.sanitize_for_serialization(
                ext.read_custom_resource_definition(name))
            body = {**body, "metadata": {**body["metadata"],
                                         "resourceVersion": current["metadata"]["resourceVersion"]}}
            try:
                ext.replace_custom_resource_definition(name, body)
                break
            except client.ApiException as conflict:
                if conflict.status != 409 or time.monotonic() > deadline:
                    raise
    return wait_established(api_client, name, timeout)


def wait_established(api_client: client.ApiClient, name: str,
                     timeout: float = CRD_TIMEOUT_SECONDS) -> dict[str, Any]:
    """Poll CRD ``name`` until its Established condition is True; return it.

    Raises:
        CrdError: not Established within ``timeout`` seconds.
    """
    ext = client.ApiextensionsV1Api(api_client)
    deadline = time.monotonic() + timeout
    while True:
        crd: dict[str, Any] = api_client.sanitize_for_serialization(
            ext.read_custom_resource_definition(name))
        conditions = {c["type"]: c["status"] for c in crd.get("status", {}).get("conditions", [])}
        if conditions.get("Established") == "True":
            return crd
        if time.monotonic() > deadline:
            raise CrdError(f"CRD {name} not Established after {timeout}s: {conditions}")
        time.sleep(0.1)


def install_trainjob_crds(api_client: client.ApiClient, *, legacy: bool = False,
                          timeout: float = CRD_TIMEOUT_SECONDS) -> None:
    """Install JobSet and the current (or ``legacy``) TrainJob CRD and wait until in effect.

    Returns only once the API server applies the chosen TrainJob schema, so a
    swap between current and legacy is visible to the very next request.

    Raises:
        CrdError: a CRD or schema did not take effect within ``timeout`` seconds.
    """
    install_crd(api_client, JOBSET_CRD, timeout)
    install_crd(api_client, TRAINJOB_CRD_LEGACY if legacy else TRAINJOB_CRD, timeout)
    wait_trainer_status_schema(api_client, present=not legacy, timeout=timeout)


def wait_trainer_status_schema(api_client: client.ApiClient, *, present: bool,
                               timeout: float = CRD_TIMEOUT_SECONDS,
                               runtime: str = "schema-probe") -> None:
    """Wait until the served TrainJob schema keeps (``present``) or prunes trainerStatus.

    A CRD update reaches the API server's request handlers asynchronously, so
    this probes: a dry-run status merge patch on a (suspended) probe TrainJob on
    ClusterTrainingRuntime ``runtime`` shows whether ``trainerStatus`` survives.
    Where the Trainer's admission webhook runs, ``runtime`` must exist.

    Raises:
        CrdError: the expected schema was not in effect within ``timeout`` seconds.
    """
    core = client.CoreV1Api(api_client)
    custom = client.CustomObjectsApi(api_client)
    try:
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(
            name=PROBE_NAMESPACE)))
    except client.ApiException as exc:
        if exc.status != 409:
            raise
    deadline = time.monotonic() + timeout
    probe = {
        "apiVersion": f"{API_GROUP}/{API_VERSION}", "kind": "TrainJob",
        "metadata": {"name": PROBE_NAME, "namespace": PROBE_NAMESPACE},
        # Suspended: with the Trainer controller running, it makes no pods.
        "spec": {"runtimeRef": {"name": runtime}, "suspend": True},
    }
    while True:
        try:
            custom.create_namespaced_custom_object(
                API_GROUP, API_VERSION, PROBE_NAMESPACE, TRAINJOB_PLURAL, probe)
        except client.ApiException as exc:
            if exc.status not in (404, 409):  # 404: CRD not served yet
                raise
        try:
            # A merge patch, not an apply: an apply of a field the schema lacks
            # fails outright instead of showing the pruning.
            result = custom.patch_namespaced_custom_object_status(
                API_GROUP, API_VERSION, PROBE_NAMESPACE, TRAINJOB_PLURAL, PROBE_NAME,
                {"status": {"trainerStatus": {"progressPercentage": 0,
                                              "lastUpdatedTime": "2000-01-01T00:00:00Z"}}},
                dry_run="All")
            if ("trainerStatus" in (result.get("status") or {})) == present:
                return
        except client.ApiException as exc:
            if exc.status != 404:
                raise
        if time.monotonic() > deadline:
            state = "present" if present else "absent"
            raise CrdError(f"TrainJob schema with trainerStatus {state} not in effect "
                           f"after {timeout}s")
        time.sleep(0.1)


# ----------------------------------------------------------------- the real CRDs

#: Cluster flavours of :class:`localdev.cluster.stack.Cluster`.
FLAVOUR_CURRENT = "v2.2-and-later"
FLAVOUR_LEGACY = "before-v2.2"
FLAVOURS = (FLAVOUR_CURRENT, FLAVOUR_LEGACY)
#: The bundle's manifest directory of each flavour's Trainer (``scripts/stack-assets``):
#: v2.3.0 (declares ``status.trainerStatus``) and v2.0.0 (does not).
TRAINER_MANIFESTS = {FLAVOUR_CURRENT: "trainer", FLAVOUR_LEGACY: "trainer-v2.0.0"}


def load_yaml_file(path: Path) -> dict[str, Any]:
    """The single YAML object in ``path``.

    Raises:
        ValueError: the file does not hold exactly one object.
    """
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    if len(docs) != 1 or not isinstance(docs[0], dict):
        raise ValueError(f"{path}: expected one YAML object, found {len(docs)}")
    return docs[0]


def trainer_manifests(manifests: Path, flavour: str) -> Path:
    """The shipped manifests (``crds``, ``webhook``, ``runtimes``) of ``flavour``'s Trainer.

    ``manifests`` is the bundle's ``manifests/`` directory.

    Raises:
        ValueError: unknown ``flavour``.
    """
    if flavour not in FLAVOURS:
        raise ValueError(f"flavour={flavour!r}: must be one of {FLAVOURS}")
    return manifests / TRAINER_MANIFESTS[flavour]


def shipped_crds(manifests: Path, flavour: str = FLAVOUR_CURRENT) -> list[dict[str, Any]]:
    """The JobSet CRD and the three Trainer CRDs of ``flavour``, exactly as shipped.

    ``manifests`` is the bundle's ``manifests/`` directory (``scripts/stack-assets``).

    Raises:
        ValueError: unknown ``flavour``.
    """
    files = sorted((manifests / "jobset" / "crd").glob("*.yaml"))
    files += sorted((trainer_manifests(manifests, flavour) / "crds").glob("*.yaml"))
    return [load_yaml_file(f) for f in files]


def trainjob_crd(manifests: Path, flavour: str) -> dict[str, Any]:
    """The TrainJob CRD of ``flavour`` (:data:`FLAVOURS`) exactly as its Trainer ships it.

    "v2.2-and-later" is Trainer v2.3.0's (with ``status.trainerStatus``),
    "before-v2.2" Trainer v2.0.0's (without: a ``trainerStatus`` written is pruned).

    Raises:
        ValueError: unknown ``flavour``.
    """
    return load_yaml_file(trainer_manifests(manifests, flavour) / "crds" /
                          f"{API_GROUP}_{TRAINJOB_PLURAL}.yaml")


def install_shipped_crds(api_client: client.ApiClient, manifests: Path, flavour: str,
                         timeout: float = CRD_TIMEOUT_SECONDS) -> None:
    """Install the shipped JobSet and Trainer CRDs of ``flavour``'s Trainer.

    Returns once every CRD is Established (not waiting for the schema to reach
    every handler; :func:`wait_trainer_status_schema` does that).

    Raises:
        CrdError: a CRD was not Established within ``timeout`` seconds.
        ValueError: unknown ``flavour``.
    """
    for crd in shipped_crds(manifests, flavour):
        install_crd(api_client, crd, timeout)
