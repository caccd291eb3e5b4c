"""The TrainJob annotation that carries the trainer status on Trainer releases before v2.2.

``status.trainerStatus`` exists in the TrainJob API from Kubeflow Trainer v2.2.0 on;
an older CRD prunes it.  On such clusters the scraper's opt-in annotation mode writes
the same status to one annotation of the TrainJob instead, and every reader (the
kubectl plugin, the SDK helper, the notebook progress bar) looks in both places.

This module is the one definition of that annotation; it needs only
:mod:`exporter_lib.status`, so the scraper can import it without the client's extras.

Format (version 1), the contract readers and the writer share:

* name :data:`TRAINER_STATUS_ANNOTATION` (``trainjob-progress.dev/trainer-status``);
* value: the compact UTF-8 JSON object of ``status.trainerStatus`` exactly as the
  Trainer v1alpha1 API stores it (camelCase keys ``progressPercentage``,
  ``estimatedRemainingSeconds``, ``metrics`` as a list of ``{name, value}`` strings,
  ``lastUpdatedTime`` RFC 3339 with whole seconds), the bytes of
  :meth:`exporter_lib.status.TrainerStatus.to_json`;
* size: at most :data:`TRAINER_STATUS_ANNOTATION_MAX_BYTES` bytes.  Kubernetes caps
  all annotations of an object at 256 KiB together (``TotalAnnotationSizeLimitB`` in
  apimachinery's ``ValidateAnnotations``); this bound is a quarter of that and holds
  any status whose 256 metrics are ASCII at the API's 64-character limits (about 38 KB).
"""

from __future__ import annotations

from exporter_lib.status import StatusError, TrainerStatus

#: Annotation key on the TrainJob (``metadata.annotations``).
TRAINER_STATUS_ANNOTATION = "trainjob-progress.dev/trainer-status"
#: Version of the value's format described in this module's docstring.
TRAINER_STATUS_ANNOTATION_FORMAT = 1
#: Largest value (UTF-8 bytes) a writer may store and a reader accepts.
TRAINER_STATUS_ANNOTATION_MAX_BYTES = 64 * 1024


def encode_annotation(status: TrainerStatus) -> str:
    """The annotation value for ``status`` (compact JSON, see the module docstring).

    Raises:
        StatusError: the JSON is larger than :data:`TRAINER_STATUS_ANNOTATION_MAX_BYTES`
            (the message gives both sizes); a writer must shorten it, not store it.
    """
    body = status.to_json()
    if len(body) > TRAINER_STATUS_ANNOTATION_MAX_BYTES:
        raise StatusError([
            f"annotation {TRAINER_STATUS_ANNOTATION}=<{len(body)} bytes>: must be at most "
            f"{TRAINER_STATUS_ANNOTATION_MAX_BYTES} bytes"])
    return body.decode()


def decode_annotation(value: str) -> TrainerStatus:
    """Parse and validate an annotation value written by :func:`encode_annotation`.

    Annotations are not validated by the API server (unlike ``status.trainerStatus``,
    which the CRD schema checks), so every Trainer API limit is checked here.

    Raises:
        StatusError: too large, not a JSON object, or a field breaks a limit; the
            message starts with the annotation's name and names field, value and limit.
    """
    size = len(value.encode())
    if size > TRAINER_STATUS_ANNOTATION_MAX_BYTES:
        raise StatusError([
            f"annotation {TRAINER_STATUS_ANNOTATION}=<{size} bytes>: must be at most "
            f"{TRAINER_STATUS_ANNOTATION_MAX_BYTES} bytes"])
    try:
        return TrainerStatus.from_json(value)
    except StatusError as exc:
        raise StatusError([f"annotation {TRAINER_STATUS_ANNOTATION}: {p}"
                           for p in exc.problems]) from None


__all__ = [
    "TRAINER_STATUS_ANNOTATION",
    "TRAINER_STATUS_ANNOTATION_FORMAT",
    "TRAINER_STATUS_ANNOTATION_MAX_BYTES",
    "decode_annotation",
    "encode_annotation",
]
