"""Wires discovery, scheduling, scraping, reconciliation, leadership and telemetry.

Lifecycle of :meth:`ScraperApp.run`:

1. serve ``/metrics``, ``/healthz``, ``/readyz``; check the TrainJob CRD;
2. list+watch pods (every replica, so a standby is warm and ready);
3. campaign for the Lease (or lead at once without leader election); while
   leading, every Running pod with an IP has a scheduled scrape job and every
   terminated pod's final status is applied once;
4. on stop (SIGTERM): stop scheduling, give in-flight writes
   ``shutdown_timeout`` seconds, release the Lease, close everything.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client as k8s
from kubernetes import config as k8s_config

from exporter_lib.status import StatusError, TrainerStatus
from scraper.config import ScraperSettings
from scraper.discovery import (
    Final,
    Ignore,
    PodEvent,
    PodWatcher,
    Scrape,
    Synced,
    Wait,
    WatchItem,
    classify,
    final_from_deleted,
    pod_key,
)
from scraper.leader import LeaseElector
from scraper.metrics_auth import MetricsAuth, metrics_auth_for
from scraper.reconcile import (
    REASON_FINAL_INVALID,
    REASON_INVALID,
    REASON_SCRAPE_FAILED,
    Reconciler,
    TrainJobGone,
    WriteOutcome,
)
from scraper.scheduling import TargetScheduler
from scraper.scraping import (
    Busy,
    ExporterScraper,
    Failure,
    FailureKind,
    Fresh,
    NothingYet,
    NotModified,
    ScrapeLimits,
)
from scraper.targets import Target
from scraper.telemetry import JobView, Telemetry

log = logging.getLogger(__name__)

#: The same failure on the same target is recorded as an Event at most this often.
EVENT_REPEAT_SECONDS = 600.0
CRD_RECHECK_SECONDS = 60.0


def load_kube_client(settings: ScraperSettings) -> k8s.ApiClient:
    """An ApiClient from ``--kubeconfig``, else in-cluster, else the default kubeconfig."""
    if settings.kubeconfig:
        return k8s_config.new_client_from_config(config_file=str(settings.kubeconfig))
    try:
        configuration = k8s.Configuration()
        k8s_config.load_incluster_config(client_configuration=configuration)
        return k8s.ApiClient(configuration)
    except k8s_config.ConfigException:
        return k8s_config.new_client_from_config()


@dataclass
class _TargetState:
    """Per-pod bookkeeping; ``view`` is what /metrics shows for its TrainJob."""

    view: JobView
    target: Target | None = None  # None once the pod ended
    uid: str = ""
    etag: str | None = None
    refused: int = 0  # consecutive not-instrumented failures
    next_try: float = 0.0  # monotonic time before which scrapes are skipped
    last_event: tuple[str, float] = ("", 0.0)
    finalized: bool = False
    final: Final | None = None  # set once the pod ended
    seen: float = field(default_factory=time.monotonic)


class ScraperApp:
    """The scraper service; one instance per process (or per test)."""

    def __init__(self, settings: ScraperSettings, api_client: k8s.ApiClient | None = None):
        self.settings = settings
        self.api = api_client or load_kube_client(settings)
        self.telemetry = Telemetry(self._views)
        # --- /metrics authentication (scraper/metrics_auth.py)
        self.metrics_auth: MetricsAuth | None = None
        if settings.metrics_auth:
            self.metrics_auth = metrics_auth_for(
                self.api, ttl=settings.metrics_auth_cache_ttl,
                size=settings.metrics_auth_cache_size, registry=self.telemetry.registry)
        # --- end /metrics authentication
        self._states: dict[str, _TargetState] = {}
        self._warned_pods: set[str] = set()  # uids of misconfigured pods already logged
        self._leading = not settings.leader_election
        self._elector: LeaseElector | None = None
        if settings.leader_election:
            self._elector = LeaseElector(
                self.api,
                namespace=settings.effective_lease_namespace(),
                name=settings.lease_name,
                identity=settings.identity,
                lease_duration=settings.lease_duration,
                renew_deadline=settings.renew_deadline,
                retry_period=settings.retry_period,
                on_change=self._on_leadership,
            )
        self.reconciler = Reconciler(
            self.api,
            identity=settings.identity,
            qps=settings.write_qps,
            burst=settings.write_burst,
            attempts=settings.write_attempts,
            may_write=self._may_write,
            on_write=lambda outcome: self.telemetry.writes.labels(outcome.value).inc(),
        )
        self.scheduler = TargetScheduler(
            self._scrape, on_skipped=lambda key: self.telemetry.skipped_runs.inc())
        self._scraper: ExporterScraper | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._synced_scopes: set[str | None] = set()

    # ------------------------------------------------------------ lifecycle

    async def run(self, stop: asyncio.Event) -> None:
        """Run until ``stop`` is set, then shut down in order (see module doc)."""
        s = self.settings
        guard = [self.metrics_auth.middleware] if self.metrics_auth else []
        port = await self.telemetry.start(s.listen_host, s.listen_port, middlewares=guard)
        log.info("serving /metrics, /healthz, /readyz on %s:%d", s.listen_host, port)
        if self.metrics_auth is None:
            log.warning("/metrics is open to anyone who reaches %s:%d (metrics_auth=false)",
                        s.listen_host, port)
        else:
            log.info("/metrics needs a bearer token allowed to get /metrics (TokenReview "
                     "and SubjectAccessReview, decisions cached %gs)",
                     s.metrics_auth_cache_ttl)
        self._scraper = ExporterScraper(
            ScrapeLimits(s.scrape_timeout, s.max_body_bytes, s.concurrency),
            observe=self.telemetry.scrape_duration.observe,
        )
        self.telemetry.leader.set(1 if self._leading else 0)
        await self.reconciler.check_crd()
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[WatchItem] = asyncio.Queue(maxsize=1000)
        core = k8s.CoreV1Api(self.api)
        scopes: list[str | None] = list(s.namespaces) or [None]
        watchers = [
            PodWatcher(core, namespace=ns, selector=s.selector, queue=queue, loop=loop,
                       on_restart=self._watch_restarted)
            for ns in scopes
        ]
        self.scheduler.start()
        for w in watchers:
            w.start()
        self._spawn(self._consume(queue))
        self._spawn(self._maintenance())
        elector_task = asyncio.create_task(self._elector.run()) if self._elector else None
        log.info("trainjob-scraper started: selector %r, namespaces %s, interval %gs%s",
                 s.selector, ",".join(s.namespaces) or "all", s.interval,
                 ", leader election on" if self._elector else "")
        try:
            await stop.wait()
        finally:
            log.info("stopping: no new scrapes; waiting up to %gs for in-flight writes",
                     s.shutdown_timeout)
            self._leading = False  # closes the write fence for anything not yet started
            # Wait for in-flight writes before shutting the scheduler down: its
            # shutdown cancels the running scrape jobs, and so the writes inside them.
            # Meanwhile jobs that fire return at once (not leading).
            drained = await self.reconciler.drain(s.shutdown_timeout)
            if not drained:
                log.warning("in-flight status writes did not finish within %gs",
                            s.shutdown_timeout)
            self.scheduler.shutdown()
            for t in list(self._tasks):
                t.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            if elector_task is not None:
                elector_task.cancel()
                await asyncio.gather(elector_task, return_exceptions=True)
            for w in watchers:
                await asyncio.to_thread(w.stop, 1.0)
            await self._scraper.close()
            await self.telemetry.stop()
            log.info("stopped")

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _watch_restarted(self, reason: str) -> None:
        # Called from a watch thread; prometheus-client counters are thread-safe.
        self.telemetry.watch_restarts.labels(reason).inc()

    # ------------------------------------------------------------ leadership

    def _may_write(self) -> bool:
        if self._elector is None:
            return self._leading
        return self._leading and self._elector.may_write()

    def _on_leadership(self, leading: bool) -> None:
        self._leading = leading
        self.telemetry.leader.set(1 if leading else 0)
        if leading:
            for state in self._states.values():
                if state.target is not None:
                    self.scheduler.schedule(state.target)
                elif state.final is not None and not state.finalized:
                    state.finalized = True
                    self._spawn(self._finalize(state.final, state))
        else:
            for key in self.scheduler.scheduled_keys():
                self.scheduler.unschedule(key)
        self.telemetry.targets.set(len(self.scheduler.scheduled_keys()))

    # ------------------------------------------------------------ discovery

    async def _consume(self, queue: asyncio.Queue[WatchItem]) -> None:
        while True:
            item = await queue.get()
            try:
                if isinstance(item, Synced):
                    self._on_synced(item)
                elif isinstance(item, PodEvent):
                    self._on_pod(item.pod, deleted=item.kind == "DELETED")
            except Exception:
                log.exception("handling a pod watch item failed")
            self.telemetry.targets.set(len(self.scheduler.scheduled_keys()))

    def _on_synced(self, item: Synced) -> None:
        listed = {pod_key(p) for p in item.pods}
        for key in list(self._states):
            ns = key.split("/", 1)[0]
            if (item.scope is None or ns == item.scope) and key not in listed:
                self._drop(key)
        for pod in item.pods:
            self._on_pod(pod, deleted=False)
        self._synced_scopes.add(item.scope)
        if len(self._synced_scopes) >= max(1, len(self.settings.namespaces)):
            self.telemetry.ready.set()

    def _on_pod(self, pod: dict[str, Any], *, deleted: bool) -> None:
        key = pod_key(pod)
        uid = (pod.get("metadata") or {}).get("uid", "")
        state = self._states.get(key)
        if state is not None and state.uid != uid:
            self._drop(key)  # same name, new pod: start over
            state = None
        if deleted:
            self._warned_pods.discard(uid)
            final = final_from_deleted(pod)
            if final is not None and self._leading and (state is None or not state.finalized):
                self._spawn(self._finalize(final, None))
            self._drop(key)
            return
        s = self.settings
        decision = classify(pod, default_port=s.default_port, default_path=s.default_path,
                            default_interval=s.interval)
        if isinstance(decision, Ignore | Wait):
            if state is not None:
                self._drop(key)
            if isinstance(decision, Ignore) and decision.misconfigured:
                if uid not in self._warned_pods:  # once per pod, not once per watch event
                    self._warned_pods.add(uid)
                    log.warning("pod %s not scraped: %s", key, decision.reason)
            else:
                log.debug("pod %s not scraped: %s", key, decision.reason)
            return
        if state is None:
            trainjob = decision.target.trainjob if isinstance(decision, Scrape) else \
                decision.trainjob
            state = _TargetState(JobView(key.split("/", 1)[0], trainjob, key.split("/", 1)[1]),
                                 uid=uid)
            self._states[key] = state
        if isinstance(decision, Scrape):
            if state.target is not None and state.target.url != decision.target.url:
                state.etag, state.refused, state.next_try = None, 0, 0.0
            state.target = decision.target
            if self._leading:
                self.scheduler.schedule(decision.target)
        elif isinstance(decision, Final):
            state.target = None
            state.final = decision
            state.view.up = False
            self.scheduler.unschedule(key)
            if not state.finalized and self._leading:
                state.finalized = True
                self._spawn(self._finalize(decision, state))

    def _drop(self, key: str) -> None:
        self.scheduler.unschedule(key)
        self._states.pop(key, None)

    # ------------------------------------------------------------ scraping

    async def _scrape(self, key: str) -> None:
        """One scheduled run for one target (APScheduler job; never overlaps itself)."""
        state = self._states.get(key)
        if state is None or state.target is None or not self._leading or self._scraper is None:
            return
        now = time.monotonic()
        if now < state.next_try:
            return
        target = state.target
        result = await self._scraper.scrape(target, state.etag)
        if isinstance(result, Busy):
            self.scheduler.note_skipped(key, "no scrape slot came free in time "
                                        f"(all {self.settings.concurrency} in use)")
            return
        if isinstance(result, Failure):
            self.telemetry.scrapes.labels(result.kind.value).inc()
            await self._on_failure(state, target, result)
            return
        if state.refused:
            log.info("target %s answers again", key)
        state.refused, state.next_try, state.view.up = 0, 0.0, True
        if isinstance(result, NotModified):
            self.telemetry.scrapes.labels("not_modified").inc()
            return
        if isinstance(result, NothingYet):
            self.telemetry.scrapes.labels("empty").inc()
            return
        assert isinstance(result, Fresh)
        self.telemetry.scrapes.labels("ok").inc()
        state.view.status = result.status
        if self._states.get(key) is not state or state.target is None:
            return  # the pod ended meanwhile: its final status wins
        outcome = await self._write(target.namespace, target.trainjob, result.status, key)
        # Keep the ETag only when the status is safely where it belongs; otherwise the
        # next scrape fetches the body again and retries the write.
        state.etag = result.etag if outcome in (WriteOutcome.WRITTEN, WriteOutcome.UNCHANGED,
                                                WriteOutcome.NOT_STORED) else None

    async def _on_failure(self, state: _TargetState, target: Target, failure: Failure) -> None:
        state.view.up = False
        state.etag = None
        if failure.kind.not_instrumented:
            # No exporter listening: back off exponentially, log only the first time.
            state.refused += 1
            delay = min(target.interval * 2 ** (state.refused - 1), self.settings.backoff_max)
            state.next_try = time.monotonic() + delay
            if state.refused == 1:
                log.info("target %s (%s): %s; treating it as not instrumented and backing "
                         "off (up to %gs)", target.key, target.url, failure.detail,
                         self.settings.backoff_max)
            return
        reason = REASON_INVALID if failure.kind is FailureKind.INVALID else REASON_SCRAPE_FAILED
        message = f"scraping {target.url} (pod {target.pod_name}): {failure.detail}"
        last, at = state.last_event
        if last == message and time.monotonic() - at < EVENT_REPEAT_SECONDS:
            return
        state.last_event = (message, time.monotonic())
        log.warning("TrainJob %s/%s: %s", target.namespace, target.trainjob, message)
        await self.reconciler.event(target.namespace, target.trainjob, reason,
                                    message + "; the previous status is kept")

    async def _write(
        self, namespace: str, trainjob: str, status: TrainerStatus, key: str | None
    ) -> WriteOutcome | None:
        try:
            return await self.reconciler.apply(namespace, trainjob, status)
        except TrainJobGone:
            log.info("TrainJob %s/%s is gone: no longer scraping its pod", namespace, trainjob)
            self._drop_trainjob(namespace, trainjob)
            return None
        except Exception as exc:
            log.warning("status write to TrainJob %s/%s failed: %s", namespace, trainjob, exc)
            self.telemetry.writes.labels(WriteOutcome.FAILED.value).inc()
            return WriteOutcome.FAILED

    def _drop_trainjob(self, namespace: str, trainjob: str) -> None:
        for key, state in list(self._states.items()):
            if (state.view.namespace, state.view.trainjob) == (namespace, trainjob):
                self._drop(key)
        self.reconciler.forget(namespace, trainjob)
        self.telemetry.targets.set(len(self.scheduler.scheduled_keys()))

    async def _finalize(self, final: Final, state: _TargetState | None) -> None:
        """Apply the final status from a terminated pod's termination message."""
        problems = []
        for container, message in final.messages:
            try:
                status = TrainerStatus.from_json(message)
            except StatusError as exc:
                problems.append(f"container {container}: {exc}")
                continue
            if state is not None:
                state.view.status = status
            outcome = await self._write(final.namespace, final.trainjob, status, None)
            log.info("final status of TrainJob %s/%s from pod %s (container %s): %s",
                     final.namespace, final.trainjob, final.pod_name, container,
                     outcome.value if outcome else "TrainJob gone")
            return
        if problems:
            await self.reconciler.event(
                final.namespace, final.trainjob, REASON_FINAL_INVALID,
                f"termination message of pod {final.pod_name} is not a valid trainerStatus: "
                + "; ".join(problems) + "; the previous status is kept",
            )

    # ------------------------------------------------------------ periodic work

    async def _maintenance(self) -> None:
        """Re-check an unsupported CRD and resync TrainJobs, while leading."""
        last_resync = time.monotonic()
        last_crd = time.monotonic()
        while True:
            await asyncio.sleep(1.0)
            now = time.monotonic()
            if self.reconciler.supported is not True and now - last_crd >= CRD_RECHECK_SECONDS:
                last_crd = now
                with contextlib.suppress(Exception):
                    await self.reconciler.check_crd()
            interval = self.settings.resync_interval
            if not self._leading or interval <= 0 or now - last_resync < interval:
                continue
            last_resync = now
            before = {k: s.seen for k, s in self._states.items()}
            try:
                exists = await self.reconciler.resync(self.settings.namespaces)
            except Exception as exc:
                log.warning("TrainJob resync failed: %s", exc)
                continue
            for key, seen in before.items():
                state = self._states.get(key)
                if state is None or state.seen != seen:
                    continue
                tj = (state.view.namespace, state.view.trainjob)
                if tj not in exists:
                    log.info("TrainJob %s/%s is gone: no longer scraping its pod", *tj)
                    self._drop_trainjob(*tj)

    # ------------------------------------------------------------ telemetry

    def _views(self) -> Iterable[JobView]:
        if not self._leading:
            return []  # a standby scrapes nothing: it would only export stale zeros
        by_job: dict[tuple[str, str], JobView] = {}
        for state in self._states.values():
            key = (state.view.namespace, state.view.trainjob)
            # A live target wins over a terminated pod of the same TrainJob.
            if key not in by_job or state.target is not None:
                by_job[key] = state.view
        return list(by_job.values())
