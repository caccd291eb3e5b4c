"""Trainer API limits: the shared model at and past each boundary, and update()'s rules."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

import pytest

from exporter_lib.state import State
from exporter_lib.status import StatusError, TrainerStatus

STAMP = "2025-01-01T00:00:00Z"


def status(**fields: Any) -> TrainerStatus:
    return TrainerStatus.from_api({"lastUpdatedTime": STAMP, **fields})


@pytest.mark.parametrize("value", [0, 1, 99, 100])
def test_progress_within_limits(value: int) -> None:
    assert status(progressPercentage=value).progress_percentage == value


@pytest.mark.parametrize(("value", "limit"), [(-1, "0"), (101, "100")])
def test_progress_past_limits_names_field_value_limit(value: int, limit: str) -> None:
    with pytest.raises(StatusError) as err:
        status(progressPercentage=value)
    text = str(err.value)
    assert f"progressPercentage={value}" in text and limit in text


@pytest.mark.parametrize("value", [0, 2**31 - 1])
def test_remaining_within_limits(value: int) -> None:
    assert status(estimatedRemainingSeconds=value).estimated_remaining_seconds == value


@pytest.mark.parametrize(("value", "limit"), [(-1, "0"), (2**31, str(2**31 - 1))])
def test_remaining_past_limits(value: int, limit: str) -> None:
    with pytest.raises(StatusError) as err:
        status(estimatedRemainingSeconds=value)
    assert f"estimatedRemainingSeconds={value}" in str(err.value) and limit in str(err.value)


@pytest.mark.parametrize("length", [1, 64])
def test_metric_lengths_within_limits(length: int) -> None:
    s = status(metrics=[{"name": "n" * length, "value": "v" * length}])
    assert s.metrics[0].name == "n" * length and s.metrics[0].value == "v" * length


@pytest.mark.parametrize(("field", "length"), [("name", 0), ("name", 65), ("value", 0),
                                               ("value", 65)])
def test_metric_lengths_past_limits(field: str, length: int) -> None:
    metric = {"name": "n", "value": "v", field: "x" * length}
    with pytest.raises(StatusError) as err:
        status(metrics=[metric])
    text = str(err.value)
    assert f"metrics[0].{field}=" in text
    assert ("64" in text) if length else ("1" in text)


def test_metric_count_at_and_past_limit() -> None:
    items = [{"name": f"m{i}", "value": "1"} for i in range(257)]
    assert len(status(metrics=items[:256]).metrics) == 256
    with pytest.raises(StatusError) as err:
        status(metrics=items)
    assert "metrics=<257 items>" in str(err.value) and "256" in str(err.value)


def test_last_updated_time_required_and_rfc3339() -> None:
    with pytest.raises(StatusError, match="lastUpdatedTime=<missing>"):
        TrainerStatus.from_api({"progressPercentage": 1})
    s = TrainerStatus.from_api({"lastUpdatedTime": "2025-01-01T00:00:00.123456+00:00"})
    assert s.to_api()["lastUpdatedTime"] == STAMP


def test_non_integer_progress_rejected() -> None:
    with pytest.raises(StatusError, match=r"progressPercentage=50\.5"):
        status(progressPercentage=50.5)


# -- update() rules --------------------------------------------------------------

def fresh() -> State:
    return State(clock=lambda: datetime(2025, 1, 1, tzinfo=UTC).timestamp())


@pytest.mark.parametrize(("given", "stored"), [
    (0, 0), (100, 100), (42.9, 42), (99.99, 99), (-1, 0), (101, 100), (1e9, 100), (-0.5, 0),
])
def test_update_progress_floors_and_clamps(given: float, stored: int) -> None:
    state = fresh()
    state.update(progress_percentage=given)
    assert state.status() is not None
    assert state.status().progress_percentage == stored  # type: ignore[union-attr]


@pytest.mark.parametrize("bad", [float("nan"), True, "50", None, [1]])
def test_update_progress_drops_non_numbers(bad: Any) -> None:
    state = fresh()
    state.update(progress_percentage=7)
    state.update(progress_percentage=bad)
    assert state.status().progress_percentage == 7  # type: ignore[union-attr]


@pytest.mark.parametrize(("given", "stored"), [
    (0, 0), (2**31 - 1, 2**31 - 1), (1.2, 2), (-5, 0), (2**31, 2**31 - 1), (1e300, 2**31 - 1),
])
def test_update_remaining_rounds_up_and_clamps(given: float, stored: int) -> None:
    state = fresh()
    state.update(estimated_remaining_seconds=given)
    assert state.status().estimated_remaining_seconds == stored  # type: ignore[union-attr]


@pytest.mark.parametrize("bad", [float("inf"), float("nan"), False, "10"])
def test_update_remaining_drops_non_finite(bad: Any) -> None:
    state = fresh()
    state.update(estimated_remaining_seconds=bad)
    assert state.status().estimated_remaining_seconds is None  # type: ignore[union-attr]


def test_update_metrics_rules_and_log_once(caplog: pytest.LogCaptureFixture) -> None:
    state = fresh()
    caplog.set_level(logging.WARNING, logger="exporter_lib")
    good = {"loss": 0.1, "step": 3, "ok": True, "phase": "train", "n" * 64: "v" * 64,
            "nan": float("nan"), "big": 10**63}
    bad = {"": 1, "n" * 65: 1, "long": "x" * 65, "empty": "", "list": [1], "huge": 10**64}
    for _ in range(3):
        state.update(metrics={**good, **bad})
    metrics = state.status().metrics_dict()  # type: ignore[union-attr]
    assert metrics == {"loss": "0.1", "step": "3", "ok": "true", "phase": "train",
                       "n" * 64: "v" * 64, "nan": "nan", "big": str(10**63)}
    built = state.status()
    assert built is not None and TrainerStatus.from_api(built.to_api()) == built  # valid
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == len(bad)  # once each, though reported three times
    assert any("metrics['long']" in w and "1..64" in w for w in warnings)


def test_update_metric_cap_keeps_existing_names() -> None:
    state = fresh()
    state.update(metrics={f"m{i}": i for i in range(256)})
    state.update(metrics={"m0": -1, "new": 1})
    metrics = state.status().metrics_dict()  # type: ignore[union-attr]
    assert len(metrics) == 256 and metrics["m0"] == "-1" and "new" not in metrics
    assert state.rejected["metrics"] == 1


def test_update_merges_metrics_and_sets_time() -> None:
    times = iter([1000.0, 2000.7])
    state = State(clock=lambda: next(times))
    state.update(metrics={"a": 1})
    state.update(metrics={"b": "x"})
    s = state.status()
    assert s is not None and s.metrics_dict() == {"a": "1", "b": "x"}
    assert s.last_updated_time.timestamp() == 2000


def test_update_never_raises_on_garbage() -> None:
    state = fresh()
    state.update(metrics={1: 2, None: 3})  # type: ignore[dict-item]
    state.update(metrics="not a mapping")  # type: ignore[arg-type]
    state.update(progress_percentage=object())  # type: ignore[arg-type]
    assert state.status() is not None


def test_update_metrics_not_a_mapping_keeps_the_rest(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="exporter_lib")
    state = fresh()
    state.update(progress_percentage=5, metrics=[("loss", 1.0)])  # type: ignore[arg-type]
    s = state.status()
    assert s is not None and s.progress_percentage == 5 and s.metrics == ()
    assert [r.getMessage() for r in caplog.records] == [
        "metrics=[('loss', 1.0)]: must be a mapping of name to value; dropped "
        "(Trainer v1alpha1 API limits; logged once)"]


def test_numpy_like_scalars_via_item() -> None:
    class Scalar:
        def item(self) -> float:
            return 0.5

    state = fresh()
    state.update(metrics={"s": Scalar()})
    assert state.status().metrics_dict() == {"s": "0.5"}  # type: ignore[union-attr]
