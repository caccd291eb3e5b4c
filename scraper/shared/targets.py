"""What discovery hands to the scrape stage: one :class:`Target` per trainer pod to
scrape, one :class:`Final` per pod that ended, through a :class:`TargetSink`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

#: Values of the ``trainjob-progress.dev/source`` annotation (scraper/scrape/sources.py).
SOURCE_EXPORTER, SOURCE_LOGS, SOURCE_AUTO = "exporter", "logs", "auto"
SOURCES = (SOURCE_EXPORTER, SOURCE_LOGS, SOURCE_AUTO)


@dataclass(frozen=True)
class Target:
    """One exporter endpoint and the TrainJob it reports for.

    Attributes:
        namespace: the pod's (and the TrainJob's) namespace.
        trainjob: the TrainJob name (from ``jobset.sigs.k8s.io/jobset-name``).
        pod_name: the pod's name.
        pod_uid: the pod's UID; a recreated pod with the same name is a new target.
        url: ``http://<pod IP>:<port><path>`` of the exporter.
        interval: scrape interval in seconds (1..3600).
        trainjob_uid: the UID of the TrainJob the pod's owner chain leads to
            (:mod:`scraper.discovery.identity`); ``""`` before it is verified.
        source: where the status comes from (:data:`SOURCES`, scraper/scrape/sources.py).
        log_container: the container whose log is read when the source is the log.
        hostname: the hostname the kubelet gives the pod's containers
            (:func:`exporter_lib.pod.kubelet_hostname`), compared with the one its
            exporter states; ``""`` when not known (not compared).
        policy: the pod's write-policy annotations as found, ``(name, value)`` pairs
            (validated where they are used: :class:`scraper.shared.policy.PolicyResolver`).
    """

    namespace: str
    trainjob: str
    pod_name: str
    pod_uid: str
    url: str
    interval: float
    trainjob_uid: str = ""
    source: str = SOURCE_EXPORTER
    log_container: str = ""
    hostname: str = ""
    policy: tuple[tuple[str, str], ...] = ()

    @property
    def key(self) -> str:
        """``namespace/pod``: the scheduling identity (one job per key)."""
        return f"{self.namespace}/{self.pod_name}"



@dataclass(frozen=True)
class Final:
    """The pod has ended: its final status may be in a termination message.

    Attributes:
        messages: ``(container name, message)`` pairs to try in order; empty when
            no container left one.
        trainjob_uid: the TrainJob UID of the pod's owner chain, once verified.
        finished_at: ``(container name, state.terminated.finishedAt as epoch seconds)``
            of the containers that left a message and say when they ended (the rule
            for other writers: a write after that delivered the final).
    """

    namespace: str
    trainjob: str
    pod_name: str
    pod_uid: str
    messages: tuple[tuple[str, str], ...]
    trainjob_uid: str = ""
    source: str = SOURCE_EXPORTER
    log_container: str = ""
    finished_at: tuple[tuple[str, float], ...] = ()

    def finished(self, container: str) -> float | None:
        """When ``container`` ended (epoch seconds), None when unknown."""
        return dict(self.finished_at).get(container)


#: How good a target a pod is, higher better (:func:`scraper.discovery.identity.rank`).
Rank = tuple[int, int, str, str]


@dataclass(frozen=True)
class Known:
    """What the scrape stage holds of one pod (:meth:`TargetSink.known`).

    Attributes:
        uid: the pod's UID.
        trainjob_uid: the verified TrainJob UID of its target, ``""`` when not scraped.
        ended: its end was handed over (:meth:`TargetSink.end` or
            :meth:`TargetSink.owe_final`).
    """

    uid: str
    trainjob_uid: str
    ended: bool


class TargetSink(Protocol):
    """Where discovery hands verified pods to (the scrape stage's target manager).

    Keys are ``namespace/pod``.  Discovery calls these only for pods whose owner chain
    verified; the sink starts, retargets and stops the per-target loops.
    """

    def known(self, key: str) -> Known | None:
        """What is held for ``key`` (None: nothing)."""
        ...

    def held_keys(self) -> list[str]:
        """Every key held."""
        ...

    def scrape(self, key: str, uid: str, target: Target, rank: Rank) -> None:
        """Scrape ``target`` (new, or the same pod with a changed target)."""
        ...

    def end(self, key: str, uid: str, final: Final, attempt: int) -> None:
        """The pod ended: stop scraping it; its final status is owed."""
        ...

    def drop(self, key: str, *, deleted: bool = False) -> None:
        """Forget ``key``; ``deleted``: the pod is gone (a final it owes is applied)."""
        ...

    def owe_final(self, final: Final, attempt: int, key: str | None = None) -> None:
        """A deleted pod's verified final is owed; ``key``'s state, if held, is dropped
        and carries it."""
        ...
