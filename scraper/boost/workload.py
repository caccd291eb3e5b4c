"""A TrainJob's Kueue Workload: found by owner reference, read for what the boost rule
needs, and its ``kueue.x-k8s.io/priority-boost`` annotation written.

Facts of Kueue v0.17.0 this relies on (``sigs.k8s.io/kueue@v0.17.0``):

* the annotation key ``kueue.x-k8s.io/priority-boost``
  (``pkg/controller/constants/constants.go``, ``PriorityBoostAnnotationKey``), read as a
  base-10 int32 and added to the Workload's priority when the ``PriorityBoost`` feature
  gate (Alpha, off by default; ``pkg/features/kube_features.go``) is on
  (``pkg/util/priority/priority.go``, ``EffectivePriority``); without the gate Kueue
  ignores it;
* the Workload of a TrainJob has an owner reference to it (Kueue's job framework sets
  the job as the Workload's controller owner);
* ``status.admission.podSetAssignments[].resourceUsage``: the total resources of all the
  pods of a pod set (``apis/kueue/v1beta2/workload_types.go``);
* the ``Admitted`` condition: its ``lastTransitionTime`` is when the current run was let in.

The write is a JSON merge patch of that one annotation, carrying the Workload's UID (a
Workload re-created under the same name is refused, not boosted): RBAC ``patch`` on
``workloads.kueue.x-k8s.io`` (the chart grants it only with ``priorityBoost.max > 0``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from kubernetes import client as k8s
from kubernetes.utils import parse_quantity

from exporter_lib.status import API_GROUP
from scraper.boost.rule import Resources, resources_of
from scraper.kube.calls import call

KUEUE_GROUP = "kueue.x-k8s.io"
KUEUE_VERSION = "v1beta2"
WORKLOAD_PLURAL = "workloads"
PRIORITY_BOOST_ANNOTATION = "kueue.x-k8s.io/priority-boost"
#: Field manager of the boost writes.
BOOST_FIELD_MANAGER = "trainjob-scraper-boost"
#: ``(connect, read)`` timeouts of one list and of one write (seconds).
LIST_REQUEST_TIMEOUT = (3, 20)
WRITE_REQUEST_TIMEOUT = (3, 5)


@dataclass(frozen=True)
class WorkloadView:
    """What the boost needs of one Workload owned by a TrainJob.

    Attributes:
        namespace, name, uid: the Workload's.
        owner_uid: the UID of the TrainJob that owns it.
        boost: its ``kueue.x-k8s.io/priority-boost`` annotation as written (None: absent).
        admitted_at: unix seconds its ``Admitted`` condition turned true (None: not
            admitted now: pending, or evicted).
        resources: the admitted resources of all its pods (None: not admitted).
    """

    namespace: str
    name: str
    uid: str
    owner_uid: str
    boost: str | None
    admitted_at: float | None
    resources: Resources | None


def trainjob_owner(obj: Mapping[str, Any]) -> str | None:
    """The UID of the TrainJob in ``obj``'s owner references, or None."""
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or ():
        api_version = str(ref.get("apiVersion") or "")
        if ref.get("kind") == "TrainJob" and api_version.split("/", 1)[0] == API_GROUP:
            uid = ref.get("uid")
            return str(uid) if uid else None
    return None


def admitted_at(obj: Mapping[str, Any]) -> float | None:
    """Unix seconds of the ``Admitted`` condition's last transition while it is True."""
    for cond in (obj.get("status") or {}).get("conditions") or ():
        if cond.get("type") == "Admitted" and cond.get("status") == "True":
            stamp = cond.get("lastTransitionTime")
            if isinstance(stamp, datetime):
                return stamp.timestamp()
            if isinstance(stamp, str):
                try:
                    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
                except ValueError:
                    return None
    return None


def admitted_usage(obj: Mapping[str, Any]) -> dict[str, float] | None:
    """Total admitted resources (name -> amount; CPUs in cores) over the pod sets, or None
    when the Workload is not admitted.  Quantities that do not parse are skipped."""
    admission = (obj.get("status") or {}).get("admission")
    if not admission:
        return None
    total: dict[str, float] = {}
    for assignment in admission.get("podSetAssignments") or ():
        for name, quantity in (assignment.get("resourceUsage") or {}).items():
            try:
                amount = float(parse_quantity(quantity))
            except (ValueError, TypeError, ArithmeticError):
                continue
            if math.isfinite(amount):
                total[str(name)] = total.get(str(name), 0.0) + amount
    return total


def view_of(obj: Mapping[str, Any]) -> WorkloadView | None:
    """The :class:`WorkloadView` of a Workload object (a dict as the API returns it), or
    None when no TrainJob owns it."""
    owner = trainjob_owner(obj)
    if owner is None:
        return None
    meta = obj.get("metadata") or {}
    usage = admitted_usage(obj)
    when = admitted_at(obj)
    return WorkloadView(
        namespace=str(meta.get("namespace") or ""), name=str(meta.get("name") or ""),
        uid=str(meta.get("uid") or ""), owner_uid=owner,
        boost=(meta.get("annotations") or {}).get(PRIORITY_BOOST_ANNOTATION),
        admitted_at=when,
        resources=None if usage is None or when is None else resources_of(usage))


async def list_workloads(api: k8s.ApiClient, scopes: Iterable[str | None]) -> list[WorkloadView]:
    """Every Workload owned by a TrainJob in ``scopes`` (None: all namespaces): one list
    request per scope.

    Raises:
        kubernetes.client.ApiException: the API server refused (403: no ``list`` on
            workloads; 404: Kueue's CRDs are not installed).
    """
    custom = k8s.CustomObjectsApi(api)
    views: list[WorkloadView] = []
    for scope in scopes:
        if scope is None:
            body = await call(custom.list_cluster_custom_object, KUEUE_GROUP, KUEUE_VERSION,
                              WORKLOAD_PLURAL, _request_timeout=LIST_REQUEST_TIMEOUT)
        else:
            body = await call(custom.list_namespaced_custom_object, KUEUE_GROUP,
                              KUEUE_VERSION, scope, WORKLOAD_PLURAL,
                              _request_timeout=LIST_REQUEST_TIMEOUT)
        for item in body.get("items") or ():
            view = view_of(item)
            if view is not None:
                views.append(view)
    return views


def boost_patch(uid: str, value: int) -> dict[str, object]:
    """The merge patch setting the annotation to ``value`` on the Workload with ``uid``."""
    return {"metadata": {"uid": uid, "annotations": {PRIORITY_BOOST_ANNOTATION: str(value)}}}


async def write_boost(api: k8s.ApiClient, namespace: str, name: str, uid: str,
                      value: int) -> None:
    """Set the priority boost of Workload ``namespace/name`` (UID ``uid``) to ``value``.

    Raises:
        kubernetes.client.ApiException: the API server refused it (403: no ``patch`` on
            workloads; 404: gone; 422: another UID).
    """
    custom = k8s.CustomObjectsApi(api)
    await call(custom.patch_namespaced_custom_object, KUEUE_GROUP, KUEUE_VERSION, namespace,
               WORKLOAD_PLURAL, name, boost_patch(uid, value),
               field_manager=BOOST_FIELD_MANAGER, _request_timeout=WRITE_REQUEST_TIMEOUT)
