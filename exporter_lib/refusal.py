"""A refused HTTP request, answered as the Kubernetes API server answers errors.

Every request the exporter refuses (a malformed request, a limit, a refused push)
ends in one :class:`Refused`: an HTTP status code, a ``meta/v1`` ``Status`` body with a
``reason`` (the Kubernetes ``StatusReason`` where one exists, else a name of the same
style, e.g. ``RequestHeaderFieldsTooLarge``) and a message naming the field, the value
and the limit.  The same ``reason`` labels ``trainjob_exporter_http_refused_total``.
"""

from __future__ import annotations

import json
from http import HTTPStatus
from typing import Any

from exporter_lib.status import API_GROUP, TRAINJOB_PLURAL


class Refused(Exception):
    """A refused request: HTTP ``code``, ``reason``, ``message`` and field ``causes``.

    ``unread_body`` says the request body was not consumed (the server drains it,
    bounded, before answering, and closes the connection); ``close`` asks the
    server to close the connection after the answer.
    """

    def __init__(self, code: HTTPStatus, reason: str, message: str,
                 causes: list[dict[str, str]] | None = None, unread_body: bool = False,
                 close: bool = False) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.causes = causes or []
        self.unread_body = unread_body
        self.close = close or unread_body

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
