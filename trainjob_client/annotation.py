"""The TrainJob annotation that carries the trainer status on Trainer releases before v2.2.

Its name, format, size limit, encoder and decoder are defined once, in
:mod:`exporter_lib.status_annotation` (the scraper writes with the same code the
readers here decode with); this module is the client's name for them.
"""

from __future__ import annotations

from exporter_lib.status_annotation import (
    TRAINER_STATUS_ANNOTATION,
    TRAINER_STATUS_ANNOTATION_FORMAT,
    TRAINER_STATUS_ANNOTATION_MAX_BYTES,
    decode_annotation,
    encode_annotation,
)

__all__ = [
    "TRAINER_STATUS_ANNOTATION",
    "TRAINER_STATUS_ANNOTATION_FORMAT",
    "TRAINER_STATUS_ANNOTATION_MAX_BYTES",
    "decode_annotation",
    "encode_annotation",
]
