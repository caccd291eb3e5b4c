"""What each TrainJob holds, as last read: the status writer's view of the API.

A TrainJob is read on first use (GET), refreshed by the periodic list
(:meth:`TrainJobCache.resync`) and by every apply response.  (A later step makes
this an informer: list+watch instead of GET and periodic list.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kubernetes.client import CustomObjectsApi
from kubernetes.client.exceptions import ApiException

from exporter_lib.status import API_GROUP, API_VERSION, TRAINJOB_PLURAL, StatusError, TrainerStatus
from scraper.kube.calls import call
from scraper.kube.client import REQUEST_TIMEOUT

#: ``(namespace, name)`` of a TrainJob.
TrainJobKey = tuple[str, str]


class TrainJobGone(Exception):
    """The TrainJob does not exist (HTTP 404)."""


@dataclass
class Held:
    """What a TrainJob holds, as last read: its UID and trainerStatus (or None)."""

    uid: str
    status: TrainerStatus | None


def held_from_object(obj: dict[str, Any]) -> Held:
    """The :class:`Held` of a TrainJob dict (an unreadable trainerStatus counts as None)."""
    raw = (obj.get("status") or {}).get("trainerStatus")
    status = None
    if raw:
        try:
            status = TrainerStatus.from_api(raw)
        except StatusError:
            status = None
    return Held((obj.get("metadata") or {}).get("uid", ""), status)


class TrainJobCache:
    """The :class:`Held` of every TrainJob the scraper writes to."""

    def __init__(self, custom: CustomObjectsApi) -> None:
        self._custom = custom
        self._held: dict[TrainJobKey, Held] = {}

    def uid_of(self, namespace: str, name: str) -> str:
        """The TrainJob's UID if it was read, else ``""`` (no request)."""
        held = self._held.get((namespace, name))
        return held.uid if held else ""

    def store(self, namespace: str, name: str, obj: dict[str, Any]) -> None:
        """Keep what an API answer (e.g. an apply response) says the TrainJob holds."""
        self._held[(namespace, name)] = held_from_object(obj)

    def forget(self, namespace: str, name: str) -> None:
        """Drop what is known about a TrainJob."""
        self._held.pop((namespace, name), None)

    async def held(self, namespace: str, name: str) -> Held:
        """What the TrainJob holds (GET on first use, then cached).

        Raises:
            TrainJobGone: the TrainJob does not exist.
            ApiException: any other API error.
        """
        key = (namespace, name)
        if key not in self._held:
            try:
                obj = await call(self._custom.get_namespaced_custom_object, API_GROUP,
                                 API_VERSION, namespace, TRAINJOB_PLURAL, name,
                                 _request_timeout=REQUEST_TIMEOUT)
            except ApiException as exc:
                if exc.status == 404:
                    raise TrainJobGone(f"{namespace}/{name}") from None
                raise
            self._held[key] = held_from_object(obj)
        return self._held[key]

    async def resync(self, namespaces: list[str]) -> set[TrainJobKey]:
        """List TrainJobs (all namespaces, or each given one) and refresh the cache.

        Returns:
            ``(namespace, name)`` of every TrainJob that exists; the others are forgotten.

        Raises:
            ApiException, urllib3 errors: the list failed (nothing is forgotten).
        """
        items: list[dict[str, Any]] = []
        if namespaces:
            for ns in namespaces:
                body = await call(self._custom.list_namespaced_custom_object, API_GROUP,
                                  API_VERSION, ns, TRAINJOB_PLURAL,
                                  _request_timeout=REQUEST_TIMEOUT)
                items.extend(body.get("items") or [])
        else:
            body = await call(self._custom.list_cluster_custom_object, API_GROUP, API_VERSION,
                              TRAINJOB_PLURAL, _request_timeout=REQUEST_TIMEOUT)
            items = body.get("items") or []
        exists = set()
        for obj in items:
            meta = obj.get("metadata") or {}
            key = (meta.get("namespace", ""), meta.get("name", ""))
            exists.add(key)
            if key in self._held:
                self._held[key] = held_from_object(obj)
        for key in list(self._held):
            if key not in exists:
                self.forget(*key)
        return exists
