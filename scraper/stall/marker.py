"""The ``trainjob-progress.dev/stalled-since`` annotation write (:mod:`scraper.stall.watch`
decides when; this module is the one request).

A JSON merge patch of that one key on the TrainJob (the main resource): RBAC ``patch`` on
``trainjobs`` (the chart's ``config.stall.annotate``, on by default), narrowed to the
scraper's annotations by the chart's ValidatingAdmissionPolicy when it is enabled.  The
patch carries the TrainJob's UID, so a TrainJob deleted and re-created under the same
name is refused (422, ``metadata.uid: field is immutable``) instead of marked.
"""

from __future__ import annotations

from kubernetes import client as k8s

from exporter_lib.status import API_GROUP, API_VERSION, TRAINJOB_PLURAL
from scraper.kube.calls import call
from scraper.stall.rule import STALLED_SINCE_ANNOTATION

#: Field manager of the annotation writes (apart from the status writes' own).
STALL_FIELD_MANAGER = "trainjob-scraper-stall"
#: ``(connect, read)`` timeout of one annotation write (seconds).
STALL_REQUEST_TIMEOUT = (3, 5)


def marker_patch(uid: str, value: str | None) -> dict[str, object]:
    """The merge patch setting the annotation to ``value`` (RFC 3339; None removes it)."""
    return {"metadata": {"uid": uid, "annotations": {STALLED_SINCE_ANNOTATION: value}}}


async def write_stall_marker(api: k8s.ApiClient, namespace: str, name: str, uid: str,
                             value: str | None) -> None:
    """Set (or remove, None) the annotation of TrainJob ``namespace/name`` with UID ``uid``.

    Raises:
        kubernetes.client.ApiException: the API server refused it (403: no ``patch`` on
            trainjobs or the admission policy; 404: gone; 422: another UID).
    """
    custom = k8s.CustomObjectsApi(api)
    await call(custom.patch_namespaced_custom_object, API_GROUP, API_VERSION, namespace,
               TRAINJOB_PLURAL, name, marker_patch(uid, value),
               field_manager=STALL_FIELD_MANAGER, _request_timeout=STALL_REQUEST_TIMEOUT)
