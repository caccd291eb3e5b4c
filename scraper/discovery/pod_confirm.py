"""Confirm a target's pod before a status that stated no pod identity is written.

An exporter that states no pod (plain JSON or text from any language: no
``Trainjob-Exporter-Pod`` header) answers for whatever pod has the address.  When the
pod watch lags, a target can still name a pod that is gone while its IP went to a new
pod of another TrainJob: the new pod's status would land on the old TrainJob.  So
right before such a status is sent, :class:`PodConfirmer` reads the pod once from the
API server (a GET without ``resourceVersion`` is served from etcd, not from the watch
cache: Kubernetes API concepts, "Resource versions", semantics of get) and confirms:

* the same UID as the target's pod (a pod re-created under the same name is another);
* ``status.podIP`` still the target's host;
* not in a terminal phase (``Succeeded``, ``Failed``): its IP may already be reused;
  unless its containers ended no earlier than the second the answer arrived in
  (``state.terminated.finishedAt``, whole seconds): the pod held the address until
  then, so the last status of a training whose pod ended while the status waited in
  the write queue is still written.  The residual risk is an address handed to a new
  pod whose exporter answered within that same second (and the clock skew between
  the node and the scraper): a new pod's sandbox and containers have to start first.

The answer arrived before the read.  A pod's IP stays its own for the pod's life, so a
pod that was the target when it was scraped and still is at the read held the address
all along, and answered (two live pods known at one address are refused earlier:
:class:`scraper.shared.scrapes.SharedAddress`).  Anything else is a mismatch: the
status is not written (the next scrape tries again) and the pod watch relists.  A
failed read (:attr:`PodCheck.UNREAD`) proves nothing either way: the status stays
queued and is tried again, as after a failed write, and the watch relists.  The read is
made by the writer tasks (:mod:`scraper.write.worker`, :mod:`scraper.write.pod_gate`)
for a try that will be sent, after the decision, so its cost is one GET per try of such
a target: a status coalesced in the write queue or found unchanged reads nothing.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

import urllib3
from kubernetes.client import CoreV1Api
from kubernetes.client.exceptions import ApiException

from scraper.kube.calls import call
from scraper.kube.client import REQUEST_TIMEOUT
from scraper.shared.pod_check import PodCheck, check_pod
from scraper.shared.targets import Target

__all__ = ["PodConfirmer", "containers_ended_at"]

log = logging.getLogger(__name__)

def containers_ended_at(statuses: list[Any] | None) -> float | None:
    """The latest ``state.terminated.finishedAt`` of ``statuses`` (``V1ContainerStatus``
    objects of the official client), epoch seconds; None when none ended."""
    ends = [s.state.terminated.finished_at for s in statuses or ()
            if s.state is not None and s.state.terminated is not None
            and isinstance(s.state.terminated.finished_at, datetime)]
    return max(end.timestamp() for end in ends) if ends else None


class PodConfirmer:
    """Reads a target's pod and checks it (module doc).

    Args:
        core: the API client of the reads.
    """

    def __init__(self, core: CoreV1Api) -> None:
        self._core = core

    async def __call__(self, target: Target, answered_at: float | None) -> PodCheck:
        """One GET of ``target``'s pod; its :class:`PodCheck` for an answer that arrived
        at ``answered_at`` (epoch seconds; None: unknown, an ended pod is ``ENDED``).
        Never raises for an API error (:attr:`PodCheck.UNREAD`)."""
        try:
            pod = await call(self._core.read_namespaced_pod, target.pod_name,
                             target.namespace, _request_timeout=REQUEST_TIMEOUT)
        except ApiException as exc:
            if exc.status == 404:
                return PodCheck.GONE
            log.info("target %s: its pod could not be read to confirm it (HTTP %s)",
                     target.key, exc.status)
            return PodCheck.UNREAD
        except (urllib3.exceptions.HTTPError, ConnectionError, TimeoutError) as exc:
            log.info("target %s: its pod could not be read to confirm it (%s)",
                     target.key, type(exc).__name__)
            return PodCheck.UNREAD
        meta, status = pod.metadata, pod.status
        if status is None:
            return check_pod(target, meta.uid if meta else None, None, None)
        return check_pod(target, meta.uid if meta else None, status.pod_ip, status.phase,
                         ended_at=containers_ended_at([*(status.container_statuses or ()),
                                                       *(status.init_container_statuses or ())]),
                         answered_at=answered_at)
