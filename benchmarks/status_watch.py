"""A watch of the TrainJobs of one namespace in a thread, for the benchmark harnesses."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from kubernetes import client, watch

from exporter_lib.status import API_GROUP, API_VERSION, TRAINJOB_PLURAL

#: ``(seen at: wall seconds, TrainJob name, its status.trainerStatus or {})``.
OnWrite = Callable[[float, str, Mapping[str, Any]], None]


class TrainJobWatch:
    """Calls ``on_write`` for every MODIFIED event of a TrainJob in ``namespace``.

    Each watch request resumes from the last resourceVersion seen, so a write between
    two requests is not lost in a re-list's ADDED events (which are not writes); a 410
    or a dropped connection starts over.  A request lasts ``request_seconds``: the
    longest :meth:`stop` waits for a quiet watch to notice.
    """

    def __init__(self, api: client.ApiClient, namespace: str, on_write: OnWrite,
                 request_seconds: int = 30) -> None:
        self._on_write = on_write
        self._request_seconds = request_seconds
        self._watch = watch.Watch()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(api, namespace), daemon=True)
        self._thread.start()

    def _run(self, api: client.ApiClient, namespace: str) -> None:
        custom = client.CustomObjectsApi(api)
        rv: str | None = None
        while not self._stop.is_set():
            try:
                for event in self._watch.stream(
                        custom.list_namespaced_custom_object, API_GROUP, API_VERSION,
                        namespace, TRAINJOB_PLURAL, timeout_seconds=self._request_seconds,
                        **({"resource_version": rv} if rv else {})):
                    now = time.time()
                    obj = event["object"]
                    rv = (obj.get("metadata") or {}).get("resourceVersion") or rv
                    if event["type"] == "MODIFIED":
                        self._on_write(now, obj["metadata"]["name"],
                                       (obj.get("status") or {}).get("trainerStatus") or {})
                    if self._stop.is_set():
                        break
            except Exception:  # 410 Gone or a dropped connection: start over
                rv = None
                time.sleep(0.2)

    def stop(self) -> None:
        """Stop the watch and wait for its thread (at most one watch request)."""
        self._stop.set()
        self._watch.stop()
        self._thread.join(timeout=self._request_seconds + 5)
