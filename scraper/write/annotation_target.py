"""Where the scraper writes a trainer status: ``status.trainerStatus`` or the annotation.

``status.trainerStatus`` exists in the TrainJob CRD from Kubeflow Trainer v2.2.0 on; an
older CRD prunes it.  ``--status-target`` chooses:

* ``status`` (default): ``status.trainerStatus`` only, by server-side apply on the
  ``status`` subresource.  The default because it is the Trainer API's own field (the
  one upstream's tools and ``kubectl get -o yaml`` show) and it changes nothing on
  clusters that run v2.2 or later; on an older CRD nothing is stored (an ERROR line
  and a ``TrainerStatusUnsupported`` Event per TrainJob say so).
* ``annotation``: the annotation :data:`~exporter_lib.status_annotation.TRAINER_STATUS_ANNOTATION`
  only (format: :mod:`exporter_lib.status_annotation`), by server-side apply on the
  main resource with nothing but ``metadata.annotations`` (and ``metadata.uid``, below)
  in the body.  Works on every Trainer release; needs ``patch`` on ``trainjobs``.
* ``auto``: the annotation while the CRD is known to lack ``status.trainerStatus``
  (:attr:`scraper.kube.crd.CrdSupport.supported` is False: its schema, or an apply that
  came back pruned or refused as undeclared), ``status.trainerStatus`` otherwise
  (also while the CRD is unread).  The CRD is re-read every minute while it is not
  known to have the field, so an upgrade of the Trainer CRDs switches writes back to
  the status without a restart.  The annotation last written stays; readers take the
  later of the two (``kubectl trainjob``, :func:`trainjob_client.get_trainer_status`).

Both places go through the same write queue, budget, change detection (against what
the TrainJob informer holds in that place), drift restore and identity checks
(:mod:`scraper.write.writer`).  The annotation apply carries ``metadata.uid``, which
on the main resource is a precondition (measured on kube-apiserver v1.37): a TrainJob
re-created under the same name answers 422 ``metadata.uid: ... field is immutable``, a
deleted one 409 ``uid mismatch ... no existing object was found``, so an apply can
neither write to another object of that name nor create a TrainJob.  (On the
``status`` subresource the API server ignores ``metadata.uid``.)
"""

from __future__ import annotations

import enum
from dataclasses import replace
from typing import Any

from kubernetes.client.exceptions import ApiException

from exporter_lib.status import (
    API_GROUP,
    API_VERSION,
    TRAINJOB_PLURAL,
    StatusError,
    TrainerStatus,
)
from exporter_lib.status_annotation import TRAINER_STATUS_ANNOTATION, encode_annotation
from scraper.shared.trainjobs import TrainJobRecord, Writer

__all__ = [
    "Place",
    "StatusTarget",
    "apply_request",
    "place_for",
    "status_in",
    "stored",
    "stored_after_apply",
    "uid_precondition_failed",
    "writer_in",
    "written",
]

_PATH = "/apis/{group}/{version}/namespaces/{namespace}/{plural}/{name}"


class StatusTarget(enum.Enum):
    """The ``--status-target`` option (module doc)."""

    STATUS = "status"
    ANNOTATION = "annotation"
    AUTO = "auto"


class Place(enum.Enum):
    """Where one write goes; ``value`` names it as readers and logs do."""

    STATUS = "status.trainerStatus"
    ANNOTATION = f"metadata.annotations[{TRAINER_STATUS_ANNOTATION}]"


def place_for(target: StatusTarget, crd_supported: bool | None) -> Place:
    """The place of the next write under ``target``, given what is known of the CRD
    (:attr:`scraper.kube.crd.CrdSupport.supported`: None unknown, False lacks the field)."""
    if target is StatusTarget.ANNOTATION or (target is StatusTarget.AUTO
                                             and crd_supported is False):
        return Place.ANNOTATION
    return Place.STATUS


def status_in(record: TrainJobRecord | None, place: Place) -> TrainerStatus | None:
    """What ``record`` (a TrainJob as the informer has it) holds in ``place``."""
    if record is None:
        return None
    return record.annotated if place is Place.ANNOTATION else record.status


