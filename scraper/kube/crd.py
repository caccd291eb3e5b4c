"""Whether the TrainJob CRD can store ``status.trainerStatus``.

Read from the CRD's schema when the scraper may read CRDs
(:meth:`CrdSupport.check`); otherwise the status writer learns it from an apply's
answer and reports it here (:meth:`CrdSupport.mark_unsupported`).  Either way one
actionable ERROR log line, or, when the writer has a fallback place
(``--status-target annotation|auto``: the annotation), one WARNING line naming it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable
from typing import Any

import urllib3
from kubernetes.client import ApiextensionsV1Api
from kubernetes.client.exceptions import ApiException

from exporter_lib.status import API_GROUP, API_VERSION, TRAINJOB_PLURAL
from scraper.kube.calls import call
from scraper.kube.client import REQUEST_TIMEOUT

log = logging.getLogger(__name__)

CRD_NAME = f"{TRAINJOB_PLURAL}.{API_GROUP}"
REASON_UNSUPPORTED = "TrainerStatusUnsupported"
#: After a pruned write with an unreadable CRD, how long before writes are tried again.
UNSUPPORTED_RECHECK_SECONDS = 300.0


def schema_has_trainer_status(crd: dict[str, Any]) -> bool:
    """True when the CRD's served v1alpha1 schema keeps ``status.trainerStatus``."""
    for version in (crd.get("spec") or {}).get("versions") or []:
        if version.get("name") != API_VERSION:
            continue
        schema = ((version.get("schema") or {}).get("openAPIV3Schema")) or {}
        status = (schema.get("properties") or {}).get("status") or {}
        if status.get("x-kubernetes-preserve-unknown-fields"):
            return True
        return "trainerStatus" in (status.get("properties") or {})
    return False


class CrdSupport:
    """What is known of the TrainJob CRD.

    Attributes:
        supported: None while unknown; False when the CRD cannot store trainerStatus
            (or does not exist); True once it is known to store it.

    Args:
        ext: the client's ApiextensionsV1Api.
        on_supported: called when support is (re)established (e.g. to clear
            per-TrainJob "unsupported" notices).
        fallback: where statuses go instead while the CRD lacks the field (for the
            log lines; ``""``: nowhere).
        clock: monotonic seconds.
    """

    def __init__(self, ext: ApiextensionsV1Api, *,
                 on_supported: Callable[[], None] = lambda: None,
                 fallback: str = "",
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._ext = ext
        self._on_supported = on_supported
        self.fallback = fallback
        self._clock = clock
        self.supported: bool | None = None
        self._unsupported_since = 0.0

    def recheck_due(self) -> bool:
        """True when a write may be tried although the CRD was found unsupported."""
        return self._clock() - self._unsupported_since > UNSUPPORTED_RECHECK_SECONDS

    async def check(self) -> bool | None:
        """Read the TrainJob CRD; set and return :attr:`supported` (None if unreadable)."""
        try:
            resp = await call(self._ext.read_custom_resource_definition, CRD_NAME,
                              _preload_content=False, _request_timeout=REQUEST_TIMEOUT)
        except ApiException as exc:
            if exc.status == 404:
                log.error("CRD %s not found: install Kubeflow Trainer (TrainJob CRD); "
                          "no status can be written until it exists", CRD_NAME)
                self.supported = False
                self._unsupported_since = self._clock()
                return False
            log.info("cannot read CRD %s (HTTP %s); will detect a missing trainerStatus "
                     "from apply responses", CRD_NAME, exc.status)
            return None
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            log.warning("cannot read CRD %s (%s); will retry", CRD_NAME, exc)
            return None
        try:
            crd = json.loads(resp.data)
        except ValueError:  # not JSON: whatever answered is no API server (a proxy page)
            log.warning("cannot read CRD %s (the answer is not JSON: %r); will retry",
                        CRD_NAME, bytes(resp.data[:80]))
            return None
        ok = schema_has_trainer_status(crd)
        if not ok:
            self.mark_unsupported("its openAPIV3Schema has no status.trainerStatus")
        elif self.supported is False:
            log.info("CRD %s now has status.trainerStatus: writing statuses there again%s",
                     CRD_NAME, f" (instead of {self.fallback})" if self.fallback else "")
        if ok:
            self.mark_supported()
        return ok

    async def recheck_every(self, seconds: float) -> None:
        """Read the CRD again every ``seconds`` while it is unsupported or unread (a
        root task: runs until cancelled; :meth:`check` logs what it learns)."""
        while True:
            await asyncio.sleep(seconds)
            if self.supported is not True:
                with contextlib.suppress(Exception):
                    await self.check()

    def mark_supported(self) -> None:
        """The CRD stores trainerStatus (a schema or an apply response showed it)."""
        self.supported = True
        self._on_supported()

    def mark_unsupported(self, evidence: str) -> None:
        """The CRD cannot store trainerStatus; ``evidence`` says how that was learnt."""
        if self.supported is not False and self.fallback:
            log.warning(
                "TrainJob CRD %s (%s) cannot store status.trainerStatus: %s. The trainer "
                "status is written to %s.",
                CRD_NAME, API_VERSION, evidence, self.fallback,
            )
        elif self.supported is not False:
            log.error(
                "TrainJob CRD %s (%s) cannot store status.trainerStatus: %s, so the API "
                "server prunes every write. Upgrade the Kubeflow Trainer CRDs to a release "
                "whose TrainJob status has trainerStatus, or run the scraper with "
                "--status-target auto; until then no status is written "
                "(a Warning Event %s is recorded on each TrainJob).",
                CRD_NAME, API_VERSION, evidence, REASON_UNSUPPORTED,
            )
        self.supported = False
        self._unsupported_since = self._clock()
