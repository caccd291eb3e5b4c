"""The TrainJob annotation that carries the trainer status on Trainer releases before v2.2.

``status.trainerStatus`` exists in the TrainJob API from Kubeflow Trainer v2.2.0 on;
an older CRD prunes it.  On such clusters the scraper's opt-in annotation mode writes
the same status to one annotation of the TrainJob instead, and every reader (the
kubectl plugin, the SDK helper, the notebook progress bar) looks in both places.

This module is the one definition of that annotation, for the writer (the scraper,
:mod:`scraper.write.annotation_target`) and the readers (:mod:`trainjob_client.annotation`
re-exports it).  It lives in ``exporter_lib`` because that is the one package both the
scraper image and the client ship; it needs only :mod:`exporter_lib.status`.

Format (version 1), the contract readers and the writer share:

* name :data:`TRAINER_STATUS_ANNOTATION` (``trainjob-progress.dev/trainer-status``);
* value: the compact UTF-8 JSON object of ``status.trainerStatus`` exactly as the
  Trainer v1alpha1 API stores it (camelCase keys ``progressPercentage``,
  ``estimatedRemainingSeconds``, ``metrics`` as a list of ``{name, value}`` strings,
  ``lastUpdatedTime`` RFC 3339 with whole seconds), the bytes of
  :meth:`exporter_lib.status.TrainerStatus.to_api_json` (no ``lastCheckpointTime``: the
  exporter contract's field is not the Trainer API's);
* size: at most :data:`TRAINER_STATUS_ANNOTATION_MAX_BYTES` bytes, the largest JSON
  any valid status can have (:func:`largest_status_json_bytes`: 256 metrics whose
  64-character names and values are all C0 control characters, six bytes each as the
  ``\\u00XX`` escape; 202,614 bytes), so every status the Trainer API accepts fits and
  none is cut.  Kubernetes caps all annotations of an object at 256 KiB together
  (``TotalAnnotationSizeLimitB`` = 262,144 bytes in apimachinery's
  ``ValidateAnnotations``), which leaves 58 KiB for the object's other
  annotations; a real status (ASCII metrics) is a few hundred bytes.
"""

from __future__ import annotations

from datetime import UTC, datetime

from exporter_lib.status import (
    METRIC_NAME_MAX_LENGTH,
    METRIC_VALUE_MAX_LENGTH,
    METRICS_MAX_ITEMS,
    PROGRESS_MAX,
    REMAINING_SECONDS_MAX,
    StatusError,
    TrainerStatus,
)

#: Annotation key on the TrainJob (``metadata.annotations``).
TRAINER_STATUS_ANNOTATION = "trainjob-progress.dev/trainer-status"
#: Version of the value's format described in this module's docstring.
TRAINER_STATUS_ANNOTATION_FORMAT = 1
#: What Kubernetes allows for all annotations of one object together (bytes of keys and
#: values; apimachinery ``TotalAnnotationSizeLimitB``).
KUBERNETES_ANNOTATIONS_MAX_BYTES = 256 * 1024


def largest_status_json_bytes() -> int:
    """Bytes of the largest :meth:`~exporter_lib.status.TrainerStatus.to_api_json` a valid
    status can have, from the Trainer API limits in :mod:`exporter_lib.status`.

    The widest character in that JSON is a C0 control (``\\u0001``: six bytes; any
    other character is at most four UTF-8 bytes or a two-byte escape).
    """
    widest = "\x01"
    metric = {"name": widest * METRIC_NAME_MAX_LENGTH, "value": widest * METRIC_VALUE_MAX_LENGTH}
    worst = TrainerStatus.from_api({
        "progressPercentage": PROGRESS_MAX, "estimatedRemainingSeconds": REMAINING_SECONDS_MAX,
        "metrics": [metric] * METRICS_MAX_ITEMS,
        "lastUpdatedTime": datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC)})
    return len(worst.to_api_json())


#: Largest value (UTF-8 bytes) a writer may store and a reader accepts: the largest
#: status JSON (module docstring, size).
TRAINER_STATUS_ANNOTATION_MAX_BYTES = largest_status_json_bytes()


def _check_size(size: int) -> None:
    """Raise StatusError naming ``size`` (bytes) and the bound when it is over."""
    if size > TRAINER_STATUS_ANNOTATION_MAX_BYTES:
        raise StatusError([
            f"annotation {TRAINER_STATUS_ANNOTATION}=<{size} bytes>: must be at most "
            f"{TRAINER_STATUS_ANNOTATION_MAX_BYTES} bytes"])


def encode_annotation(status: TrainerStatus) -> str:
    """The annotation value for ``status`` (compact JSON, see the module docstring).

    Raises:
        StatusError: the JSON is larger than :data:`TRAINER_STATUS_ANNOTATION_MAX_BYTES`
            (the message gives both sizes).  A valid :class:`TrainerStatus` never is;
            the check guards a change of the status limits that forgot this bound.
    """
    body = status.to_api_json()  # the Trainer API's fields only, as status.trainerStatus
    _check_size(len(body))
    return body.decode()


def decode_annotation(value: str) -> TrainerStatus:
    """Parse and validate an annotation value written by :func:`encode_annotation`.

    Annotations are not validated by the API server (unlike ``status.trainerStatus``,
    which the CRD schema checks), so every Trainer API limit is checked here.

    Raises:
        StatusError: too large, not a JSON object, or a field breaks a limit; the
            message starts with the annotation's name and names field, value and limit.
    """
    _check_size(len(value.encode()))
    try:
        return TrainerStatus.from_json(value)
    except StatusError as exc:
        raise StatusError([f"annotation {TRAINER_STATUS_ANNOTATION}: {p}"
                           for p in exc.problems]) from None


__all__ = [
    "KUBERNETES_ANNOTATIONS_MAX_BYTES",
    "TRAINER_STATUS_ANNOTATION",
    "TRAINER_STATUS_ANNOTATION_FORMAT",
    "TRAINER_STATUS_ANNOTATION_MAX_BYTES",
    "decode_annotation",
    "encode_annotation",
    "largest_status_json_bytes",
]