def written(record: TrainJobRecord, place: Place, status: TrainerStatus, uid: str,
            resource_version: str, by: Writer | None = None) -> TrainJobRecord:
    """``record`` after ``status`` was applied to ``place`` by ``by`` (None: the writer
    kept as it was; the other place unchanged)."""
    if place is Place.ANNOTATION:
        return replace(record, uid=uid, annotated=status, resource_version=resource_version,
                       annotated_by=by or record.annotated_by)
    return replace(record, uid=uid, status=status, resource_version=resource_version,
                   status_by=by or record.status_by)


def stored_after_apply(obj: dict[str, Any], place: Place, sent: TrainerStatus) -> TrainerStatus:
    """What ``place`` holds in ``obj`` (an apply answer) after ``sent`` was applied.

    ``sent`` itself, except for ``status.trainerStatus`` when ``sent`` leaves
    ``progressPercentage`` or ``estimatedRemainingSeconds`` unset and the answer still
    has it (another field manager owns it): then the answer's status.  The annotation
    always carries the whole status sent.
    """
    if place is Place.ANNOTATION:
        return sent
    raw = (obj.get("status") or {}).get("trainerStatus")
    if not isinstance(raw, dict) or not (
            (sent.progress_percentage is None and "progressPercentage" in raw)
            or (sent.estimated_remaining_seconds is None
                and "estimatedRemainingSeconds" in raw)):
        return sent
    try:
        return TrainerStatus.from_api(raw)
    except StatusError:
        return sent


def writer_in(record: TrainJobRecord | None, place: Place) -> Writer | None:
    """Who wrote what ``record`` holds in ``place``
    (:class:`scraper.shared.trainjobs.Writer`)."""
    if record is None:
        return None
    return record.annotated_by if place is Place.ANNOTATION else record.status_by


def apply_request(place: Place, namespace: str, name: str, status: TrainerStatus,
                  uid: str = "", resource_version: str = "",
                  ) -> tuple[str, dict[str, str], dict[str, Any]]:
    """``(path template, path parameters, apply body)`` of the write of ``status``.

    ``uid`` (the TrainJob's, as the informer holds it) goes into the annotation body's
    ``metadata.uid``, the precondition described in the module doc; ``""`` leaves it out.
    ``resource_version`` (the one the write was decided against) goes into
    ``metadata.resourceVersion`` in both places: the API server answers 409 Conflict when
    the object changed since (docs/scraper.md, "Other writers and time", rule 6).

    Raises:
        StatusError: the annotation value would exceed its bound (never for a valid
            status: :mod:`exporter_lib.status_annotation`).
    """
    params = {"group": API_GROUP, "version": API_VERSION, "namespace": namespace,
              "plural": TRAINJOB_PLURAL, "name": name}
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    if resource_version:
        meta["resourceVersion"] = resource_version
    head = {"apiVersion": f"{API_GROUP}/{API_VERSION}", "kind": "TrainJob", "metadata": meta}
    if place is Place.ANNOTATION:
        if uid:
            meta["uid"] = uid
        meta["annotations"] = {TRAINER_STATUS_ANNOTATION: encode_annotation(status)}
        return _PATH, params, head
    return _PATH + "/status", params, {**head, "status": {"trainerStatus": status.to_api()}}


def stored(obj: dict[str, Any], place: Place) -> bool:
    """True when an apply answer ``obj`` holds a value in ``place`` (False: pruned)."""
    if place is Place.ANNOTATION:
        return bool(((obj.get("metadata") or {}).get("annotations") or {}).get(
            TRAINER_STATUS_ANNOTATION))
    return bool((obj.get("status") or {}).get("trainerStatus"))


def uid_precondition_failed(exc: BaseException) -> bool:
    """True for the API server's answers to an annotation apply whose ``metadata.uid`` is
    not the object's: the TrainJob was re-created (422) or deleted (409) meanwhile."""
    if not isinstance(exc, ApiException):
        return False
    body = str(exc.body or "")
    return ((exc.status == 422 and "metadata.uid" in body and "immutable" in body)
            or (exc.status == 409 and "uid mismatch" in body))
