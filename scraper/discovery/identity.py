"""Which TrainJob object a pod belongs to, and which one pod is a TrainJob's target.

**Ownership**: a pod reports for TrainJob ``T`` only when the
controllers' ownership chain leads there::

    Pod -controller ownerRef-> Job -controller ownerRef-> JobSet -controller ownerRef-> TrainJob

every link by UID, all in the pod's namespace, the TrainJob's name equal to the pod's
``jobset.sigs.k8s.io/jobset-name`` label and its UID the one the TrainJob informer
holds now.  Jobs and JobSets come from list+watch (:class:`OwnerIndex`, fed by
:class:`scraper.kube.informer.ListWatch`; Jobs filtered server-side by the JobSet
label): three lists at start whatever the number of TrainJobs, no GET per pod.  A
stale pod of a deleted TrainJob whose name was reused, or a hand-made pod naming
another object, fails the check and is never a target.

**Convergence**: the four kinds are listed and watched
independently, so a pod may be seen before its Job, JobSet or TrainJob, and a TrainJob
list may come seconds after the pod list.  Every verdict short of :class:`Belongs`
names the chain :data:`Link` s it looked at; :class:`ChainWaits` keeps such a pod under
each of them, and the pod is checked again when any of those objects is added,
changed or deleted (any change: a label is enough) and after every list and relist of
any kind (a list replaces what was known without an event per object).  A pod that
failed the check (:class:`Foreign`) is kept too: an owner chain can become valid later,
e.g. when the TrainJob watch is behind and still holds the UID of a TrainJob that was
re-created.  So the targets end the same whatever order the lists and events came in.

**One target per TrainJob**: among the verified Running pods of a
TrainJob the target is the one with the highest :func:`rank`: a live pod beats a
terminating one (``deletionTimestamp`` set), then the highest
``jobset.sigs.k8s.io/restart-attempt`` wins, then the newest ``creationTimestamp``,
then the pod name (deterministic).  A final status of a pod is applied unless another
known pod of the TrainJob has a higher restart attempt (an old attempt's end never
overwrites the new attempt's progress).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from scraper.kube.informer import ScopesListed
from scraper.shared.trainjobs import TrainJobStore

LABEL_JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"
LABEL_RESTART_ATTEMPT = "jobset.sigs.k8s.io/restart-attempt"

#: One link of an owner chain: ``("Job", uid)``, ``("JobSet", uid)`` or
#: ``("TrainJob", "namespace/name")`` (a TrainJob is looked up by name, then its UID
#: compared).
Link = tuple[Literal["Job", "JobSet", "TrainJob"], str]


@dataclass(frozen=True)
class Owned:
    """A Job or JobSet: where it is and who controls it (kind, name, UID; "" if none)."""

    namespace: str
    name: str
    owner_kind: str
    owner_name: str
    owner_uid: str


def controller_of(meta: Mapping[str, Any]) -> tuple[str, str, str]:
    """``(kind, name, uid)`` of the controller ownerReference, ``("", "", "")`` if none."""
    for ref in meta.get("ownerReferences") or []:
        if ref.get("controller"):
            return (ref.get("kind", ""), ref.get("name", ""), ref.get("uid", ""))
    return ("", "", "")


class OwnerIndex:
    """Jobs (or JobSets) by UID, fed by list+watch.

    ``on_change(link)`` runs after each watch event with the object's :data:`Link`, and
    after each list with None (anything in the scope may have changed).

    Args:
        scopes: the namespaces listed (None: all); :attr:`synced` once each was.
        kind: ``"Job"`` or ``"JobSet"``, the kind of the links reported.
        on_change: called as above (on the event loop).
    """

    def __init__(self, scopes: list[str | None],
                 kind: Literal["Job", "JobSet"] = "Job", *,
                 on_change: Callable[[Link | None], None] = lambda link: None) -> None:
        self._by_uid: dict[str, Owned] = {}
        self._listed = ScopesListed(scopes)
        self._kind: Literal["Job", "JobSet"] = kind
        self.synced = self._listed.event
        self._on_change = on_change

    def __len__(self) -> int:
        return len(self._by_uid)

    def get(self, uid: str) -> Owned | None:
        """The object with that UID, if listed or watched."""
        return self._by_uid.get(uid)

    @staticmethod
    def _owned(obj: Mapping[str, Any]) -> tuple[str, Owned]:
        meta = obj.get("metadata") or {}
        kind, name, uid = controller_of(meta)
        return meta.get("uid", ""), Owned(meta.get("namespace", ""), meta.get("name", ""),
                                          kind, name, uid)

    def on_list(self, scope: str | None, objs: list[dict[str, Any]]) -> None:
        """A full list of ``scope``."""
        for uid, owned in list(self._by_uid.items()):
            if scope is None or owned.namespace == scope:
                del self._by_uid[uid]
        for obj in objs:
            uid, owned = self._owned(obj)
            self._by_uid[uid] = owned
        self._listed.listed(scope)
        self._on_change(None)

    def on_event(self, kind: str, obj: dict[str, Any]) -> None:
        """One watch event."""
        uid, owned = self._owned(obj)
        if kind == "DELETED":
            self._by_uid.pop(uid, None)
        else:
            self._by_uid[uid] = owned
        self._on_change((self._kind, uid))


@dataclass(frozen=True)
class Belongs:
    """The chain holds: the pod reports for the TrainJob with ``trainjob_uid``."""

    trainjob_uid: str


@dataclass(frozen=True)
class NotYet:
    """A link is not known yet (informers still listing, or an object not delivered).

    Attributes:
        links: the chain links looked at (empty while still listing: every list counts).
        listing: True when some kind was not listed yet in every scope.
    """

    reason: str
    links: tuple[Link, ...] = ()
    listing: bool = False


@dataclass(frozen=True)
class Foreign:
    """The chain does not lead to the TrainJob the pod names: not a target while so.

    Attributes:
        links: the chain links looked at (a change to one of them may make it valid).
    """

    reason: str
    links: tuple[Link, ...] = ()


Verdict = Belongs | NotYet | Foreign


class Identity:
    """Checks the ownership chain of a pod (module doc).

    Args:
        jobs, jobsets: the owner indexes.
        trainjobs: the TrainJob informer's store.
    """

    def __init__(self, jobs: OwnerIndex, jobsets: OwnerIndex, trainjobs: TrainJobStore) -> None:
        self.jobs = jobs
        self.jobsets = jobsets
        self.trainjobs = trainjobs

    def synced(self) -> bool:
        """True once Jobs, JobSets and TrainJobs were listed in every scope."""
        return (self.jobs.synced.is_set() and self.jobsets.synced.is_set()
                and self.trainjobs.synced.is_set())

    def verify(self, pod: Mapping[str, Any]) -> Verdict:
        """The :data:`Verdict` for a pod (API JSON dict)."""
        if not self.synced():
            return NotYet("Jobs, JobSets and TrainJobs not listed yet", listing=True)
        meta = pod.get("metadata") or {}
        namespace = meta.get("namespace", "")
        trainjob = (meta.get("labels") or {}).get(LABEL_JOBSET_NAME, "")
        kind, name, job_uid = controller_of(meta)
        if kind != "Job":
            return Foreign("the pod has no controller Job (not created by a JobSet's Job)")
        links: tuple[Link, ...] = (("Job", job_uid),)
        job = self.jobs.get(job_uid)
        if job is None:
            return NotYet(f"Job {name} (UID {job_uid}) not known", links)
        if job.namespace != namespace or job.owner_kind != "JobSet":
            return Foreign(f"Job {name} is not controlled by a JobSet in {namespace}", links)
        links += (("JobSet", job.owner_uid),)
        jobset = self.jobsets.get(job.owner_uid)
        if jobset is None:
            return NotYet(f"JobSet {job.owner_name} (UID {job.owner_uid}) not known", links)
        if jobset.namespace != namespace or jobset.owner_kind != "TrainJob":
            return Foreign(f"JobSet {jobset.name} is not controlled by a TrainJob", links)
        if jobset.owner_name != trainjob:
            return Foreign(f"its JobSet {jobset.name} belongs to TrainJob {jobset.owner_name}, "
                           f"not to {trainjob} named by its {LABEL_JOBSET_NAME} label", links)
        links += (("TrainJob", f"{namespace}/{trainjob}"),)
        record = self.trainjobs.get(namespace, trainjob)
        if record is None:
            return NotYet(f"TrainJob {trainjob} not known", links)
        if record.uid != jobset.owner_uid:
            return Foreign(f"its owner chain leads to TrainJob UID {jobset.owner_uid}, but "
                           f"TrainJob {trainjob} is now UID {record.uid} (re-created)", links)
        return Belongs(record.uid)


@dataclass
class ChainWaits:
    """Pods whose owner chain did not verify yet, by the :data:`Link` s they wait on.

    Keyed by any string the caller chooses (the target manager: ``namespace/pod``).
    :meth:`due` says which pods to check again after a change (module doc).
    """

    _pods: dict[str, dict[str, Any]] = field(default_factory=dict)
    _links: dict[str, tuple[Link, ...]] = field(default_factory=dict)
    _by_link: dict[Link, set[str]] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self._pods)

    def __contains__(self, key: object) -> bool:
        return key in self._pods

    def sizes(self) -> dict[str, int]:
        """Entries of each map kept: pods, their links, pods by link."""
        return {"pods": len(self._pods), "links": len(self._links),
                "by_link": len(self._by_link)}

    def park(self, key: str, pod: dict[str, Any], links: tuple[Link, ...]) -> None:
        """Keep ``pod`` under ``key`` until one of ``links`` (or any list) changes."""
        self.release(key)
        self._pods[key] = pod
        self._links[key] = links
        for link in links:
            self._by_link.setdefault(link, set()).add(key)

    def release(self, key: str) -> None:
        """Forget the pod under ``key`` (verified, deleted, or no longer a candidate)."""
        self._pods.pop(key, None)
        for link in self._links.pop(key, ()):
            keys = self._by_link.get(link)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self._by_link[link]

    def due(self, link: Link | None) -> list[tuple[str, dict[str, Any]]]:
        """``(key, pod)`` of every pod waiting on ``link``; all of them for None (a list)."""
        keys = list(self._pods) if link is None else sorted(self._by_link.get(link, ()))
        return [(k, self._pods[k]) for k in keys]


def restart_attempt(pod: Mapping[str, Any]) -> int:
    """The pod's ``jobset.sigs.k8s.io/restart-attempt`` (0 when absent or not a number)."""
    value = ((pod.get("metadata") or {}).get("labels") or {}).get(LABEL_RESTART_ATTEMPT, "0")
    try:
        return int(value)
    except ValueError:
        return 0


def rank(pod: Mapping[str, Any]) -> tuple[int, int, str, str]:
    """Higher is the better target (module doc): live, attempt, creation time, name."""
    meta = pod.get("metadata") or {}
    live = 0 if meta.get("deletionTimestamp") else 1
    return (live, restart_attempt(pod), meta.get("creationTimestamp", ""), meta.get("name", ""))
