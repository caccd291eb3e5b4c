"""Compatibility with code written for the push design (KEP-2779's status server).

Facts about the clients (read from their sources: the Kubeflow SDK's
``kubeflow.trainer.update_trainjob_status`` and Transformers'
``integrations.KubeflowCallback``):

* both ``POST`` JSON ``{"trainerStatus": {...}}`` to the URL in
  ``KUBEFLOW_TRAINER_SERVER_URL`` exactly as given (full path, any scheme);
* both send ``Authorization: Bearer <token>``, the token being the stripped
  contents of the file named by ``KUBEFLOW_TRAINER_SERVER_TOKEN``; without a
  readable token they send nothing;
* ``KUBEFLOW_TRAINER_SERVER_CA_CERT`` is optional (only used for https);
* both treat only HTTP 200 as success and throttle to one update per 5 s.

:func:`enable_push_compat` points those variables at the local exporter over
loopback http, with a fresh random token in a 0600 file that the endpoint
checks.  Without a configured token the endpoint refuses every push (403):
an open write endpoint on the pod network would let anyone set the status.
"""

from __future__ import annotations

import atexit
import contextlib
import hmac
import json
import os
import re
import secrets
import stat
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from http import HTTPStatus
from typing import Protocol

from exporter_lib.files import write_atomic
from exporter_lib.identity import TrainJobRef, parse_status_path, status_path
from exporter_lib.refusal import Refused
from exporter_lib.status import (
    MAX_STATUS_JSON_BYTES,
    StatusError,
    TrainerStatus,
    parse_json_object,
)

__all__ = ["ENV_CA_CERT", "ENV_SERVER_URL", "ENV_TOKEN_PATH", "MAX_BODY_BYTES", "PushEndpoint",
           "PushError", "Replaceable", "TokenFile", "parse_push", "status_path"]

ENV_SERVER_URL = "KUBEFLOW_TRAINER_SERVER_URL"
ENV_TOKEN_PATH = "KUBEFLOW_TRAINER_SERVER_TOKEN"
ENV_CA_CERT = "KUBEFLOW_TRAINER_SERVER_CA_CERT"

#: Largest accepted body (see :data:`exporter_lib.status.MAX_STATUS_JSON_BYTES`).
MAX_BODY_BYTES = MAX_STATUS_JSON_BYTES


class PushError(Refused):
    """A refused push (a :class:`~exporter_lib.refusal.Refused` with a Kubernetes Status body)."""


class Replaceable(Protocol):
    """Where pushed statuses go (:class:`~exporter_lib.state.State`)."""

    def replace(self, status: TrainerStatus, stamp: float | None = None) -> None:
        """Make ``status`` the whole current status."""

class PushEndpoint:
    """Validates pushed statuses and applies them to a :class:`~exporter_lib.state.State`.

    ``token`` returns the expected bearer token, or ``None`` when pushing is not
    enabled; ``trainjob`` returns this pod's TrainJob as far as it is known
    (:func:`exporter_lib.identity.pod_trainjob`).  The server calls :meth:`check`
    with the request head, reads the body only when it passes, then :meth:`apply`.
    """

    def __init__(self, state: Replaceable, token: Callable[[], str | None],
                 trainjob: Callable[[], TrainJobRef]) -> None:
        self._state = state
        self._token = token
        self._trainjob = trainjob

    def check(self, path: str, authorization: str | None, content_type: str | None,
              content_length: str | None) -> int:
        """Check a ``POST``'s head; returns the body length to read.

        Raises:
            PushError: 404 unknown path, 403 pushing not enabled or a TrainJob other
                than this pod's, 401 wrong token, 411/413 missing or too large
                ``Content-Length``, 415 not JSON.  All with ``unread_body``.
        """
        target = parse_status_path(path)
        if target is None:
            raise PushError(HTTPStatus.NOT_FOUND, "NotFound", f"no such path: {path[:200]!r}",
                            unread_body=True)
        expected = self._token()
        if expected is None:
            raise PushError(HTTPStatus.FORBIDDEN, "Forbidden",
                            "push compatibility is not enabled on this exporter "
                            "(call exporter_lib.enable_push_compat())", unread_body=True)
        given = (authorization or "").removeprefix("Bearer ").strip()
        if not hmac.compare_digest(given.encode("utf-8", "replace"), expected.encode()):
            raise PushError(HTTPStatus.UNAUTHORIZED, "Unauthorized",
                            "missing or wrong bearer token", unread_body=True)
        own = self._trainjob()
        if not own.allows(*target):
            raise PushError(HTTPStatus.FORBIDDEN, "Forbidden",
                            f"trainjobs {target[1]!r} in namespace {target[0]!r}: this exporter "
                            f"reports for TrainJob {own.describe()} only (from "
                            f"{own.source or 'the service account namespace'})",
                            unread_body=True)
        length = _length(content_length)
        media = (content_type or "").split(";")[0].strip().lower()
        if media != "application/json":
            raise PushError(HTTPStatus.UNSUPPORTED_MEDIA_TYPE, "UnsupportedMediaType",
                            f"Content-Type must be application/json, got {media or 'none'!r}",
                            unread_body=True)
        return length

    def apply(self, raw: bytes) -> bytes:
        """Validate a body that passed :meth:`check` and apply it; returns the 200 body.

        Raises:
            PushError: 400 malformed body, 422 a field breaks a Trainer API limit.
        """
        arrived = time.time()
        status = parse_push(raw, arrived)
        self._state.replace(status, arrived)
        # Answer with what was stored, as the API server answers with the object it
        # kept: metrics are a map by name here, so of repeated names the last one wins,
        # and lastUpdatedTime is the arrival time (whole seconds, as the API keeps it).
        by_name = {m.name: m for m in status.metrics}
        kept = status.model_copy(update={
            "metrics": tuple(by_name.values()),
            "last_updated_time": datetime.fromtimestamp(arrived, UTC).replace(microsecond=0)})
        return json.dumps({"trainerStatus": kept.to_api()}).encode()


