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
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any

from kubernetes import client as k8s

from scraper.boost.watch import BoostCollector, BoostWatch
from scraper.boost.workload import list_workloads, write_boost
from scraper.config import ScraperSettings
from scraper.config_groups import TelemetrySettings
from scraper.decide.decision import decide
from scraper.discovery.feed import PodFeed
from scraper.discovery.identity import Identity, Link, OwnerIndex
from scraper.discovery.owner_watches import owner_watches
from scraper.discovery.pod_confirm import PodConfirmer
from scraper.discovery.pod_targets import PodTargets
from scraper.discovery.pods import PodWatcher, WatchItem, probe_selector
from scraper.discovery.relists import Relists
from scraper.kube.client import load_client, without_retries
from scraper.kube.health import ApiHealth
from scraper.kube.informer import ScopesListed
from scraper.leader import LeaseElector
from scraper.logsource.reader import LogLimits, LogScraper
from scraper.metrics_auth import MetricsAuth, metrics_auth_for
from scraper.scrape.exporter import ExporterScraper, ScrapeLimits
from scraper.scrape.loop import ScrapeLoop
from scraper.scrape.manager import TargetManager
from scraper.scrape.scheduling import TargetScheduler
from scraper.scrape.sources import SourceScraper
from scraper.scrape.target_state import TargetState
from scraper.scrape.target_table import AddressIndex, TargetTable
from scraper.shared.leadership import Leadership
from scraper.shared.pod_check import PodCheck
from scraper.shared.policy import PolicyResolver, WritePolicy
from scraper.shared.targets import Target
from scraper.shared.trainjobs import TrainJobKey, TrainJobStore
from scraper.stall.marker import write_stall_marker
from scraper.stall.watch import Observed, StallCollector, StallWatch
from scraper.supervisor import Supervisor, first_set
from scraper.telemetry import Telemetry
from scraper.write.annotation_target import StatusTarget
from scraper.write.rate import WriteBudget
from scraper.write.rules import WriterHooks, WriteRules
from scraper.write.worker import StatusRequest
from scraper.write.writer import StatusWriter

log = logging.getLogger(__name__)

CRD_RECHECK_SECONDS = 60.0

ROOT_CONSUMER = "pod-watch-consumer"
ROOT_LEADER = "leader-election"
ROOT_CRD = "crd-recheck"
ROOT_HEALTH = "api-health-probe"
ROOT_STALL = "stall-check"
ROOT_BOOST = "priority-boost"



def observed(chosen: Mapping[TrainJobKey, TargetState]) -> list[Observed]:
    """The scraped target of every TrainJob (``TargetManager.chosen()``), as the stall
    stage observes it now; a TrainJob whose chosen pod ended (no target) is left out."""
    out = []
    for key, state in chosen.items():
        target = state.target
        if target is not None:
            out.append(Observed(key, target.trainjob_uid, target.pod_name, state.uid,
                                target.interval, state.view.status, state.view.up is True))
    return out


def _log_serving(tel: TelemetrySettings, port: int, *, guarded: bool) -> None:
    """Says where /metrics is served and who may read it."""
    log.info("serving /metrics, /healthz, /readyz on %s:%d", tel.listen_host, port)
    if not guarded:
        log.warning("/metrics is open to anyone who reaches %s:%d (metrics_auth=false)",
                    tel.listen_host, port)
    else:
        log.info("/metrics needs a bearer token allowed to get /metrics (TokenReview and "
                 "SubjectAccessReview, decisions cached %gs)", tel.metrics_auth_cache_ttl)


