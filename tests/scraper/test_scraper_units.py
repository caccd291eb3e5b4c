"""Scraper pieces that need no cluster: configuration, CLI, offsets, parsing, pod rules."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import socket
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from scraper.cli import SUBCOMMANDS, build_parser
from scraper.config import DEFAULT_SELECTOR, ConfigError, load_settings, unknown_environment
from scraper.discovery.pods import Ignore, Scrape, Wait, classify
from scraper.scrape.exporter import ExporterScraper, ScrapeLimits, parse_text
from scraper.scrape.scheduling import (
    PHASES,
    SOON_PER_SECOND,
    SOON_SECONDS,
    TargetScheduler,
    first_run,
    offset_seconds,
)
from scraper.shared.scrapes import Busy, Failure, FailureKind, Fresh, NothingYet
from scraper.shared.targets import Final, Target
from scraper.syntax import parse_duration
from scraper.telemetry import JobView, Telemetry
from tests.helpers.scraper import REPO
from tests.helpers.waits import until


def test_flags_env_file_precedence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "scraper.yaml"
    cfg.write_text("interval: 45s\nwrite-qps: 2\nnamespaces: [a, b]\n")
    settings = load_settings({}, cfg)
    assert (settings.interval, settings.write_qps, settings.namespaces) == (45.0, 2.0, ["a", "b"])
    monkeypatch.setenv("TRAINJOB_SCRAPER_INTERVAL", "2m")
    assert load_settings({}, cfg).interval == 120.0
    assert load_settings({"interval": "5"}, cfg).interval == 5.0
    assert load_settings({}).selector == DEFAULT_SELECTOR


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        # The selector's grammar is the API server's: tests/scraper/test_selector.py.
        ({"selector": " "}, "selector=' ': empty selector"),
        ({"interval": "500ms"}, "interval='500ms': must be between 1s and 1h"),
        ({"interval": "2h"}, "interval='2h': must be between 1s and 1h"),
        ({"interval": "soon"}, "interval='soon': not a duration"),
        ({"listen_port": "99999"}, "listen-port='99999'"),
        ({"default_port": "0"}, "default-port='0'"),
        ({"namespaces": "ok,Bad_NS"}, "'Bad_NS' is not a namespace name"),
        # Before, a missing file surfaced as "cannot reach Kubernetes: Invalid kube-config
        # file. No configuration found." without its path.
        ({"kubeconfig": "/nonexistent/kc"}, "kubeconfig='/nonexistent/kc': Path does not "
                                            "point to a file"),
        ({"kubeconfig": "/"}, "kubeconfig='/': Path does not point to a file"),
        # Before: "write-qps='nan': Input should be less than or equal to 1000".
        ({"write_qps": "nan"}, "write-qps='nan': Input should be a finite number"),
        ({"log_qps": "inf"}, "log-qps='inf': Input should be a finite number"),
        # Before: accepted, and the write budget divided by zero after its first burst.
        ({"write_qps": "5e-324"}, "write-qps='5e-324': Input should be greater than or "
                                  "equal to 0.01"),
        ({"log_qps": "1e-9"}, "log-qps='1e-9': Input should be greater than or equal to 0.01"),
    ],
)
def test_bad_option_named_with_its_value(flags: dict[str, str], expected: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_settings(flags)
    assert expected in str(err.value)


def test_bad_file_option(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("intervall: 3s\n")
    with pytest.raises(ConfigError, match="unknown option 'intervall'"):
        load_settings({}, cfg)


def test_a_removed_option_is_refused_with_its_replacement_wherever_it_is_set(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """In the config file (every bad key named at once) and in the environment, where
    pydantic-settings would otherwise ignore it and run with the new defaults."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text("metrics-write-interval: 5s\nintervall: 3s\n")
    with pytest.raises(ConfigError) as err:
        load_settings({}, cfg)
    assert len(err.value.problems) == 2, err.value.problems
    assert "option 'metrics-write-interval' was removed: replaced by metrics-staleness" \
        in err.value.problems[0]
    assert "unknown option 'intervall'" in err.value.problems[1]
    monkeypatch.setenv("TRAINJOB_SCRAPER_METRICS_WRITE_INTERVAL", "5s")
    with pytest.raises(ConfigError, match="TRAINJOB_SCRAPER_METRICS_WRITE_INTERVAL: option "
                       "was removed: replaced by metrics-staleness"):
        load_settings({})
    # In any case, as the current options' variables are read (a newcomer's find).
    monkeypatch.delenv("TRAINJOB_SCRAPER_METRICS_WRITE_INTERVAL")
    monkeypatch.setenv("trainjob_scraper_metrics_write_interval", "5s")
    with pytest.raises(ConfigError, match="trainjob_scraper_metrics_write_interval: option "
                       "was removed"):
        load_settings({})


