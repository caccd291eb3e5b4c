"""What each TrainJob holds: the TrainJob informer's store.

One list+watch of TrainJobs per scope (all namespaces, or each of ``--namespaces``;
:class:`scraper.kube.informer.ListWatch`) keeps, per TrainJob, its UID, its
``status.trainerStatus``, the trainer status in its annotation
(:mod:`exporter_lib.status_annotation`, written by ``--status-target annotation|auto``)
and the resourceVersion it was read at.  One list at start
(no GET per TrainJob), every change by any writer seen at once, 410 relists.  Apply
answers update the store too (they are newer than the watch event they cause).

Callbacks (on the event loop):

* ``on_gone(namespace, name, uid)``: a TrainJob was deleted, or is absent from a
  relist, or came back with another UID (re-created: the old object is gone);
* ``on_change(namespace, name, held)``: its status or annotation changed (the drift check,
  :meth:`scraper.status_writer.StatusWriter.on_trainjob_change`);
* ``on_seen(key)``: after every watch event of a TrainJob, whatever changed (a label is
  enough), with its ``(namespace, name)``, and after every list and relist with None, once
  the store holds what it brought: the owner-chain checks waiting on a TrainJob run again
  (:class:`scraper.identity.ChainWaits`, issue 21 input 1: a TrainJob list answering after
  the pod list left pods waiting forever, because the checks that ran during the list
  still saw the store unlisted).

resourceVersions are compared as integers to skip a watch event older than an apply
answer already stored: kube-apiserver's resourceVersions are etcd revisions, which
only grow.  When one does not parse as an integer, nothing is skipped.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from exporter_lib.status import StatusError, TrainerStatus
from exporter_lib.status_annotation import TRAINER_STATUS_ANNOTATION, decode_annotation
from scraper.kube.informer import ScopesListed

#: The status source annotation (pods and TrainJobs; scraper/sources.py).
SOURCE_ANNOTATION = "trainjob-progress.dev/source"

#: ``(namespace, name)`` of a TrainJob.
TrainJobKey = tuple[str, str]


class TrainJobGone(Exception):
    """The TrainJob does not exist (or not with the UID the write was meant for)."""


@dataclass(frozen=True)
class Held:
    """What a TrainJob holds, as last read.

    Attributes:
        uid: the object's UID.
        status: its trainerStatus (None when absent or unreadable).
        resource_version: the resourceVersion it was read at.
        annotated: the trainer status in its annotation (None when absent or invalid).
        source: its ``trainjob-progress.dev/source`` annotation (None when absent): the
            status source of its pods that do not name their own (scraper/sources.py).
    """

    uid: str
    status: TrainerStatus | None
    resource_version: str = ""
    annotated: TrainerStatus | None = None
    source: str | None = None


def held_from_object(obj: dict[str, Any]) -> Held:
    """The :class:`Held` of a TrainJob dict (an unreadable trainerStatus or annotation
    counts as None: a write then replaces it)."""
    meta = obj.get("metadata") or {}
    status = _readable(TrainerStatus.from_api, (obj.get("status") or {}).get("trainerStatus"))
    annotated = _readable(decode_annotation,
                          (meta.get("annotations") or {}).get(TRAINER_STATUS_ANNOTATION))
    source = (meta.get("annotations") or {}).get(SOURCE_ANNOTATION)
    return Held(meta.get("uid", ""), status, meta.get("resourceVersion", ""), annotated,
                str(source).lower() if source else None)


def _readable(parse: Callable[[Any], TrainerStatus], raw: Any) -> TrainerStatus | None:
    """``parse(raw)``; None when ``raw`` is empty or not a valid status."""
    if not raw:
        return None
    try:
        return parse(raw)
    except StatusError:
        return None


def older(a: str, b: str) -> bool:
    """True when resourceVersion ``a`` is known to be older than ``b`` (module doc)."""
    try:
        return int(a) < int(b)
    except ValueError:
        return False


def _key(obj: dict[str, Any]) -> TrainJobKey:
    meta = obj.get("metadata") or {}
    return (meta.get("namespace", ""), meta.get("name", ""))


class TrainJobStore:
    """The :class:`Held` of every TrainJob in scope, fed by list+watch.

    Args:
        scopes: the namespaces listed (None: all); :meth:`wait_synced` waits for each.
    """

    def __init__(self, scopes: list[str | None]) -> None:
        self._held: dict[TrainJobKey, Held] = {}
        self._listed = ScopesListed(scopes)
        self.synced = self._listed.event
        self.on_gone: Callable[[str, str, str], None] = lambda namespace, name, uid: None
        self.on_change: Callable[[str, str, Held], None] = lambda namespace, name, held: None
        self.on_seen: Callable[[TrainJobKey | None], None] = lambda key: None

    def __len__(self) -> int:
        return len(self._held)

    def get(self, namespace: str, name: str) -> Held | None:
        """What the TrainJob holds; None when it does not exist (or before the first list)."""
        return self._held.get((namespace, name))

    def uid_of(self, namespace: str, name: str) -> str:
        """The TrainJob's UID, or ``""`` when unknown."""
        held = self._held.get((namespace, name))
        return held.uid if held else ""

    async def held(self, namespace: str, name: str) -> Held:
        """What the TrainJob holds, once every scope was listed.

        Raises:
            TrainJobGone: the TrainJob does not exist.
        """
        await self.synced.wait()
        held = self._held.get((namespace, name))
        if held is None:
            raise TrainJobGone(f"{namespace}/{name}")
        return held

    def store(self, namespace: str, name: str, obj: dict[str, Any]) -> None:
        """Keep what an API answer (e.g. a GET) says the TrainJob holds."""
        self.keep(namespace, name, held_from_object(obj))

    def keep(self, namespace: str, name: str, new: Held) -> None:
        """Keep ``new`` as what the TrainJob holds (an apply's result), unless the store
        already has a newer resourceVersion of the same object."""
        old = self._held.get((namespace, name))
        if old is not None and old.uid == new.uid and older(new.resource_version,
                                                              old.resource_version):
            return
        self._held[(namespace, name)] = new

    # -- informer callbacks (event loop)

    def on_list(self, scope: str | None, objs: list[dict[str, Any]]) -> None:
        """A full list of ``scope``: replace that scope's part of the store."""
        listed = {_key(o): held_from_object(o) for o in objs}
        for key, held in list(self._held.items()):
            if scope is not None and key[0] != scope:
                continue
            new = listed.get(key)
            if new is None or new.uid != held.uid:
                del self._held[key]
                self.on_gone(key[0], key[1], held.uid)
        for key, new in listed.items():
            self._update(key, new)
        self._listed.listed(scope)
        self.on_seen(None)

    def on_event(self, kind: str, obj: dict[str, Any]) -> None:
        """One watch event."""
        key = _key(obj)
        new = held_from_object(obj)
        old = self._held.get(key)
        if kind == "DELETED":
            if old is not None and old.uid == new.uid:
                del self._held[key]
                self.on_gone(key[0], key[1], old.uid)
        else:
            if old is not None and old.uid != new.uid:
                del self._held[key]
                self.on_gone(key[0], key[1], old.uid)
            self._update(key, new)
        self.on_seen(key)

    def _update(self, key: TrainJobKey, new: Held) -> None:
        old = self._held.get(key)
        if old is not None and old.uid == new.uid and older(new.resource_version,
                                                              old.resource_version):
            return  # an event older than an apply answer already kept
        self._held[key] = new
        if (old is None or old.uid != new.uid or old.status != new.status
                or old.annotated != new.annotated):
            self.on_change(key[0], key[1], new)