class ScraperApp:
    """The scraper service; one instance per process (or per test).

    Create inside a running event loop (the scrape client's session binds to it).
    """

    def __init__(self, settings: ScraperSettings, api_client: k8s.ApiClient | None = None,
                 *, store: TrainJobStore | None = None, request: StatusRequest | None = None,
                 writer_class: type[StatusWriter] = StatusWriter,
                 confirm_pod: Callable[[Target, float | None], Awaitable[PodCheck]] | None = None,
                 ) -> None:
        """Every part is built here with the callbacks it calls (methods of this class,
        which read parts built after it only when called).

        ``store``, ``request``, ``writer_class`` and ``confirm_pod`` replace the TrainJob
        informer's store, the apply request, the writer's class and the read of a
        target's pod (:class:`scraper.discovery.pod_confirm.PodConfirmer`): the benchmarks
        keep TrainJobs in memory and have no pod objects (benchmarks/our_scraper.py)."""
        self.settings = settings
        found, scrape, write = settings.discovery, settings.scrape, settings.write
        stall, logs, lease, tel = (settings.stall, settings.logs, settings.lease,
                                   settings.telemetry)
        # No hidden urllib3 retries on any client: every call has a deadline (kube/calls.py).
        self.api = (without_retries(api_client) if api_client
                    else load_client(found.kubeconfig))
        # Whether this replica leads, the table of targets and which pods answer at which
        # address: built first, read by the telemetry, the scrape loop and the stall
        # watch, kept by the target manager.
        self.leadership = Leadership(not lease.enabled)
        self.targets = TargetTable()
        self.addresses = AddressIndex()
        # One view per TrainJob; nothing on a standby (it would export stale zeros).
        self.telemetry = t = Telemetry(
            lambda: self.targets.views() if self.leadership() else [])
        self.metrics_auth: MetricsAuth | None = metrics_auth_for(
            self.api, ttl=tel.metrics_auth_cache_ttl, size=tel.metrics_auth_cache_size,
            registry=t.registry) if tel.metrics_auth else None
        self.supervisor: Supervisor | None = None
        self._elector: LeaseElector | None = LeaseElector(
            self.api, namespace=lease.namespace, name=lease.name,
            identity=lease.identity, lease_duration=lease.duration,
            renew_deadline=lease.renew_deadline, retry_period=lease.retry_period,
            on_change=self._on_leadership) if lease.enabled else None
        self.scopes: list[str | None] = list(found.namespaces) or [None]
        self.trainjobs = store if store is not None else TrainJobStore(
            self.scopes, on_gone=self._trainjob_gone, on_seen=self._trainjob_seen)
        # Writing by significance: the flags' policy, overridden per TrainJob.
        self.policies = PolicyResolver(write.policy)
        # Writes and watches retry once the API answers again (kube/health.py).
        self.health = ApiHealth.for_client(self.api)
        self.writer = writer_class.for_client(
            self.api, identity=lease.identity,
            budget=WriteBudget(write.qps, write.burst, write.qps_max,
                               lambda change: t.write_rate_changed(
                                   change.before, change.after, change.reason.value)),
            store=self.trainjobs,
            rules=WriteRules(decide, write.policy, self.policy_of,
                             StatusTarget(write.status_target)),
            hooks=WriterHooks(self._may_write, t, self._drop_trainjob, self.health,
                              confirm_pod or PodConfirmer(k8s.CoreV1Api(self.api)),
                              self._pod_checked),
            request=request)
        t.write_rate.set(write.qps)
        # Everything not applied yet, also what a writer took and waits on the budget for.
        t.writes_pending.set_function(lambda: self.writer.queue.unapplied())
        self.crd = self.writer.crd
        self.events = self.writer.events
        self.logs: LogScraper | None = LogScraper(
            self.api, LogLimits(logs.limit_bytes, logs.tail_lines, logs.qps, logs.burst,
                                scrape.timeout),
            on_read=t.count_log_read,
            on_parse_failure=t.log_parse_failures.inc) if logs.enabled else None
        self.scraper = SourceScraper(ExporterScraper(
            ScrapeLimits(scrape.timeout, scrape.max_body_bytes, scrape.concurrency),
            observe=t.scrape_duration.observe, waiting=scrape.wait_scrapes,
        ), self.logs, on_exporter_answer=self._exporter_answered)
        t.held_scrapes.set_function(lambda: self.scraper.held)
        self.scheduler = TargetScheduler(
            self._run_target, on_skipped=lambda key: t.skipped_runs.inc(),
            busy_reason=f"no scrape slot came free in time (all {scrape.concurrency} in use)")
        # A scrape that finds its pod replaced asks the pod watch to list again.
        self.relists = Relists()
        self.scrape_loop = ScrapeLoop(
            self.scraper, self.writer, self.events, backoff_max=scrape.backoff_max,
            leading=self.leadership, on_gone=self._drop_trainjob,
            pacing=self.scheduler, counts=t, waiting=scrape.wait_scrapes,
            final_from_log=self.logs.final_of if self.logs is not None else None,
            policy_of=self.policy_of, pods_at=self.addresses.pods_at)

        # Any change to a link of an owner chain, and every list, re-checks the pods
        # waiting on it (scraper/discovery/identity.py, "Convergence").
        self.jobs = OwnerIndex(self.scopes, "Job", on_change=self._owners_changed)
        self.jobsets = OwnerIndex(self.scopes, "JobSet", on_change=self._owners_changed)
        self.identity = Identity(self.jobs, self.jobsets, self.trainjobs)
        self.manager = TargetManager(
            self.scrape_loop, self.scheduler, spawn=self._spawn, forget=self.writer.forget,
            leading=self.leadership, on_dropped=self.scraper.forget,
            addresses=self.addresses, states=self.targets)
        self.pods = PodTargets(
            self.manager, default_port=found.default_port, default_path=found.default_path,
            default_interval=found.default_interval, identify=self.identity.verify,
            trainjob_source=self.trainjobs.source_of)
        self.pod_feed = PodFeed(
            self.pods, ScopesListed(self.scopes), on_ready=t.ready.set,
            on_failure=lambda kind: t.pod_apply_failures.labels(kind).inc(),
            on_applied=self._targets_changed)
        self.stalls = StallWatch(
            targets=lambda: observed(self.manager.chosen()), store=self.trainjobs,
            events=self.events,
            write_marker=(functools.partial(write_stall_marker, self.api)
                          if stall.annotate else None),
            given=stall.after, leading=self.leadership,
            ready=lambda: (self.pod_feed.listed.event.is_set()
                           and self.trainjobs.synced.is_set()),
            spawn=lambda coro: self.spawn_named("stall-record", coro))
        t.registry.register(StallCollector(self.stalls))
        self.boosts = _boosts(self, settings.boost.max_boost)

    # ------------------------------------------------------------ lifecycle

    async def run(self, stop: asyncio.Event) -> None:
        """Run until ``stop`` is set or a root task fails, then shut down (module doc).

        Raises:
            ConfigError: the API server rejects the selector.
            RootTaskFailed: a root task raised or ended (after the shutdown).
            OSError: the listen address is taken.
        """
        tel = self.settings.telemetry
        self.supervisor = supervisor = Supervisor()
        try:
            guard = [self.metrics_auth.middleware] if self.metrics_auth else []
            port = await self.telemetry.start(tel.listen_host, tel.listen_port,
                                              middlewares=guard)
            _log_serving(tel, port, guarded=self.metrics_auth is not None)
            await self._serve(stop, supervisor)
        finally:
            await self.scraper.close()
            await self.telemetry.stop()
            log.info("stopped")
        if supervisor.failure is not None:
            raise supervisor.failure

    async def _serve(self, stop: asyncio.Event, supervisor: Supervisor) -> None:
        found, shutdown = self.settings.discovery, self.settings.shutdown_timeout
        self.telemetry.leader.set(1 if self.manager.leading else 0)
        await self.crd.check()
        scopes: list[str | None] = list(found.namespaces) or [None]
        core = k8s.CoreV1Api(self.api)
        await probe_selector(core, found.selector, scopes[0])
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[WatchItem] = asyncio.Queue(maxsize=1000)
        watchers = [
            PodWatcher(core, namespace=ns, selector=found.selector, queue=queue, loop=loop,
                       on_restart=self._watch_restarted, health=self.health)
            for ns in scopes
        ]
        trainjob_watches = owner_watches(
            self.api, self.scopes, trainjobs=self.trainjobs, jobsets=self.jobsets,
            jobs=self.jobs, loop=loop, on_restart=self._watch_restarted,
            relist_interval=found.resync_interval, health=self.health)
        for tw in trainjob_watches:
            tw.start()
        self.writer.start()
        self.scheduler.start()
        self.relists.watch(dict(zip(scopes, watchers, strict=True)))
        for w in watchers:
            w.start()
        supervisor.root(ROOT_CONSUMER, self.pod_feed.run(queue, watchers))
        supervisor.root(ROOT_HEALTH, self.health.run())
        supervisor.root(ROOT_CRD, self.crd.recheck_every(CRD_RECHECK_SECONDS))
        supervisor.root(ROOT_STALL, self.stalls.run())
        if self.boosts is not None:
            supervisor.root(ROOT_BOOST, self.boosts.run())
        if self._elector is not None:
            supervisor.root(ROOT_LEADER, self._elector.run())
        log.info("trainjob-scraper started: selector %r, namespaces %s, interval %gs, "
                 "status target %s%s", found.selector, ",".join(found.namespaces) or "all",
                 found.default_interval, self.settings.write.status_target,
                 ", leader election on" if self._elector else "")
        try:
            await first_set(stop, supervisor.failed)
        finally:
            log.info("stopping: no new scrapes; waiting up to %gs for in-flight writes",
                     shutdown)
            self.manager.leading = False  # closes the write fence for anything not yet started
            self.manager.stop_holding()  # held requests end now, not at their max-wait
            # Wait for in-flight writes before shutting the scheduler down: its
            # shutdown cancels the running scrape jobs, and so the writes inside them.
            # Meanwhile jobs that fire return at once (not leading).
            drained = await self.writer.drain(shutdown)
            if not drained:
                log.warning("in-flight status writes did not finish within %gs",
                            shutdown)
            self.scheduler.shutdown()
            await supervisor.cancel_background()
            await self.writer.stop()
            await supervisor.cancel(ROOT_CONSUMER, ROOT_CRD, ROOT_HEALTH, ROOT_STALL,
                                    *([ROOT_BOOST] if self.boosts is not None else []))
            await supervisor.cancel(ROOT_LEADER)  # last: it releases the Lease
            # All at once: each may wait up to 1 s for its blocked read.
            stops: list[Callable[[float], None]] = [w.stop for w in watchers]
            stops += [w.stop for w in trainjob_watches]
            await asyncio.gather(*(asyncio.to_thread(stop, 1.0) for stop in stops))

    def sizes(self) -> dict[str, int]:
        """Entries of every map kept per pod or TrainJob, by ``component.map``: each is
        bounded by the live objects."""
        parts: dict[str, dict[str, int]] = {
            "manager": self.manager.sizes(), "pods": self.pods.sizes(),
            "writer": self.writer.sizes(),
            "scraper": self.scraper.exporter.sizes(), "scheduler": self.scheduler.sizes(),
            "stalls": self.stalls.sizes(),
            "informers": {"trainjobs": len(self.trainjobs), "jobs": len(self.jobs),
                          "jobsets": len(self.jobsets)},
        }
        if self.logs is not None:
            parts["logs"] = self.logs.sizes()
        if self.boosts is not None:
            parts["boosts"] = self.boosts.sizes()
        return {f"{part}.{k}": v for part, sizes in parts.items() for k, v in sizes.items()}

    def policy_of(self, namespace: str, name: str) -> WritePolicy:
        """A TrainJob's write policy: its target pod's annotations, then its own, then
        the flags (:class:`scraper.shared.policy.PolicyResolver`)."""
        target = self.manager.target_of(namespace, name)
        record = self.trainjobs.get(namespace, name)
        return self.policies.policy(target.policy if target is not None else (),
                                    record.policy if record is not None else (),
                                    where=f"TrainJob {namespace}/{name}")

    def _exporter_answered(self, target: Target) -> None:
        state = self.manager.states.get(target.key)
        if state is not None and state.uid == target.pod_uid:
            state.exporter_did_answer()

    async def _run_target(self, key: str) -> None:
        # A coroutine function (not a lambda returning a coroutine): APScheduler runs
        # only those on the loop, anything else in a thread.
        await self.manager.run(key)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        assert self.supervisor is not None, "spawned before run()"
        self.supervisor.background("final-status", coro)

    def spawn_named(self, name: str, coro: Coroutine[Any, Any, None]) -> None:
        """Run ``coro`` in the background as ``name`` under the supervisor (a failure is
        logged with its name); only once :meth:`run` has started it."""
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
            return self.leadership.leading
        return self.leadership.leading and self._elector.may_write()

    def _on_leadership(self, leading: bool) -> None:
        self.telemetry.leader.set(1 if leading else 0)
        if not leading:
            # The queue is this term's: whoever leads next applies every final still owed
            # (scraper.scrape.manager, "Leader changes"), this replica too when it wins back.
            self.writer.stop_leading()
        self.manager.set_leading(leading)
        self._targets_changed()

    def _drop_trainjob(self, namespace: str, trainjob: str) -> None:
        self.manager.drop_trainjob(namespace, trainjob)
        self._targets_changed()

    def _pod_checked(self, target: Target, check: PodCheck) -> None:
        """The writer read a target's pod (discovery/pod_confirm.py); a moved one relists."""
        if (self.scrape_loop.pod_checked(self.targets.get(target.key), target, check)
                and check is not PodCheck.CONFIRMED):
            self.relists.relist_for(target.namespace)

    # ------------------------------------------------------------ owner chain

    def _trainjob_seen(self, key: tuple[str, str] | None) -> None:
        self._owners_changed(None if key is None else ("TrainJob", f"{key[0]}/{key[1]}"))
        self.manager.trainjob_seen(key)  # an owed final it now holds settles

    def _owners_changed(self, link: Link | None) -> None:
        self.pods.recheck(link)
        self._targets_changed()

    def _trainjob_gone(self, namespace: str, name: str, uid: str) -> None:
        log.info("TrainJob %s/%s (UID %s) is gone: no longer scraping its pod",
                 namespace, name, uid)
        self._drop_trainjob(namespace, name)


def _boosts(app: ScraperApp, max_boost: int) -> BoostWatch | None:
    """The optional priority-boost stage (``--priority-boost-max`` above 0), built on the
    parts ``app`` already has and registered with its telemetry; None when off."""
    if max_boost <= 0:
        return None
    boosts = BoostWatch(
        max_boost=max_boost, signals=lambda: observed(app.manager.chosen()),
        uid_of=app.trainjobs.uid_of,
        list_workloads=lambda: list_workloads(app.api, app.scopes),
        write_boost=functools.partial(write_boost, app.api),
        leading=app.leadership,
        ready=lambda: app.pod_feed.listed.event.is_set() and app.trainjobs.synced.is_set(),
        spawn=lambda coro: app.spawn_named("priority-boost-write", coro))
    app.telemetry.registry.register(BoostCollector(boosts))
    return boosts
