"""Client side of trainjob-progress: the kubectl plugin and the notebook helpers.

Install with the ``client`` extra from a clone (``pip install -e '.[client]'``):

* ``kubectl trainjob progress|watch`` (console script ``kubectl-trainjob``,
  :mod:`trainjob_client.cli`);
* :func:`get_trainer_status` and :class:`ProgressCallback` for the Kubeflow SDK
  (:mod:`trainjob_client.sdk`);
* :mod:`trainjob_client.annotation`, the annotation that carries the trainer status on
  Trainer releases before v2.2 (defined in :mod:`exporter_lib.status_annotation`, which
  the scraper writes with).

Importing this package loads nothing beyond :mod:`trainjob_client.annotation`; the SDK
helpers are loaded on first use, so importing it needs none of the client's extras.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trainjob_client.annotation import (
    TRAINER_STATUS_ANNOTATION,
    TRAINER_STATUS_ANNOTATION_FORMAT,
    TRAINER_STATUS_ANNOTATION_MAX_BYTES,
    decode_annotation,
    encode_annotation,
)

if TYPE_CHECKING:
    from trainjob_client.sdk import ProgressCallback, get_trainer_status, read_progress

_LAZY = {"ProgressCallback", "get_trainer_status", "read_progress"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from trainjob_client import sdk

        return getattr(sdk, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "TRAINER_STATUS_ANNOTATION",
    "TRAINER_STATUS_ANNOTATION_FORMAT",
    "TRAINER_STATUS_ANNOTATION_MAX_BYTES",
    "ProgressCallback",
    "decode_annotation",
    "encode_annotation",
    "get_trainer_status",
    "read_progress",
]