def test_an_option_from_the_environment_is_named_by_its_variable(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAINJOB_SCRAPER_INTERVAL", "abc")
    with pytest.raises(ConfigError) as err:
        load_settings({})
    (problem,) = err.value.problems
    assert problem.startswith("TRAINJOB_SCRAPER_INTERVAL='abc': not a duration")
    # Given as a flag too, the flag is what was read: named as the option.
    with pytest.raises(ConfigError) as flag:
        load_settings({"interval": "xyz"})
    assert flag.value.problems[0].startswith("interval='xyz': not a duration")


def test_a_misspelled_variable_is_warned_about_and_service_links_are_not(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAINJOB_SCRAPER_INTERVALL", "5s")
    # What Kubernetes sets in every pod for a Service named trainjob-scraper, or named
    # after a release (trainjob-scraper-prod: a newcomer saw warnings for those).
    for link in ("SERVICE_HOST", "SERVICE_PORT", "SERVICE_PORT_METRICS", "PORT",
                 "PORT_8080_TCP", "PORT_8080_TCP_ADDR", "PORT_8080_TCP_PROTO"):
        monkeypatch.setenv(f"TRAINJOB_SCRAPER_{link}", "x")
        monkeypatch.setenv(f"TRAINJOB_SCRAPER_PROD_{link}", "x")
    monkeypatch.setenv("TRAINJOB_SCRAPER_INTERVAL", "20s")
    assert load_settings({}).interval == 20.0  # a warning, not a refusal
    assert unknown_environment() == [
        "TRAINJOB_SCRAPER_INTERVALL: no option 'intervall'; the variable is ignored "
        "(every option: trainjob-scraper run --help)"]


def test_a_misspelled_variable_is_shown_beside_an_invalid_option() -> None:
    # The warning used to be logged after the options were checked, at the log level
    # chosen: an invalid option or --log-level ERROR hid it.
    env = {**os.environ, "TRAINJOB_SCRAPER_INTERVALL": "5s"}
    bad = subprocess.run([sys.executable, "-m", "scraper", "run", "--log-level", "ERROR",
                          "--interval", "0s"], cwd=REPO, capture_output=True, text=True,
                         timeout=60, env=env)
    assert bad.returncode == 2
    assert "warning: TRAINJOB_SCRAPER_INTERVALL: no option 'intervall'" in bad.stderr
    assert "interval='0s'" in bad.stderr


def test_an_option_twice_in_the_config_file_is_refused(tmp_path: Path) -> None:
    cfg = tmp_path / "scraper.yaml"
    cfg.write_text("write-qps: 2\nwrite_qps: 5\n")
    with pytest.raises(ConfigError) as err:
        load_settings({}, cfg)
    assert err.value.problems == [
        f"config={str(cfg)!r}: option 'write_qps' given twice (also as 'write-qps')"]
    # The same key twice: YAML's loader would keep the last one silently.
    cfg.write_text("write-qps: 2\ninterval: 20s\nwrite-qps: 5\n")
    with pytest.raises(ConfigError) as twice:
        load_settings({}, cfg)
    assert twice.value.problems == [
        f"config={str(cfg)!r}: option 'write-qps' given twice (lines 1 and 3)"]
    # A YAML merge key still works (a newcomer's find: the loader lost it): the
    # mapping's own key overrides the merged one, the other merged key stays.
    cfg.write_text("<<: {write-qps: 2, interval: 45s}\nwrite-qps: 5\n")
    merged = load_settings({}, cfg)
    assert (merged.write_qps, merged.interval) == (5, 45)


def test_a_bad_value_in_the_config_file_names_the_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "scraper.yaml"
    cfg.write_text("write-qps: lots\n")
    with pytest.raises(ConfigError) as err:
        load_settings({}, cfg)
    (problem,) = err.value.problems
    assert problem.startswith(f"config={str(cfg)!r}: write-qps='lots': "), problem
    # A flag or a variable wins over the file: then that is what is named.
    with pytest.raises(ConfigError) as flag:
        load_settings({"write_qps": "many"}, cfg)
    assert flag.value.problems[0].startswith("write-qps='many': "), flag.value.problems
    monkeypatch.setenv("TRAINJOB_SCRAPER_WRITE_QPS", "some")
    with pytest.raises(ConfigError) as env:
        load_settings({}, cfg)
    assert env.value.problems[0].startswith("TRAINJOB_SCRAPER_WRITE_QPS='some': ")


@pytest.mark.parametrize("option", ["scrape_timeout", "retry_period", "lease_duration",
                                    "renew_deadline", "metrics_auth_cache_ttl"])
def test_a_negative_duration_of_an_option_above_zero_gets_its_one_limit(option: str) -> None:
    for value in ("-1s", "0s"):
        with pytest.raises(ConfigError) as err:
            load_settings({option: value})
        assert err.value.problems == [f"{option.replace('_', '-')}={value!r}: must be > 0"]


def test_lease_timings_checked() -> None:
    # Named as the flags are spelled (a newcomer saw the Python field names here).
    with pytest.raises(ConfigError, match=r"retry-period \(2s\) < renew-deadline \(20s\) "
                       r"< lease-duration \(15s\)"):
        load_settings({"leader_election": True, "renew_deadline": "20s"})


def test_cli_help_and_errors() -> None:
    help_text = subprocess.run([sys.executable, "-m", "scraper", "run", "--help"], cwd=REPO,
                               capture_output=True, text=True, timeout=60, check=True).stdout
    for option in ("--selector", "--interval", "--leader-election", "TRAINJOB_SCRAPER_INTERVAL",
                   "--write-qps", "--config"):
        assert option in help_text
    bad = subprocess.run([sys.executable, "-m", "scraper", "run", "--interval", "0s",
                          "--default-port", "http"], cwd=REPO, capture_output=True, text=True,
                         timeout=60)
    assert bad.returncode == 2
    assert "interval='0s'" in bad.stderr and "default-port='http'" in bad.stderr
    # Durations' defaults in the unit they are typed in (a newcomer read "30.0").
    flat = " ".join(help_text.split())
    assert "TRAINJOB_SCRAPER_INTERVAL; default: 30s]" in flat
    assert "TRAINJOB_SCRAPER_PROGRESS_FLOOR; default: 1s]" in flat
    assert "TRAINJOB_SCRAPER_STALL_AFTER; default: auto]" in flat  # None means auto
    # A flag of an earlier release names what replaced it.
    gone = subprocess.run([sys.executable, "-m", "scraper", "run",
                           "--metrics-write-interval=5s"], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert gone.returncode == 2
    assert "--metrics-write-interval was removed" in gone.stderr
    assert "metrics-staleness" in gone.stderr and "progress-floor" in gone.stderr


def test_subcommands_are_pluggable() -> None:
    added = []

    def add_hello(subparsers):  # type: ignore[no-untyped-def]
        p = subparsers.add_parser("hello")
        p.set_defaults(handler=lambda args: added.append("ran") or 7)

    SUBCOMMANDS.append(add_hello)
    try:
        args = build_parser().parse_args(["hello"])
        assert args.handler(args) == 7 and added == ["ran"]
    finally:
        SUBCOMMANDS.remove(add_hello)


def test_durations() -> None:
    assert parse_duration("1h30m") == 5400
    assert parse_duration("250ms") == 0.25
    assert parse_duration(15) == 15.0
    with pytest.raises(ValueError):
        parse_duration("-3s")


def test_offsets_deterministic_and_spread() -> None:
    keys = [f"ns/pod-{i}" for i in range(200)]
    offsets = [offset_seconds(k, 30) for k in keys]
    assert offsets == [offset_seconds(k, 30) for k in keys]  # same in every process/run
    assert all(0 <= o < 30 for o in offsets)
    # Spread: every 3-second slot of the interval holds some targets.
    assert len({int(o // 3) for o in offsets}) == 10
    at = first_run("ns/pod-1", 30, now=1_000_000.0).timestamp()
    assert 1_000_000.0 < at <= 1_000_030.0
    assert (at % 30) == pytest.approx(offset_seconds("ns/pod-1", 30))


def test_prometheus_text_fallback() -> None:
    text = (
        b"# TYPE trainjob_progress_ratio gauge\ntrainjob_progress_ratio 0.42\n"
        b"trainjob_estimated_remaining_seconds 120.4\n"
        b"trainjob_last_update_timestamp_seconds 1700000000\n"
        b'trainjob_metric{name="loss"} 0.25\ntrainjob_metric{name="step"} 300\n'
        b'trainjob_metric_info{name="phase",value="warmup"} 1\n'
    )
    result = parse_text(text, '"x"')
    assert isinstance(result, Fresh)
    s = result.status
    assert (s.progress_percentage, s.estimated_remaining_seconds) == (42, 120)
    assert s.metrics_dict() == {"loss": "0.25", "step": "300", "phase": "warmup"}
    assert s.last_updated_time.timestamp() == 1_700_000_000
    assert isinstance(parse_text(b"other_metric 1\n"), NothingYet)
    bad = parse_text(b"trainjob_progress_ratio 1.7\ntrainjob_last_update_timestamp_seconds 1\n")
    assert isinstance(bad, Failure) and bad.kind is FailureKind.INVALID
    assert "progressPercentage=170" in bad.detail


def _pod(phase: str = "Running", ip: str | None = "10.0.0.7", **annotations: str) -> dict:
    return {
        "metadata": {"namespace": "ns", "name": "p", "uid": "u",
                     "labels": {"jobset.sigs.k8s.io/jobset-name": "tj"},
                     "annotations": annotations},
        "status": {"phase": phase, "podIP": ip},
    }


def test_a_host_network_pods_hostname_is_not_compared() -> None:
    """A hostNetwork pod's containers have the node's hostname (the kubelet names only pods
    with a network namespace of their own), so its exporter states that: expecting the pod
    name there refused every answer of such a pod (a newcomer's finding)."""
    kw = {"default_port": 28080, "default_path": "/metrics", "default_interval": 30.0}
    own = classify(_pod(), **kw)
    assert isinstance(own, Scrape) and own.target.hostname == "p"
    host = {**_pod(), "spec": {"hostNetwork": True, "hostname": "llm-node-0-0"}}
    shared = classify(host, **kw)
    assert isinstance(shared, Scrape) and shared.target.hostname == ""


def test_pod_annotations() -> None:
    kw = {"default_port": 28080, "default_path": "/metrics", "default_interval": 30.0}
    d = classify(_pod(), **kw)
    assert isinstance(d, Scrape) and d.target.url == "http://10.0.0.7:28080/metrics"
    d = classify(_pod(**{"prometheus.io/port": "9000", "prometheus.io/path": "/m",
                         "trainjob-progress.dev/interval": "5s"}), **kw)
    assert isinstance(d, Scrape)
    assert (d.target.url, d.target.interval) == ("http://10.0.0.7:9000/m", 5.0)
    d = classify(_pod(**{"prometheus.io/port": "9000", "trainjob-progress.dev/port": "9100"}),
                 **kw)
    assert isinstance(d, Scrape) and ":9100/" in d.target.url  # ours first
    assert isinstance(classify(_pod(**{"trainjob-progress.dev/scrape": "false"}), **kw), Ignore)
    bad = classify(_pod(**{"trainjob-progress.dev/port": "http"}), **kw)
    assert isinstance(bad, Ignore) and "'http'" in bad.reason
    assert isinstance(classify(_pod(**{"trainjob-progress.dev/interval": "0.1s"}), **kw), Ignore)
    assert isinstance(classify(_pod(ip=None), **kw), Wait)
    assert isinstance(classify(_pod(phase="Pending"), **kw), Wait)
    assert isinstance(classify(_pod(phase="Succeeded"), **kw), Final)
    assert isinstance(classify(_pod(ip="fd00::7"), **kw), Scrape)


def _ended(name: str, message: str) -> dict:
    return {"name": name, "state": {"terminated": {"exitCode": 0, "message": message}}}


def test_final_messages_native_sidecar_first_and_the_annotation_picks_one() -> None:
    kw = {"default_port": 28080, "default_path": "/metrics", "default_interval": 30.0}
    pod = _pod(phase="Succeeded")
    pod["spec"] = {"initContainers": [{"name": "setup"},
                                      {"name": "exporter", "restartPolicy": "Always"}],
                   "containers": [{"name": "node"}]}
    pod["status"]["initContainerStatuses"] = [_ended("setup", "setup done"),
                                              _ended("exporter", "from the sidecar")]
    pod["status"]["containerStatuses"] = [_ended("node", "from the trainer")]
    d = classify(pod, **kw)
    # The sidecar stops after the trainer, so it is tried first; an ordinary init
    # container ran before training and is never read.
    assert isinstance(d, Final)
    assert d.messages == (("exporter", "from the sidecar"), ("node", "from the trainer"))
    pod["metadata"]["annotations"] = {"trainjob-progress.dev/container": "node"}
    assert classify(pod, **kw).messages == (("node", "from the trainer"),)  # type: ignore[union-attr]
    pod["metadata"]["annotations"] = {"trainjob-progress.dev/container": "exporter"}
    assert classify(pod, **kw).messages == (("exporter", "from the sidecar"),)  # type: ignore[union-attr]
    pod["metadata"]["annotations"] = {"trainjob-progress.dev/container": "setup"}
    assert classify(pod, **kw).messages == ()  # type: ignore[union-attr]


def test_offsets_fall_on_the_phase_grid() -> None:
    keys = [f"ns/pod-{i}" for i in range(400)]
    for interval in (1.0, 30.0, 3600.0):
        step = interval / PHASES
        offsets = {offset_seconds(k, interval) for k in keys}
        # Every phase is used (400 keys over 20 phases) and nothing lies between them.
        assert len(offsets) == PHASES
        assert all(o / step == pytest.approx(round(o / step)) for o in offsets)


async def test_scheduler_runs_each_target_once_per_interval_at_its_phase() -> None:
    runs: dict[str, list[float]] = {}

    async def scrape(key: str) -> None:
        runs.setdefault(key, []).append(time.time())
        await asyncio.sleep(0.3)  # slower than a phase step: runs must still not overlap

    scheduler = TargetScheduler(scrape)
    targets = [Target("ns", f"job-{i}", f"pod-{i}", "uid", f"http://127.0.0.1:1/{i}", 1.0)
               for i in range(30)]
    others = [t.key for t in targets[1:]]

    def each_ran(times: dict[str, int]) -> bool:
        return all(len(runs.get(key, [])) >= n for key, n in times.items())

    try:
        for target in targets:  # the start-up list: scheduled before the scheduler runs
            scheduler.schedule(target)
        scheduler.start()
        await until(lambda: each_ran({t.key: 3 for t in targets}), 20, "three runs of each")
        scheduler.unschedule(targets[0].key)
        before = len(runs[targets[0].key])
        # Two more runs of every other target: the unscheduled one had its turn twice.
        want = {k: len(runs[k]) + 2 for k in others}
        await until(lambda: each_ran(want), 20, "two more runs of each other target")
    finally:
        scheduler.shutdown()
    assert set(runs) == {t.key for t in targets}
    assert len(runs[targets[0].key]) == before  # unscheduled: no more runs
    # Timing is the behaviour here: one run per interval (1 s), at the target's phase.
    # The slack, 0.4 s on the gaps and 0.3 s on the phase, absorbs a loaded machine's
    # lateness of the event loop and still tells the wrong schedules apart: a missed
    # interval (a gap of 2 s) and a doubled run (a gap of at most 0.5 s; the runs take
    # 0.3 s and must not overlap).
    for key in others:
        stamps = runs[key]
        gaps = [b - a for a, b in itertools.pairwise(stamps)]
        assert all(0.6 < g < 1.4 for g in gaps), (key, gaps)
        phase = offset_seconds(key, 1.0)
        assert all(abs((s - phase + 0.5) % 1.0 - 0.5) < 0.3 for s in stamps), (phase, stamps)


async def test_new_targets_are_scraped_within_a_second_a_surge_takes_turns() -> None:
    # A new training's pod, and the lists at start-up or at a Lease gain: each first
    # scrape (which opens the waiting scrape) comes within SOON_SECONDS of its turn, at
    # most SOON_PER_SECOND early runs a second, never later than its phase.  Before
    # issue 26's fix the targets over the first SOON_PER_SECOND waited for their phase
    # (up to an interval: 60 s here), polled until then.
    runs: dict[str, list[float]] = {}

    async def scrape(key: str) -> None:
        runs.setdefault(key, []).append(time.monotonic())

    scheduler = TargetScheduler(scrape)
    scheduler.start()
    interval = 60.0
    surge = 4 * int(SOON_PER_SECOND)
    over = (surge - SOON_PER_SECOND) / SOON_PER_SECOND  # seconds of turns beyond the burst
    targets = [Target("ns", f"job-{i}", f"pod-{i}", "uid", f"http://127.0.0.1:1/{i}",
                      interval) for i in range(surge)]
    try:
        began = time.monotonic()
        began_wall = time.time()
        for target in targets:
            scheduler.schedule(target)
        scheduled = time.monotonic() - began
        # The ones whose phase falls in the observed window may run then (wall clock).
        at_phase = sum(1 for t in targets
                       if first_run(t.key, interval, began_wall).timestamp() - began_wall
                       <= SOON_SECONDS + over + 1.0)
        # Until every target ran; bounded far below the interval (60 s), which a target
        # that waited for its phase would take.
        await until(lambda: len(runs) == surge, 20, "a first run of every target")
        # A retry asked for sooner than the next run happens then (not an interval later).
        last = targets[-1]
        before = len(runs[last.key])
        scheduler.run_within(last.key, 0.2)  # its next run is an interval away
        await until(lambda: len(runs[last.key]) > before, 10, "the retry's run")
    finally:
        scheduler.shutdown()
    # Every target ran once, within its turn.  Timing is the behaviour here; the slack,
    # 0.8 s, is a loaded machine's lateness of the event loop, and far below the 60 s a
    # target that waited for its phase could take.
    assert len(runs) == surge, (len(runs), surge)
    firsts = sorted(stamps[0] - began for stamps in runs.values())
    assert firsts[-1] <= SOON_SECONDS + over + scheduled + 0.8, firsts[-5:]
    # Turns: by any moment t no more than the burst plus t's refill ran early.
    for t in (0.5, 1.0, 2.0):
        ran = sum(1 for f in firsts if f <= t)
        assert ran <= SOON_PER_SECOND * (1 + t + scheduled) + at_phase + 1, (t, ran)
    assert len(runs[last.key]) > before


async def test_skipped_runs_are_counted_and_warned_once_a_minute(
        caplog: pytest.LogCaptureFixture) -> None:
    skipped: list[str] = []

    async def scrape(key: str) -> None:
        await asyncio.sleep(1.6)  # longer than the interval: the next run finds it running

    scheduler = TargetScheduler(scrape, on_skipped=skipped.append)
    scheduler.start()
    targets = [Target("ns", f"job-{i}", f"pod-{i}", "uid", f"http://127.0.0.1:1/{i}", 1.0)
               for i in range(3)]
    try:
        with caplog.at_level("INFO"):
            for target in targets:
                scheduler.schedule(target)
            # Each run takes 1.6 s of its 1 s interval: the next one finds it running.
            await until(lambda: len(skipped) >= 3, 20, "three skipped runs")
    finally:
        scheduler.shutdown()
    assert len(skipped) >= 3 and set(skipped) <= {t.key for t in targets}, skipped
    assert not [r for r in caplog.records if "maximum number of running" in r.getMessage()]
    ours = [r for r in caplog.records if "skipped since start" in r.getMessage()]
    assert len(ours) == 1 and ours[0].levelname == "WARNING", [r.getMessage() for r in ours]


async def test_a_job_replaced_while_its_run_holds_stays_paused() -> None:
    """A target whose run holds its waiting scrape (scraper/scrape/loop.py, ``_hold``)
    keeps its job paused when the target changes but its URL does not (an interval or a
    policy annotation): the new job's firings would only find the run going on and
    count as skipped runs, with a WARNING to raise --concurrency."""
    skipped: list[str] = []
    holding = asyncio.Event()
    release = asyncio.Event()

    async def scrape(key: str) -> None:
        scheduler.holding(key, True)  # as ScrapeLoop._hold does
        holding.set()
        try:
            await asyncio.wait_for(release.wait(), 30)
        finally:
            scheduler.holding(key, False)

    scheduler = TargetScheduler(scrape, on_skipped=skipped.append)
    scheduler.start()
    target = Target("ns", "job", "pod", "uid", "http://127.0.0.1:1/", 1.0)
    try:
        scheduler.schedule(target)
        await asyncio.wait_for(holding.wait(), 10)
        scheduler.schedule(replace(target, interval=2.0))  # same URL: the run goes on
        # Nothing to wait for but time: three intervals of the new job, each of which
        # would have fired once unpaused (the old code counted them as skipped).
        await asyncio.sleep(6.0)
        assert skipped == []
        release.set()
    finally:
        scheduler.shutdown()


async def test_scrapes_cancelled_at_shutdown_log_no_error(
        caplog: pytest.LogCaptureFixture) -> None:
    started = asyncio.Event()
    runs: list[asyncio.Task[object]] = []

    async def scrape(key: str) -> None:
        task = asyncio.current_task()
        assert task is not None
        runs.append(task)  # the scheduler's task of this run
        started.set()
        await asyncio.sleep(30)  # a hung exporter: still in flight at shutdown

    scheduler = TargetScheduler(scrape)
    scheduler.start()
    with caplog.at_level("INFO"):
        scheduler.schedule(Target("ns", "job", "pod", "uid", "http://127.0.0.1:1/", 1.0))
        await asyncio.wait_for(started.wait(), 5)
        scheduler.shutdown()
        # Until the runs' tasks ended: their done-callbacks (APScheduler's, which would
        # log an error) were added before asyncio.wait's own, so they ran by its return.
        _, pending = await asyncio.wait(runs, timeout=10)
        assert not pending, "a run still in flight 10 s after the shutdown"
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, [r.getMessage() for r in errors]


def test_target_up_absent_until_the_first_scrape() -> None:
    views = [JobView("ns", "new", "new-pod"), JobView("ns", "ok", "ok-pod", up=True),
             JobView("ns", "down", "down-pod", up=False)]
    text = Telemetry(lambda: views).render().decode()
    ups = [line for line in text.splitlines() if line.startswith("trainjob_scraper_target_up{")]
    assert len(ups) == 2, ups
    assert any('trainjob="ok"' in line and line.endswith(" 1.0") for line in ups)
    assert any('trainjob="down"' in line and line.endswith(" 0.0") for line in ups)


async def test_metrics_render_leaves_the_event_loop_running() -> None:
    """The render of /metrics runs off the loop: a collector that can only finish once the
    loop has run (it waits for a flag the test sets after /healthz was answered
    mid-render) finishes.  Rendered on the loop, /healthz would wait for the render and
    the collector would time out."""
    import threading
    import urllib.request

    from prometheus_client.metrics_core import GaugeMetricFamily

    collecting, loop_ran = threading.Event(), threading.Event()
    seen: list[bool] = []

    class WaitsForTheLoop:
        def collect(self):  # type: ignore[no-untyped-def]
            collecting.set()
            seen.append(loop_ran.wait(timeout=5.0))
            yield GaugeMetricFamily("loop_ran", "1 when the loop ran during the render",
                                    value=1.0 if seen[-1] else 0.0)

    telemetry = Telemetry(lambda: [])
    telemetry.registry.register(WaitsForTheLoop())  # type: ignore[arg-type]
    port = await telemetry.start("127.0.0.1", 0)
    try:
        def get(path: str) -> str:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
                return str(r.read().decode())

        metrics = asyncio.create_task(asyncio.to_thread(get, "/metrics"))
        assert await asyncio.to_thread(collecting.wait, 10.0)
        assert await asyncio.to_thread(get, "/healthz") == "ok\n"  # served mid-render
        loop_ran.set()
        text = await metrics
    finally:
        loop_ran.set()
        await telemetry.stop()
    assert seen[-1] is True
    assert "loop_ran 1.0" in text


async def test_a_run_waits_for_a_slot_at_most_one_scrape_timeout() -> None:
    accepted = asyncio.Event()

    async def hang(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.set()
        await asyncio.sleep(20)  # accepts, never answers: a hung exporter
        writer.close()

    server = await asyncio.start_server(hang, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))  # bound, not listening: connections are refused
    refused_port = closed.getsockname()[1]
    scraper = ExporterScraper(ScrapeLimits(timeout=10.0, concurrency=1))
    try:
        # Interval 20 s: the hung scrape may hold the only slot for 10 s.
        hung = Target("ns", "hung", "hung-0", "u", f"http://127.0.0.1:{port}/metrics", 20.0)
        # Interval 1 s: timeout 0.9 s, for the request and for the wait for a slot.
        other = Target("ns", "other", "other-0", "u",
                       f"http://127.0.0.1:{refused_port}/metrics", 1.0)
        first = asyncio.create_task(scraper.scrape(hung))
        await asyncio.wait_for(accepted.wait(), 10)  # the hung scrape holds the slot
        t0 = time.monotonic()
        assert isinstance(await scraper.scrape(other), Busy)
        # Timing is the behaviour: it waited for the slot (over 0.8 s of its 0.9 s
        # timeout), and no longer than that timeout plus 2.1 s of a loaded machine's
        # lateness, far below the 10 s the hung scrape holds the slot.
        assert 0.8 < time.monotonic() - t0 < 3.0
        first.cancel()  # the hung scrape ends: its slot comes free
        with contextlib.suppress(asyncio.CancelledError):
            await first
        again = await scraper.scrape(other)
        assert isinstance(again, Failure) and again.kind is FailureKind.REFUSED
    finally:
        await scraper.close()
        closed.close()
        server.close()


def test_a_kubeconfig_that_does_not_parse_is_called_that_not_unreachable(
        tmp_path: Path) -> None:
    """A newcomer's find: a YAML error in the kubeconfig said "cannot reach Kubernetes"."""
    bad = tmp_path / "bad.kubeconfig"
    bad.write_text("this: is: not: yaml: [\n")
    run = subprocess.run([sys.executable, "-m", "scraper", "run", "--kubeconfig", str(bad)],
                         cwd=REPO, capture_output=True, text=True, timeout=60)
    assert run.returncode == 1, run.stderr
    assert (f"trainjob-scraper: cannot load the Kubernetes configuration from --kubeconfig "
            f"{bad}: mapping values are not allowed here") in run.stderr, run.stderr
    assert "cannot reach" not in run.stderr


@pytest.mark.parametrize(("argv", "expected"), [
    # argparse took "-1s" for an unknown option: "expected one argument", no limit.
    (["--resync-interval", "-1s"], "resync-interval='-1s': must be >= 0"),
    (["--metrics-staleness", "-1s"], "metrics-staleness='-1s': must be between 0s and 3600s"),
    (["--scrape-timeout", "-1"], "scrape-timeout='-1': must be > 0"),
    # Was "not a duration: '-1' (must be >= 0)": a negative duration is a duration.
    (["--backoff-max=-1"], "backoff-max='-1': must be >= 0"),
    # A value that is no number at all is told the limits too (a newcomer's finds).
    (["--write-qps", "lots"], "write-qps='lots': Input should be a valid number, unable to "
                              "parse string as a number; must be between 0.01 and 1000"),
    (["--concurrency", "x"], "concurrency='x': Input should be a valid integer, unable to "
                             "parse string as an integer; must be between 1 and 1024"),
    (["--write-qps", "nan"], "write-qps='nan': Input should be a finite number; must be "
                             "between 0.01 and 1000"),
    # The bound as written, not 6.71089e+07.
    (["--max-body-bytes", "1KiB"], "max-body-bytes='1KiB': Input should be a valid integer, "
                                   "unable to parse string as an integer; must be between "
                                   "1024 and 67108864"),
])
def test_a_rejected_flag_names_the_option_the_value_and_the_limit(
        argv: list[str], expected: str, capsys: pytest.CaptureFixture[str]) -> None:
    from scraper.cli import main

    assert main(["run", *argv]) == 2
    err = capsys.readouterr().err
    assert f"trainjob-scraper: invalid configuration: {expected}" in err, err


def test_namespaces_from_the_environment_take_the_documented_comma_form(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A newcomer's find: pydantic-settings parsed a list variable as JSON, so
    ``TRAINJOB_SCRAPER_NAMESPACES=a,b`` ended in a traceback."""
    monkeypatch.setenv("TRAINJOB_SCRAPER_NAMESPACES", "team-a, team-b")
    assert load_settings({}, None).namespaces == ["team-a", "team-b"]
    monkeypatch.setenv("TRAINJOB_SCRAPER_NAMESPACES", "[1")
    with pytest.raises(ConfigError) as err:
        load_settings({}, None)
    assert err.value.problems == ["TRAINJOB_SCRAPER_NAMESPACES='[1': '[1' is not a namespace name"]


def test_a_config_file_that_is_not_utf8_is_refused_by_name(tmp_path: Path) -> None:
    cfg = tmp_path / "scraper.yaml"
    cfg.write_bytes(b"\x00\xff")
    with pytest.raises(ConfigError) as err:
        load_settings({}, cfg)
    assert err.value.problems[0].startswith(f"config={str(cfg)!r}: cannot read ("), err.value
