"""What the scraper scrapes: one :class:`Target` per discovered trainer pod."""

from __future__ import annotations

from dataclasses import dataclass

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

