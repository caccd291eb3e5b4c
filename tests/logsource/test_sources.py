"""Which pods are read from their log, and which container (scraper/discovery/pods.py)."""

from __future__ import annotations

from typing import Any

import pytest

from scraper.discovery.pods import Ignore, Scrape, classify
from scraper.shared.targets import Final
from scraper.shared.trainjobs import record_from_object


def pod(annotations: dict[str, str], containers: list[str], phase: str = "Running"
        ) -> dict[str, Any]:
    return {"metadata": {"namespace": "ns", "name": "p", "uid": "u",
                         "labels": {"jobset.sigs.k8s.io/jobset-name": "job"},
                         "annotations": annotations},
            "spec": {"containers": [{"name": c} for c in containers]},
            "status": {"phase": phase, "podIP": "127.0.0.1"}}


def decide(p: dict[str, Any]) -> Any:
    return classify(p, default_port=28080, default_path="/metrics", default_interval=30.0)


@pytest.mark.parametrize("value, expected", [(None, "exporter"), ("logs", "logs"),
                                             ("AUTO", "auto"), ("exporter", "exporter")])
def test_source_annotation_reaches_the_target(value: str | None, expected: str) -> None:
    annotations = {} if value is None else {"trainjob-progress.dev/source": value}
    decision = decide(pod(annotations, ["sidecar", "node"]))
    assert isinstance(decision, Scrape)
    assert (decision.target.source, decision.target.log_container) == (expected, "node")


def test_a_bad_source_is_refused_naming_the_annotation_and_value() -> None:
    decision = decide(pod({"trainjob-progress.dev/source": "stdout"}, ["node"]))
    assert isinstance(decision, Ignore) and decision.misconfigured
    assert "trainjob-progress.dev/source='stdout'" in decision.reason
    assert "exporter, logs, auto" in decision.reason


def test_container_annotation_else_node_else_first() -> None:
    named = decide(pod({"trainjob-progress.dev/container": "trainer"}, ["node", "trainer"]))
    first = decide(pod({}, ["main", "helper"]))
    assert isinstance(named, Scrape) and named.target.log_container == "trainer"
    assert isinstance(first, Scrape) and first.target.log_container == "main"


def test_ended_pod_keeps_its_source_for_the_final_read() -> None:
    decision = decide(pod({"trainjob-progress.dev/source": "logs"}, ["node"], "Succeeded"))
    assert isinstance(decision, Final)
    assert (decision.source, decision.log_container, decision.messages) == ("logs", "node", ())


def test_trainjob_annotation_is_held_for_its_pods() -> None:
    held = record_from_object({"metadata": {"uid": "t", "annotations": {
        "trainjob-progress.dev/source": "Logs"}}})
    assert held.source == "logs"
    assert record_from_object({"metadata": {"uid": "t"}}).source is None
