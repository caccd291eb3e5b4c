"""Wires discovery, scheduling, scraping, the scrape loop, the status writer, leadership
and telemetry, and runs their lifecycle.

Lifecycle of :meth:`ScraperApp.run`:

1. serve ``/metrics``, ``/healthz``, ``/readyz``; check the TrainJob CRD; ask the API
   server whether the selector is valid (a 400 is a configuration error);
2. list+watch pods (every replica, so a standby is warm and ready);
3. campaign for the Lease (or lead at once without leader election); while
   leading, every Running pod with an IP has a scheduled scrape job and every
   terminated pod's final status that is not on its TrainJob is applied, once, by
   whoever leads (also across leader changes: :mod:`scraper.scrape.manager`);
4. on stop (SIGTERM), or when a root task fails: stop scheduling, give in-flight
   writes ``shutdown_timeout`` seconds, release the Lease, close everything; a
   failed root task is then raised as :class:`~scraper.supervisor.RootTaskFailed`.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from kubernetes import client as k8s

from exporter_lib.status import TrainerStatus
from scraper.config import ScraperSettings
from scraper.discovery.feed import PodFeed
from scraper.discovery.identity import Identity, Link, OwnerIndex
from scraper.discovery.owner_watches import owner_watches
from scraper.discovery.pods import Final, PodWatcher, WatchItem, probe_selector
from scraper.discovery.targets import Target
from scraper.discovery.trainjobs import TrainJobStore
from scraper.kube.client import load_client, without_retries
from scraper.kube.health import ApiHealth
from scraper.kube.informer import ScopesListed
from scraper.leader import LeaseElector
from scraper.logsource.reader import LogLimits, LogScraper
from scraper.metrics_auth import MetricsAuth, metrics_auth_for
from scraper.scrape.exporter import ExporterScraper, ScrapeLimits
from scraper.scrape.loop import ScrapeLoop
from scraper.scrape.manager import TargetManager
from scraper.scrape.pod_confirm import PodCheck, PodConfirmer
from scraper.scrape.scheduling import TargetScheduler
from scraper.scrape.sources import SourceScraper
from scraper.stall.marker import write_stall_marker
from scraper.stall.watch import StallCollector, StallWatch, observed
from scraper.supervisor import Supervisor, first_set
from scraper.telemetry import Telemetry
from scraper.write.annotation_target import StatusTarget
from scraper.write.policy import PolicyResolver, WritePolicy
from scraper.write.rate_rule import Change
from scraper.write.worker import StatusRequest
from scraper.write.writer import StatusWriter

log = logging.getLogger(__name__)

#: Seconds between two relists of one pod watch asked for by unconfirmed pods.
RELIST_SPACING = 10.0

CRD_RECHECK_SECONDS = 60.0

ROOT_CONSUMER = "pod-watch-consumer"
ROOT_LEADER = "leader-election"
ROOT_CRD = "crd-recheck"
ROOT_HEALTH = "api-health-probe"
ROOT_STALL = "stall-check"


class ScraperApp:
    """The scraper service; one instance per process (or per test).

    Create inside a running event loop (the scrape client's session binds to it).
    """

    def __init__(self, settings: ScraperSettings, api_client: k8s.ApiClient | None = None,
                 *, store: TrainJobStore | None = None, request: StatusRequest | None = None,
                 writer_class: type[StatusWriter] = StatusWriter) -> None:
        """Every part is built here with the callbacks it calls (methods of this class,
        which read parts built after it only when called).

        ``store``, ``request`` and ``writer_class`` replace the TrainJob informer's
        store, the apply request and the writer's class: the benchmarks keep TrainJobs
        in memory (benchmarks/our_scraper.py)."""
        s = settings
        self.settings = settings
        # No hidden urllib3 retries on any client (issue 13, input 11).
        self.api = without_retries(api_client) if api_client else load_client(s.kubeconfig)
        self.telemetry = t = Telemetry(lambda: self.manager.views())
        self.metrics_auth: MetricsAuth | None = metrics_auth_for(
            self.api, ttl=s.metrics_auth_cache_ttl, size=s.metrics_auth_cache_size,
            registry=t.registry) if s.metrics_auth else None
        self.supervisor: Supervisor | None = None
        self._elector: LeaseElector | None = LeaseElector(
            self.api, namespace=s.effective_lease_namespace(), name=s.lease_name,
            identity=s.identity, lease_duration=s.lease_duration,
            renew_deadline=s.renew_deadline, retry_period=s.retry_period,
            on_change=self._on_leadership) if s.leader_election else None
        self.scopes: list[str | None] = list(s.namespaces) or [None]
        self.trainjobs = store if store is not None else TrainJobStore(
            self.scopes, on_gone=self._trainjob_gone, on_seen=self._trainjob_seen,
            on_change=lambda ns, name, record: self.writer.on_trainjob_change(ns, name, record))
        # Writing by significance: the flags' policy, overridden per TrainJob.
        self.policies = PolicyResolver(s.write_policy())
        # Recovery (issue 21, input 6): writes and watches retry once the API answers.
        self.health = ApiHealth.for_client(self.api)
        self.writer = writer_class.for_client(
            self.api, identity=s.identity, qps=s.write_qps, burst=s.write_burst,
            store=self.trainjobs, may_write=self._may_write,
            on_write=lambda outcome: t.writes.labels(outcome.value).inc(),
            on_request=t.write_duration.observe, on_gone=self._drop_trainjob,
            policy=s.write_policy(), policy_of=self.policy_of,
            target=StatusTarget(s.status_target), health=self.health,
            other_writer_grace=s.other_writer_grace,
            on_deferred=lambda reason: t.writes_deferred.labels(reason).inc(),
            on_skew=lambda direction: t.clock_skew.labels(direction).inc(), request=request,
            qps_max=s.write_ceiling(), on_rate_change=self._rate_changed)
        t.write_rate.set(s.write_qps)
        # Everything not applied yet, also what a writer took and waits on the budget for.
        t.writes_pending.set_function(lambda: self.writer.queue.unapplied())
        self.crd = self.writer.crd
        self.events = self.writer.events
        self.logs: LogScraper | None = LogScraper(
            self.api, LogLimits(s.log_limit_bytes, s.log_tail_lines, s.log_qps, s.log_burst,
                                s.scrape_timeout),
            on_read=t.count_log_read,
            on_parse_failure=t.log_parse_failures.inc) if s.log_source else None
        self.scraper = SourceScraper(ExporterScraper(
            ScrapeLimits(s.scrape_timeout, s.max_body_bytes, s.concurrency),
            observe=t.scrape_duration.observe, waiting=s.wait_scrapes,
        ), self.logs, on_exporter_answer=self._exporter_answered)
        t.held_scrapes.set_function(lambda: self.scraper.held)
        self.scheduler = TargetScheduler(self._run_target,
                                         on_skipped=lambda key: t.skipped_runs.inc())
        self.scrape_loop = ScrapeLoop(
            self.scraper, self.writer, self.events, backoff_max=s.backoff_max,
            leading=lambda: self.manager.leading, on_gone=self._drop_trainjob,
            on_busy=lambda key: self.scheduler.note_skipped(
                key, f"no scrape slot came free in time (all {s.concurrency} in use)"),
            count_scrape=lambda result: t.scrapes.labels(result).inc(),
            count_wrong_pod=lambda reason: t.wrong_pod_answers.labels(reason).inc(),
            count_write=lambda outcome: t.writes.labels(outcome.value).inc(),
            waiting=s.wait_scrapes, on_hold=self._on_hold,
            final_from_log=self._final_from_log if self.logs is not None else None,
            policy_of=self.policy_of, on_retry=self.scheduler.run_within,
            pods_at=lambda url: self.manager.addresses.pods_at(url),
            confirm_pod=PodConfirmer(k8s.CoreV1Api(self.api)),
            on_unconfirmed=self._pod_unconfirmed)
        self._pod_watchers: dict[str | None, PodWatcher] = {}
        self._relisted: dict[int, float] = {}
        # Any change to a link of an owner chain, and every list, re-checks the pods
        # waiting on it (scraper/discovery/identity.py, "Convergence").
        self.jobs = OwnerIndex(self.scopes, "Job", on_change=self._owners_changed)
        self.jobsets = OwnerIndex(self.scopes, "JobSet", on_change=self._owners_changed)
        self.identity = Identity(self.jobs, self.jobsets, self.trainjobs)
        self.manager = TargetManager(
            self.scrape_loop, self.scheduler, spawn=self._spawn, forget=self.writer.forget,
            default_port=s.default_port, default_path=s.default_path,
            default_interval=s.interval, leading=not s.leader_election,
            identify=self.identity.verify, on_dropped=self.scraper.forget,
            trainjob_source=self._trainjob_source)
        self.pod_feed = PodFeed(
            self.manager, ScopesListed(self.scopes), on_ready=t.ready.set,
            on_failure=lambda kind: t.pod_apply_failures.labels(kind).inc(),
            on_applied=self._targets_changed)
        self.stalls = StallWatch(
            targets=lambda: observed(self.manager.chosen()), store=self.trainjobs,
            events=self.events,
            write_marker=(functools.partial(write_stall_marker, self.api)
                          if s.stall_annotate else None),
            given=s.stall_after, leading=lambda: self.manager.leading,
            ready=lambda: (self.pod_feed.listed.event.is_set()
                           and self.trainjobs.synced.is_set()),
            spawn=lambda coro: self._spawn_named("stall-record", coro))
        t.registry.register(StallCollector(self.stalls))

    # ------------------------------------------------------------ lifecycle

    async def run(self, stop: asyncio.Event) -> None:
        """Run until ``stop`` is set or a root task fails, then shut down (module doc).

        Raises:
            ConfigError: the API server rejects the selector.
            RootTaskFailed: a root task raised or ended (after the shutdown).
            OSError: the listen address is taken.
        """
        s = self.settings
        self.supervisor = supervisor = Supervisor()
        try:
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
            await self._serve(stop, supervisor)
        finally:
            await self.scraper.close()
            await self.telemetry.stop()
            log.info("stopped")
        if supervisor.failure is not None:
            raise supervisor.failure

    async def _serve(self, stop: asyncio.Event, supervisor: Supervisor) -> None:
        s = self.settings
        self.telemetry.leader.set(1 if self.manager.leading else 0)
        await self.crd.check()
        scopes: list[str | None] = list(s.namespaces) or [None]
        core = k8s.CoreV1Api(self.api)
        await probe_selector(core, s.selector, scopes[0])
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[WatchItem] = asyncio.Queue(maxsize=1000)
        watchers = [
            PodWatcher(core, namespace=ns, selector=s.selector, queue=queue, loop=loop,
                       on_restart=self._watch_restarted, health=self.health)
            for ns in scopes
        ]
        trainjob_watches = owner_watches(
            self.api, self.scopes, trainjobs=self.trainjobs, jobsets=self.jobsets,
            jobs=self.jobs, loop=loop, on_restart=self._watch_restarted,
            relist_interval=s.resync_interval, health=self.health)
        for tw in trainjob_watches:
            tw.start()
        self.writer.start()
        self.scheduler.start()
        self._pod_watchers = dict(zip(scopes, watchers, strict=True))
        for w in watchers:
            w.start()
        supervisor.root(ROOT_CONSUMER, self.pod_feed.run(queue, watchers))
        supervisor.root(ROOT_HEALTH, self.health.run())
        supervisor.root(ROOT_CRD, self.crd.recheck_every(CRD_RECHECK_SECONDS))
        supervisor.root(ROOT_STALL, self.stalls.run())
        if self._elector is not None:
            supervisor.root(ROOT_LEADER, self._elector.run())
        log.info("trainjob-scraper started: selector %r, namespaces %s, interval %gs, "
                 "status target %s%s", s.selector, ",".join(s.namespaces) or "all", s.interval,
                 s.status_target, ", leader election on" if self._elector else "")
        try:
            await first_set(stop, supervisor.failed)
        finally:
            log.info("stopping: no new scrapes; waiting up to %gs for in-flight writes",
                     s.shutdown_timeout)
            self.manager.leading = False  # closes the write fence for anything not yet started
            self.manager.stop_holding()  # held requests end now, not at their max-wait
            # Wait for in-flight writes before shutting the scheduler down: its
            # shutdown cancels the running scrape jobs, and so the writes inside them.
            # Meanwhile jobs that fire return at once (not leading).
            drained = await self.writer.drain(s.shutdown_timeout)
            if not drained:
                log.warning("in-flight status writes did not finish within %gs",
                            s.shutdown_timeout)
            self.scheduler.shutdown()
            await supervisor.cancel_background()
            await self.writer.stop()
            await supervisor.cancel(ROOT_CONSUMER, ROOT_CRD, ROOT_HEALTH, ROOT_STALL)
            await supervisor.cancel(ROOT_LEADER)  # last: it releases the Lease
            # All at once: each may wait up to 1 s for its blocked read.
            stops: list[Callable[[float], None]] = [w.stop for w in watchers]
            stops += [w.stop for w in trainjob_watches]
            await asyncio.gather(*(asyncio.to_thread(stop, 1.0) for stop in stops))

    def sizes(self) -> dict[str, int]:
        """Entries of every map kept per pod or TrainJob, by ``component.map``: each is
        bounded by the live objects (issue 27, deliverable 6)."""
        parts: dict[str, dict[str, int]] = {
            "manager": self.manager.sizes(), "writer": self.writer.sizes(),
            "scraper": self.scraper.exporter.sizes(), "scheduler": self.scheduler.sizes(),
            "stalls": self.stalls.sizes(),
            "informers": {"trainjobs": len(self.trainjobs), "jobs": len(self.jobs),
                          "jobsets": len(self.jobsets)},
        }
        if self.logs is not None:
            parts["logs"] = self.logs.sizes()
        return {f"{part}.{k}": v for part, sizes in parts.items() for k, v in sizes.items()}

    def policy_of(self, namespace: str, name: str) -> WritePolicy:
        """A TrainJob's write policy: its target pod's annotations, then its own, then
        the flags (:class:`scraper.write.policy.PolicyResolver`)."""
        target = self.manager.target_of(namespace, name)
        record = self.trainjobs.get(namespace, name)
        return self.policies.policy(target.policy if target is not None else (),
                                    record.policy if record is not None else (),
                                    where=f"TrainJob {namespace}/{name}")

    def _trainjob_source(self, namespace: str, name: str) -> str | None:
        record = self.trainjobs.get(namespace, name)
        return record.source if record is not None else None

    def _exporter_answered(self, target: Target) -> None:
        state = self.manager.states.get(target.key)
        if state is not None and state.uid == target.pod_uid:
            state.exporter_answered = True

    async def _final_from_log(self, final: Final, answered: bool) -> TrainerStatus | None:
        assert self.logs is not None
        if final.source == "auto" and answered:
            return None  # its exporter answered: the exporter's last status stands
        return await self.logs.final(final.namespace, final.pod_name, final.pod_uid,
                                     final.log_container)

    def _on_hold(self, key: str, holding: bool) -> None:
        # The scheduler's job waits while the target's waiting scrape is held.
        if holding:
            self.scheduler.pause(key)
        else:
            self.scheduler.resume(key)

    async def _run_target(self, key: str) -> None:
        # A coroutine function (not a lambda returning a coroutine): APScheduler runs
        # only those on the loop, anything else in a thread.
        await self.manager.run(key)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        assert self.supervisor is not None, "spawned before run()"
        self.supervisor.background("final-status", coro)

    def _spawn_named(self, name: str, coro: Coroutine[Any, Any, None]) -> None:
        assert self.supervisor is not None, "spawned before run()"
        self.supervisor.background(name, coro)

    def _watch_restarted(self, reason: str) -> None:
        # Called from a watch thread; prometheus-client counters are thread-safe.
        self.telemetry.watch_restarts.labels(reason).inc()

    def _targets_changed(self) -> None:
        self.telemetry.targets.set(len(self.scheduler))  # per pod event: no copy

    # ------------------------------------------------------------ leadership

    def _may_write(self) -> bool:
        if self._elector is None:
            return self.manager.leading
        return self.manager.leading and self._elector.may_write()

    def _on_leadership(self, leading: bool) -> None:
        self.telemetry.leader.set(1 if leading else 0)
        if not leading:
            # The queue is this term's: whoever leads next applies every final still owed
            # (scraper.scrape.manager, "Leader changes"), this replica too when it wins back.
            self.writer.stop_leading()
        self.manager.set_leading(leading)
        self._targets_changed()

    def _pod_unconfirmed(self, target: Target, check: PodCheck) -> None:
        """A target's pod is not what the pod watch says (scraper/scrape/pod_confirm.py):
        the watch relists at once."""
        watcher = self._pod_watchers.get(target.namespace) or self._pod_watchers.get(None)
        now = asyncio.get_running_loop().time()
        if watcher is None or now - self._relisted.get(id(watcher), -RELIST_SPACING) < (
                RELIST_SPACING):
            return  # one list per watch every RELIST_SPACING s: a list of all pods is big
        self._relisted[id(watcher)] = now
        watcher.relist()

    def _rate_changed(self, change: Change) -> None:
        self.telemetry.write_rate.set(change.after)
        self.telemetry.write_rate_changes.labels(change.reason.value).inc()
        log.log(logging.INFO if change.after < change.before else logging.DEBUG,
                "status write rate %.1f -> %.1f writes/s (%s)", change.before, change.after,
                change.reason.value)

    def _drop_trainjob(self, namespace: str, trainjob: str) -> None:
        self.manager.drop_trainjob(namespace, trainjob)
        self._targets_changed()

    # ------------------------------------------------------------ owner chain

    def _trainjob_seen(self, key: tuple[str, str] | None) -> None:
        self._owners_changed(None if key is None else ("TrainJob", f"{key[0]}/{key[1]}"))
        self.manager.trainjob_seen(key)  # an owed final it now holds settles

    def _owners_changed(self, link: Link | None) -> None:
        self.manager.recheck(link)
        self._targets_changed()

    def _trainjob_gone(self, namespace: str, name: str, uid: str) -> None:
        log.info("TrainJob %s/%s (UID %s) is gone: no longer scraping its pod",
                 namespace, name, uid)
        self._drop_trainjob(namespace, name)

