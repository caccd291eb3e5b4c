"""What each TrainJob stores: the TrainJob informer's store.

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
* ``on_change(namespace, name, record)``: its status or annotation changed (the drift check,
  :meth:`scraper.write.writer.StatusWriter.on_trainjob_change`);
* ``on_seen(key)``: after every watch event of a TrainJob, whatever changed (a label is
  enough), with its ``(namespace, name)``, and after every list and relist with None, once
  the store holds what it brought: the owner-chain checks waiting on a TrainJob run again
  (:class:`scraper.discovery.identity.ChainWaits`: otherwise a TrainJob list answering
  after the pod list leaves pods waiting forever, because the checks that ran during
  the list still saw the store unlisted; docs/decisions.md, "Owner-chain checks run
  again after every list").

Who wrote each place (docs/scraper.md, "Other writers and time"): the field manager
owning ``f:status.f:trainerStatus`` (for the annotation, its key) in
``metadata.managedFields``, with that entry's ``time`` (the API server's clock, whole
seconds), kept as a :class:`Writer`.  When several managers own part of it (SSA shares
a field two managers applied with the same value), the owner of ``lastUpdatedTime`` (a
writer sends it with every report, so it changes hands with every write) wins, then the
latest ``time``.  A tie left after that (two managers co-own ``lastUpdatedTime`` with
entries of the same second) cannot be settled from the object: a list or a first event
gives it to a manager that is not ours (the safe side: a write of the other writer's is
never taken for ours), an apply answer gives it to ours (nothing was written between
our write and its answer), and later events keep whichever of the tied managers the
store already record while the content stays the same (:attr:`Writer.tied`).
:func:`slim_trainjob` keeps only those entries' manager, time and ownership of the two
places (the rest of ``managedFields`` is most of an object's bytes). :attr:`Writer.seen`
is when this scraper saw that write: the store's monotonic clock when a watch event (or
an apply answer) delivered it; for a write first seen in a list (or a GET), its
``time``'s age on the scraper's wall clock (at least 0) before now.

resourceVersions are compared as integers to skip a watch event older than an apply
answer already stored: kube-apiserver's resourceVersions are etcd revisions, which only
grow.  When one does not parse as an integer, nothing is skipped.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from exporter_lib.status import StatusError, TrainerStatus
from exporter_lib.status_annotation import TRAINER_STATUS_ANNOTATION, decode_annotation
from scraper.kube.informer import ScopesListed
from scraper.shared.policy import overrides_of

#: The stall annotations of a TrainJob (scraper/stall/rule.py).
STALL_AFTER_ANNOTATION = "trainjob-progress.dev/stall-after"
STALLED_SINCE_ANNOTATION = "trainjob-progress.dev/stalled-since"
#: The status source annotation (pods and TrainJobs; scraper/scrape/sources.py).
SOURCE_ANNOTATION = "trainjob-progress.dev/source"

#: ``(namespace, name)`` of a TrainJob.
TrainJobKey = tuple[str, str]

#: The scraper's field manager (its status writes and annotation writes).
OUR_FIELD_MANAGER = "trainjob-scraper"
_ANNOTATION_KEY = f"f:{TRAINER_STATUS_ANNOTATION}"


@dataclass(frozen=True)
class Writer:
    """Who last wrote one place of a TrainJob (module doc).

    Attributes:
        manager: the field manager (``trainjob-scraper`` is ours).
        time: its managedFields ``time``, epoch seconds of the API server's clock
            (0.0 when absent).
        seen: monotonic seconds (the store's clock) when this scraper saw that write.
    """

    manager: str
    time: float
    seen: float = 0.0
    #: Every manager whose entry ties with this one (itself included): same ownership
    #: of ``lastUpdatedTime``, same ``time`` (module doc).
    tied: frozenset[str] = field(default=frozenset(), compare=False)

    @property
    def ours(self) -> bool:
        """True for this scraper's own field manager."""
        return self.manager == OUR_FIELD_MANAGER

    def same_write(self, other: Writer | None) -> bool:
        """True when ``other`` is the same write (manager and time), whenever seen."""
        return other is not None and (self.manager, self.time) == (other.manager, other.time)


class TrainJobGone(Exception):
    """The TrainJob does not exist (or not with the UID the write was meant for)."""


@dataclass(frozen=True)
class TrainJobRecord:
    """What a TrainJob stores, as last read.

    Attributes:
        uid: the object's UID.
        status: its trainerStatus (None when absent or unreadable).
        resource_version: the resourceVersion it was read at.
        annotated: the trainer status in its annotation (None when absent or invalid).
        source: its ``trainjob-progress.dev/source`` annotation (None when absent): the
            status source of its pods that do not name their own (scraper/scrape/sources.py).
        status_by: who wrote ``status.trainerStatus`` (None: nobody owns it).
        annotated_by: who wrote the annotation (None: nobody owns it).
        policy: its write-policy annotations as found (:mod:`scraper.shared.policy`).
        suspended: its ``spec.suspend`` is true (a queue such as Kueue holds it).
        stall_after: its ``trainjob-progress.dev/stall-after`` annotation as written
            (None when absent; scraper/stall/rule.py).
        stalled_since: its ``trainjob-progress.dev/stalled-since`` annotation (None when
            absent; written by this scraper, scraper/stall/watch.py).
    """

    uid: str
    status: TrainerStatus | None
    resource_version: str = ""
    annotated: TrainerStatus | None = None
    source: str | None = None
    status_by: Writer | None = None
    annotated_by: Writer | None = None
    policy: tuple[tuple[str, str], ...] = ()
    suspended: bool = False
    stall_after: str | None = None
    stalled_since: str | None = None


def _epoch(stamp: Any) -> float:
    """RFC 3339 ``stamp`` (a managedFields ``time``) as epoch seconds; 0.0 if unreadable."""
    if not isinstance(stamp, str) or not stamp:
        return 0.0
    try:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


def _owned(entry: dict[str, Any]) -> tuple[dict[str, Any] | None, bool]:
    """``(its trainerStatus fieldset or None, owns the annotation)`` of one managedFields
    entry."""
    fields = entry.get("fieldsV1") or {}
    if not isinstance(fields, dict):
        return None, False
    status = (fields.get("f:status") or {}).get("f:trainerStatus")
    annotations = (fields.get("f:metadata") or {}).get("f:annotations") or {}
    return (status if isinstance(status, dict) else None), _ANNOTATION_KEY in annotations


def writers_of(managed: Any, seen: float = 0.0, *, prefer: str | None = None,
               ) -> tuple[Writer | None, Writer | None]:
    """``(writer of status.trainerStatus, writer of the annotation)`` from a
    ``metadata.managedFields`` list (module doc for the choice); ``seen`` goes into both.

    ``prefer`` names the manager a tie goes to when it is one of the tied (an apply
    answer: the manager that just wrote); otherwise a tie goes to a manager that is not
    ours.
    """
    status: list[tuple[bool, float, str]] = []
    annotation: list[tuple[bool, float, str]] = []
    for entry in managed if isinstance(managed, list) else ():
        if not isinstance(entry, dict):
            continue
        manager = str(entry.get("manager", ""))
        at = _epoch(entry.get("time"))
        fieldset, annotated = _owned(entry)
        if fieldset is not None:
            status.append(("f:lastUpdatedTime" in fieldset, at, manager))
        if annotated:
            annotation.append((True, at, manager))
    out: list[Writer | None] = []
    for found in (status, annotation):
        if not found:
            out.append(None)
            continue
        top = max((owns, at) for owns, at, _ in found)
        tied = frozenset(m for owns, at, m in found if (owns, at) == top)
        winner = (prefer if prefer in tied else
                  max(tied, key=lambda m: (m != OUR_FIELD_MANAGER, m)))
        out.append(Writer(winner, top[1], seen, tied))
    return out[0], out[1]


def slim_trainjob(obj: dict[str, Any]) -> dict[str, Any]:
    """``obj`` with ``metadata.managedFields`` cut to what :func:`writers_of` reads: the
    entries owning trainerStatus or the annotation, each with its manager, time and
    those fields only (in place; returns ``obj``)."""
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        return obj
    kept = []
    for entry in meta.pop("managedFields", None) or ():
        if not isinstance(entry, dict):
            continue
        fieldset, annotated = _owned(entry)
        if fieldset is None and not annotated:
            continue
        fields: dict[str, Any] = {}
        if fieldset is not None:
            fields["f:status"] = {"f:trainerStatus": {
                k: {} for k in fieldset if k == "f:lastUpdatedTime"}}
        if annotated:
            fields["f:metadata"] = {"f:annotations": {_ANNOTATION_KEY: {}}}
        kept.append({"manager": entry.get("manager", ""), "time": entry.get("time"),
                     "fieldsV1": fields})
    if kept:
        meta["managedFields"] = kept
    return obj


def record_from_object(obj: dict[str, Any]) -> TrainJobRecord:
    """The :class:`TrainJobRecord` of a TrainJob dict (an unreadable trainerStatus or annotation
    counts as None: a write then replaces it)."""
    meta = obj.get("metadata") or {}
    status = _readable(TrainerStatus.from_api, (obj.get("status") or {}).get("trainerStatus"))
    annotated = _readable(decode_annotation,
                          (meta.get("annotations") or {}).get(TRAINER_STATUS_ANNOTATION))
    annotations = meta.get("annotations") or {}
    source = annotations.get(SOURCE_ANNOTATION)
    status_by, annotated_by = writers_of(meta.get("managedFields"))
    stall_after, stalled_since = (annotations.get(STALL_AFTER_ANNOTATION),
                                  annotations.get(STALLED_SINCE_ANNOTATION))
    return TrainJobRecord(meta.get("uid", ""), status, meta.get("resourceVersion", ""), annotated,
                str(source).lower() if source else None, status_by, annotated_by,
                overrides_of(meta.get("annotations")),
                suspended=(obj.get("spec") or {}).get("suspend") is True,
                stall_after=None if stall_after is None else str(stall_after),
                stalled_since=None if stalled_since is None else str(stalled_since))


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
    """The :class:`TrainJobRecord` of every TrainJob in scope, fed by list+watch.

    Args:
        scopes: the namespaces listed (None: all); :meth:`wait_synced` waits for each.
        clock: monotonic seconds (:attr:`Writer.seen`).
        wall: epoch seconds (the age of a write first seen in a list).
        on_gone, on_seen: the callbacks of the module doc (``on_change`` listeners are
            added with :meth:`on_changed`).
    """

    def __init__(self, scopes: list[str | None], *,
                 clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time,
                 on_gone: Callable[[str, str, str], None] = lambda namespace, name, uid: None,
                 on_seen: Callable[[TrainJobKey | None], None] = lambda key: None) -> None:
        self.clock = clock
        self.wall = wall
        self._records: dict[TrainJobKey, TrainJobRecord] = {}
        self._listed = ScopesListed(scopes)
        self.synced = self._listed.event
        self._on_gone = on_gone
        self._on_change: list[Callable[[str, str, TrainJobRecord], None]] = []
        self._on_seen = on_seen

    def __len__(self) -> int:
        return len(self._records)

    def on_changed(self, listener: Callable[[str, str, TrainJobRecord], None]) -> None:
        """Call ``listener(namespace, name, record)`` whenever a TrainJob's status or
        annotation changes (``on_change`` of the module doc; the writer's drift check)."""
        self._on_change.append(listener)

    def get(self, namespace: str, name: str) -> TrainJobRecord | None:
        """What the TrainJob stores; None when it does not exist (or before the first list)."""
        return self._records.get((namespace, name))

    def items(self) -> list[tuple[TrainJobKey, TrainJobRecord]]:
        """Every TrainJob record now, as ``((namespace, name), record)`` pairs (a copy)."""
        return list(self._records.items())

    def uid_of(self, namespace: str, name: str) -> str:
        """The TrainJob's UID, or ``""`` when unknown."""
        record = self._records.get((namespace, name))
        return record.uid if record else ""

    def source_of(self, namespace: str, name: str) -> str | None:
        """The TrainJob's source annotation as found, None when unknown or not set."""
        record = self._records.get((namespace, name))
        return record.source if record is not None else None

    async def record(self, namespace: str, name: str) -> TrainJobRecord:
        """What the TrainJob stores, once every scope was listed.

        Raises:
            TrainJobGone: the TrainJob does not exist.
        """
        await self.synced.wait()
        record = self._records.get((namespace, name))
        if record is None:
            raise TrainJobGone(f"{namespace}/{name}")
        return record

    def store(self, namespace: str, name: str, obj: dict[str, Any]) -> None:
        """Keep what an API answer (e.g. a GET) says the TrainJob stores (its writes not
        seen before are aged by their managedFields time, as in a list)."""
        key = (namespace, name)
        self.keep(namespace, name, self._seen(self._records.get(key), record_from_object(obj),
                                              listed=True))

    def keep(self, namespace: str, name: str, new: TrainJobRecord) -> None:
        """Keep ``new`` as what the TrainJob stores (an apply's result), unless the store
        already has a newer resourceVersion of the same object."""
        old = self._records.get((namespace, name))
        if old is not None and old.uid == new.uid and older(new.resource_version,
                                                              old.resource_version):
            return
        self._records[(namespace, name)] = new

    def _seen(self, old: TrainJobRecord | None, new: TrainJobRecord, *,
              listed: bool) -> TrainJobRecord:
        """``new`` with :attr:`Writer.seen` set: kept from ``old`` for the same write,
        else now (a watch event) or now minus the write's age (``listed``)."""
        if old is not None and old.uid != new.uid:
            old = None
        now = self.clock()

        def seen(was: Writer | None, writer: Writer | None, changed: bool) -> Writer | None:
            if writer is None:
                return None
            # The same entry (manager, time) is the same write, unless the content changed:
            # two writes within one second of the API server's clock share a time.
            if writer.same_write(was) and not changed:
                assert was is not None
                return replace(writer, seen=was.seen)
            # A tie the store already settled (an apply answer, then its own watch event)
            # stays settled while nobody changed the content.
            if (was is not None and not changed and was.time == writer.time
                    and was.manager in writer.tied):
                return replace(writer, manager=was.manager, seen=was.seen)
            if not listed or not writer.time:
                return replace(writer, seen=now)
            return replace(writer, seen=now - max(0.0, self.wall() - writer.time))

        return replace(
            new,
            status_by=seen(old.status_by if old else None, new.status_by,
                           old is None or old.status != new.status),
            annotated_by=seen(old.annotated_by if old else None, new.annotated_by,
                              old is None or old.annotated != new.annotated))

    # -- informer callbacks (event loop)

    def on_list(self, scope: str | None, objs: list[dict[str, Any]]) -> None:
        """A full list of ``scope``: replace that scope's part of the store."""
        listed = {_key(o): record_from_object(o) for o in objs}
        for key, record in list(self._records.items()):
            if scope is not None and key[0] != scope:
                continue
            new = listed.get(key)
            if new is None or new.uid != record.uid:
                del self._records[key]
                self._on_gone(key[0], key[1], record.uid)
        for key, new in listed.items():
            self._update(key, new, listed=True)
        self._listed.listed(scope)
        self._on_seen(None)

    def on_event(self, kind: str, obj: dict[str, Any]) -> None:
        """One watch event."""
        key = _key(obj)
        new = record_from_object(obj)
        old = self._records.get(key)
        if kind == "DELETED":
            if old is not None and old.uid == new.uid:
                del self._records[key]
                self._on_gone(key[0], key[1], old.uid)
        else:
            if old is not None and old.uid != new.uid:
                del self._records[key]
                self._on_gone(key[0], key[1], old.uid)
            self._update(key, new)
        self._on_seen(key)

    def _update(self, key: TrainJobKey, new: TrainJobRecord, *, listed: bool = False) -> None:
        old = self._records.get(key)
        if old is not None and old.uid == new.uid and older(new.resource_version,
                                                              old.resource_version):
            return  # an event older than an apply answer already kept
        new = self._seen(old, new, listed=listed)
        self._records[key] = new
        if (old is None or old.uid != new.uid or old.status != new.status
                or old.annotated != new.annotated):
            for listener in self._on_change:
                listener(key[0], key[1], new)