def parse_push(raw: bytes, arrived: float | None = None) -> TrainerStatus:
    """Validate a push body ``{"trainerStatus": {...}}``.

    ``lastUpdatedTime`` may be left out when ``arrived`` (unix seconds) is given: the
    exporter keeps the arrival time anyway (the clients' clocks are not ours to trust),
    so requiring it would refuse a status for a field that is then replaced.

    Raises:
        PushError: 400 not a JSON object with a ``trainerStatus`` object (rules of
            :func:`exporter_lib.status.parse_json_object`: size, UTF-8, nesting, no NaN),
            422 a field breaks a limit (one cause per field, naming value and limit).
    """
    try:
        data = parse_json_object(raw)
    except StatusError as exc:
        raise PushError(HTTPStatus.BAD_REQUEST, "BadRequest", str(exc)) from None
    if not isinstance(data.get("trainerStatus"), dict):
        raise PushError(HTTPStatus.BAD_REQUEST, "BadRequest",
                        'body must be a JSON object {"trainerStatus": {...}}')
    fields = data["trainerStatus"]
    if arrived is not None and "lastUpdatedTime" not in fields:
        fields = {**fields, "lastUpdatedTime": datetime.fromtimestamp(arrived, UTC)}
    try:
        return TrainerStatus.from_api(fields)
    except StatusError as exc:
        causes = [{"reason": "FieldValueInvalid", "field": "trainerStatus." + p.split("=")[0],
                   "message": p} for p in exc.problems]
        raise PushError(HTTPStatus.UNPROCESSABLE_ENTITY, "Invalid",
                        f"TrainJob status is invalid: {exc}", causes) from None


def _length(header: str | None) -> int:
    if header is None:
        raise PushError(HTTPStatus.LENGTH_REQUIRED, "LengthRequired",
                        "Content-Length is required", unread_body=True)
    if not header.isdigit() or not header.isascii():
        raise PushError(HTTPStatus.BAD_REQUEST, "BadRequest",
                        f"bad Content-Length {header[:40]!r}", unread_body=True)
    length = int(header)
    if length > MAX_BODY_BYTES:
        raise PushError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "RequestEntityTooLarge",
                        f"body of {length} bytes exceeds the limit of {MAX_BODY_BYTES}",
                        unread_body=True)
    return length


def _remove_quietly(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


class TokenFile:
    """A random bearer token kept in a private file; created on first use, thread-safe.

    ``mode`` is the file's permission bits (default 0600: the owner only; a sidecar
    whose trainer runs as another UID of the pod's ``fsGroup`` uses 0640).  A file at
    a given path is written atomically (temp file in the same directory + rename), so
    a reader sees no token or the whole token, never a part.
    """

    def __init__(self, path: str | None = None, mode: int = 0o600, *,
                 keep_existing: bool = False) -> None:
        self._lock = threading.Lock()
        self._path = path
        self._mode = mode
        self._token: str | None = None
        # A restarted sidecar finds the token it wrote on the pod's emptyDir: keeping it
        # spares the trainer's clients (Transformers caches a token for 5 minutes) 401s.
        self._keep_existing = keep_existing

    def ensure(self) -> str:
        """Create the token file if needed and return its path.

        Raises:
            OSError: the file cannot be written (only for a path given by the caller).
        """
        with self._lock:
            if self._token is None:
                token = secrets.token_urlsafe(32)
                if self._path is None:
                    fd, self._path = tempfile.mkstemp(prefix="trainjob-exporter-", suffix=".token")
                    # Ours to remove: a token left in /tmp would outlive the process it guards.
                    atexit.register(_remove_quietly, self._path)
                    with os.fdopen(fd, "w") as handle:
                        handle.write(token)
                else:
                    kept = _kept_token(self._path, self._mode) if self._keep_existing else None
                    if kept is not None:
                        token = kept
                    else:
                        write_atomic(self._path, token.encode(), self._mode)
                self._token = token
            assert self._path is not None
            return self._path

    def use_path(self, path: str, mode: int | None = None) -> None:
        """Keep the token in ``path`` (with ``mode``) instead of a new temp file.

        Only before :meth:`ensure`; later calls change nothing.
        """
        with self._lock:
            if self._token is None:
                self._path = path
                if mode is not None:
                    self._mode = mode

    def token(self) -> str | None:
        """The expected token, or ``None`` before :meth:`ensure`."""
        return self._token


#: What :func:`secrets.token_urlsafe` (32 bytes) writes: anything else is not ours to keep.
_OUR_TOKEN = re.compile(r"[A-Za-z0-9_-]{43}")


def _kept_token(path: str, mode: int) -> str | None:
    """The token in ``path`` when it is one we wrote: a regular file of this UID, exactly
    ``mode``, holding one token of our form; else ``None`` (then a fresh one is written)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    with os.fdopen(fd) as handle:
        info = os.fstat(handle.fileno())
        if (not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid()
                or stat.S_IMODE(info.st_mode) != mode):
            return None
        text = handle.read(64)
    return text if _OUR_TOKEN.fullmatch(text) else None
