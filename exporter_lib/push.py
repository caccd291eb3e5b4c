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
import tempfile
import threading
from collections.abc import Callable
from http import HTTPStatus
from typing import Any, Protocol

from exporter_lib.status import API_GROUP, API_VERSION, TRAINJOB_PLURAL, StatusError, TrainerStatus

ENV_SERVER_URL = "KUBEFLOW_TRAINER_SERVER_URL"
ENV_TOKEN_PATH = "KUBEFLOW_TRAINER_SERVER_TOKEN"
ENV_CA_CERT = "KUBEFLOW_TRAINER_SERVER_CA_CERT"

#: Largest accepted body: 256 metrics of 64+64 characters, each escaped as
#: ``\\uXXXX\\uXXXX`` (12 bytes) in the worst case, plus framing, is under 400 KiB.
MAX_BODY_BYTES = 512 * 1024

STATUS_PATH = re.compile(
    rf"^/apis/{re.escape(API_GROUP)}/{API_VERSION}/namespaces/([a-z0-9.-]{{1,253}})/"
    rf"{TRAINJOB_PLURAL}/([a-z0-9.-]{{1,253}})/status/?$")


def status_path(namespace: str, name: str) -> str:
    """The push design's status URL path for one TrainJob."""
    return f"/apis/{API_GROUP}/{API_VERSION}/namespaces/{namespace}/{TRAINJOB_PLURAL}/{name}/status"


class PushError(Exception):
    """A refused push: HTTP ``code``, Kubernetes ``reason``, ``message`` and field causes."""

    def __init__(self, code: HTTPStatus, reason: str, message: str,
                 causes: list[dict[str, str]] | None = None, unread_body: bool = False) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.causes = causes or []
        self.unread_body = unread_body

    def body(self) -> bytes:
        """A ``meta/v1`` ``Status`` object, as the Kubernetes API server answers errors."""
        status: dict[str, Any] = {
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": self.message, "reason": self.reason, "code": int(self.code),
        }
        if self.causes:
            status["details"] = {"group": API_GROUP, "kind": TRAINJOB_PLURAL,
                                 "causes": self.causes}
        return json.dumps(status).encode()


class BinaryReader(Protocol):
    """A readable byte stream (the request body)."""

    def read(self, size: int, /) -> bytes:
        """Read up to ``size`` bytes."""


class Replaceable(Protocol):
    """Where pushed statuses go (:class:`~exporter_lib.state.State`)."""

    def replace(self, status: TrainerStatus, stamp: float | None = None) -> None:
        """Make ``status`` the whole current status."""


class PushEndpoint:
    """Validates pushed statuses and applies them to a :class:`~exporter_lib.state.State`.

    ``token`` returns the expected bearer token, or ``None`` when pushing is not enabled.
    """

    def __init__(self, state: Replaceable, token: Callable[[], str | None]) -> None:
        self._state = state
        self._token = token

    def handle(self, path: str, authorization: str | None, content_type: str | None,
               content_length: str | None, body: BinaryReader) -> bytes:
        """Apply one ``POST``; returns the 200 body.

        Raises:
            PushError: 404 unknown path, 403 pushing not enabled, 401 wrong token,
                411/413 missing or too large ``Content-Length``, 415 not JSON,
                400 malformed body, 422 a field breaks a Trainer API limit.
        """
        if not STATUS_PATH.match(path):
            raise PushError(HTTPStatus.NOT_FOUND, "NotFound", f"no such path: {path[:200]}",
                            unread_body=True)
        expected = self._token()
        if expected is None:
            raise PushError(HTTPStatus.FORBIDDEN, "Forbidden",
                            "push compatibility is not enabled on this exporter "
                            "(call exporter_lib.enable_push_compat())", unread_body=True)
        given = (authorization or "").removeprefix("Bearer ").strip()
        if not hmac.compare_digest(given.encode(), expected.encode()):
            raise PushError(HTTPStatus.UNAUTHORIZED, "Unauthorized",
                            "missing or wrong bearer token", unread_body=True)
        length = _length(content_length)
        media = (content_type or "").split(";")[0].strip().lower()
        if media != "application/json":
            raise PushError(HTTPStatus.UNSUPPORTED_MEDIA_TYPE, "UnsupportedMediaType",
                            f"Content-Type must be application/json, got {media or 'none'!r}",
                            unread_body=True)
        raw = body.read(length)
        status = parse_push(raw)
        self._state.replace(status)
        return json.dumps({"trainerStatus": status.to_api()}).encode()


def parse_push(raw: bytes) -> TrainerStatus:
    """Validate a push body ``{"trainerStatus": {...}}``.

    Raises:
        PushError: 400 not a JSON object with a ``trainerStatus`` object,
            422 a field breaks a limit (one cause per field, naming value and limit).
    """
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise PushError(HTTPStatus.BAD_REQUEST, "BadRequest", f"body is not JSON: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("trainerStatus"), dict):
        raise PushError(HTTPStatus.BAD_REQUEST, "BadRequest",
                        'body must be a JSON object {"trainerStatus": {...}}')
    try:
        return TrainerStatus.from_api(data["trainerStatus"])
    except StatusError as exc:
        causes = [{"reason": "FieldValueInvalid", "field": "trainerStatus." + p.split("=")[0],
                   "message": p} for p in exc.problems]
        raise PushError(HTTPStatus.UNPROCESSABLE_ENTITY, "Invalid",
                        f"TrainJob status is invalid: {exc}", causes) from None


def _length(header: str | None) -> int:
    if header is None:
        raise PushError(HTTPStatus.LENGTH_REQUIRED, "BadRequest", "Content-Length is required",
                        unread_body=True)
    try:
        length = int(header)
    except ValueError:
        raise PushError(HTTPStatus.BAD_REQUEST, "BadRequest", "bad Content-Length",
                        unread_body=True) from None
    if length < 0 or length > MAX_BODY_BYTES:
        raise PushError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "RequestEntityTooLarge",
                        f"body of {length} bytes exceeds the limit of {MAX_BODY_BYTES}",
                        unread_body=True)
    return length


def _remove_quietly(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


class TokenFile:
    """A random bearer token kept in a private file; created on first use, thread-safe."""

    def __init__(self, path: str | None = None) -> None:
        self._lock = threading.Lock()
        self._path = path
        self._token: str | None = None

    def ensure(self) -> str:
        """Create the token file if needed (mode 0600) and return its path."""
        with self._lock:
            if self._token is None:
                token = secrets.token_urlsafe(32)
                if self._path is None:
                    fd, self._path = tempfile.mkstemp(prefix="trainjob-exporter-", suffix=".token")
                    # Ours to remove: a token left in /tmp would outlive the process it guards.
                    atexit.register(_remove_quietly, self._path)
                else:
                    fd = os.open(self._path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                with os.fdopen(fd, "w") as handle:
                    handle.write(token)
                self._token = token
            assert self._path is not None
            return self._path

    def token(self) -> str | None:
        """The expected token, or ``None`` before :meth:`ensure`."""
        return self._token
