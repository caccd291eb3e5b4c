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
* not in a terminal phase (``Succeeded``, ``Failed``): its IP may already be reused.

The answer arrived before the read.  A pod's IP stays its own for the pod's life, so a
pod that was the target when it was scraped and still is at the read held the address
all along, and answered (two live pods known at one address are refused earlier:
:class:`scraper.shared.scrapes.SharedAddress`).  Anything else, a failed read included,
is a mismatch: the status is not written (the next scrape tries again) and the pod
watch relists.  The read is made by the writer tasks (:mod:`scraper.write.worker`) for a
write that will be sent, after the decision, so its cost is one GET per write of such
a target: a status coalesced in the write queue or found unchanged reads nothing.
"""

from __future__ import annotations

import enum
import ipaddress
import logging
from urllib.parse import urlsplit

import urllib3
from kubernetes.client import CoreV1Api
from kubernetes.client.exceptions import ApiException

from scraper.kube.calls import call
from scraper.kube.client import REQUEST_TIMEOUT
from scraper.shared.targets import Target

__all__ = ["PodCheck", "PodConfirmer", "check_pod"]

log = logging.getLogger(__name__)

#: Phases after which a pod's IP may be another pod's.
TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})


class PodCheck(enum.Enum):
    """What the read of a target's pod found."""

    CONFIRMED = "confirmed"
    GONE = "gone"  #: 404
    REPLACED = "replaced"  #: another UID under the name
    MOVED = "moved"  #: another (or no) pod IP
    ENDED = "ended"  #: a terminal phase
    UNREAD = "unread"  #: the read failed


def _same_host(a: str | None, b: str | None) -> bool:
    if not a or not b:
        return False
    try:
        return ipaddress.ip_address(a) == ipaddress.ip_address(b)
    except ValueError:
        return a == b


def check_pod(target: Target, uid: str | None, pod_ip: str | None,
              phase: str | None) -> PodCheck:
    """The verdict for a pod read with ``uid``, ``pod_ip`` and ``phase`` (module doc)."""
    if uid != target.pod_uid:
        return PodCheck.REPLACED
    if not _same_host(pod_ip, urlsplit(target.url).hostname):
        return PodCheck.MOVED
    if phase in TERMINAL_PHASES:
        return PodCheck.ENDED
    return PodCheck.CONFIRMED


class PodConfirmer:
    """Reads a target's pod and checks it (module doc).

    Args:
        core: the API client of the reads.
    """

    def __init__(self, core: CoreV1Api) -> None:
        self._core = core

    async def __call__(self, target: Target) -> PodCheck:
        """One GET of ``target``'s pod; its :class:`PodCheck`.  Never raises for an API
        error (:attr:`PodCheck.UNREAD`)."""
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
        return check_pod(target, meta.uid if meta else None,
                         status.pod_ip if status else None, status.phase if status else None)
