"""``lastCheckpointTime`` in the exporter contract: the explicit call, its input rules,
and compatibility both ways (a real exporter over HTTP; the scraper's parsers)."""

from __future__ import annotations

import json
import math
import urllib.request
from datetime import UTC, datetime

from hypothesis import given
from hypothesis import strategies as st

import exporter_lib
from exporter_lib import api
from exporter_lib.state import State
from exporter_lib.status import TrainerStatus
from scraper.scrape.exporter import Fresh, parse_text


def _get(url: str, accept: str | None = None) -> bytes:
    headers = {"Accept": accept} if accept else {}
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers),
                                timeout=10) as resp:
        return bytes(resp.read())


def test_checkpoint_is_served_in_json_and_text_and_never_in_the_api_dict(
        exporter: api.Exporter) -> None:
    exporter_lib.update(progress_percentage=10)
    assert b"lastCheckpointTime" not in _get(f"{exporter.url}/metrics", "application/json")
    exporter_lib.checkpoint_saved(1_700_000_000.7)
    body = json.loads(_get(f"{exporter.url}/metrics", "application/json"))
    assert body["lastCheckpointTime"] == "2023-11-14T22:13:20Z"
    assert body["progressPercentage"] == 10
    status = TrainerStatus.from_json(json.dumps(body))
    assert "lastCheckpointTime" not in status.to_api()
    text = _get(f"{exporter.url}/metrics")
    read = parse_text(text)
    assert isinstance(read, Fresh)
    assert read.status.last_checkpoint_time == datetime(2023, 11, 14, 22, 13, 20, tzinfo=UTC)
    assert read.status.progress_percentage == 10


def test_a_body_without_the_field_reads_as_no_checkpoint() -> None:
    """An exporter that does not know the field: JSON and text read as before."""
    old = TrainerStatus.from_json(b'{"progressPercentage":5,"lastUpdatedTime":'
                                  b'"2026-01-01T00:00:00Z","metrics":[]}')
    assert old.last_checkpoint_time is None and old.progress_percentage == 5
    read = parse_text(b"trainjob_last_update_timestamp_seconds 1.7e9\n")
    assert isinstance(read, Fresh) and read.status.last_checkpoint_time is None


def test_a_scraper_that_does_not_know_the_field_ignores_it() -> None:
    """The contract's rule for old readers: unknown fields are ignored.  A model built
    like the previous TrainerStatus (extra="ignore", no such field) reads a new body."""
    from pydantic import BaseModel, ConfigDict, Field

    class OldStatus(BaseModel):
        model_config = ConfigDict(extra="ignore", populate_by_name=True)
        progress_percentage: int | None = Field(default=None, alias="progressPercentage")
        last_updated_time: datetime = Field(alias="lastUpdatedTime")

    state = State()
    state.update(progress_percentage=3)
    state.checkpoint_saved()
    status = state.status()
    assert status is not None
    old = OldStatus.model_validate_json(status.to_json())
    assert old.progress_percentage == 3


def test_checkpoint_never_moves_back_and_bad_times_are_dropped(caplog: object) -> None:
    clock = [1000.0]
    state = State(clock=lambda: clock[0])
    state.checkpoint_saved()
    first = state.status()
    assert first is not None and first.last_checkpoint_time is not None
    assert first.last_checkpoint_time.timestamp() == 1000.0
    state.checkpoint_saved(500.0)  # earlier: ignored
    for bad in (math.nan, math.inf, -1.0, True, "now", 1e12, 10**400, 1061.0):
        state.checkpoint_saved(bad)  # type: ignore[arg-type]
    again = state.status()
    assert again is not None and again.last_checkpoint_time == first.last_checkpoint_time
    assert state.rejected["lastCheckpointTime"] == 8


def test_a_time_from_the_future_never_hides_the_saves_after_it() -> None:
    # A month ahead would have stood as the last checkpoint, and every real save after it
    # would have been ignored as 'earlier' (the boost would read no work at risk).
    clock = [1000.0]
    state = State(clock=lambda: clock[0])
    state.checkpoint_saved(1000.0 + 30 * 86400)
    state.checkpoint_saved(1000.0 + 60)  # within the allowance for another host's clock
    clock[0] = 2000.0
    state.checkpoint_saved()
    status = state.status()
    assert status is not None and status.last_checkpoint_time is not None
    assert status.last_checkpoint_time.timestamp() == 2000.0
    assert state.rejected["lastCheckpointTime"] == 1


@given(st.lists(st.floats(min_value=0, max_value=4e9), min_size=1, max_size=20))
def test_served_checkpoint_is_the_latest_time_given(times: list[float]) -> None:
    state = State(clock=lambda: 4e9)  # every time given is in this clock's past
    for when in times:
        state.checkpoint_saved(when)
    status = state.status()
    assert status is not None and status.last_checkpoint_time is not None
    assert status.last_checkpoint_time.timestamp() == float(int(max(times)))


def test_push_keeps_a_known_checkpoint() -> None:
    """A pushed status (the Kubeflow SDK's, which has no checkpoint) replaces the status
    but not the checkpoint already reported: the last checkpoint is still the last."""
    state = State()
    state.checkpoint_saved(1_700_000_000)
    state.replace(TrainerStatus.from_api({"progressPercentage": 50,
                                          "lastUpdatedTime": "2026-01-01T00:00:00Z"}))
    status = state.status()
    assert status is not None and status.progress_percentage == 50
    assert status.last_checkpoint_time == datetime.fromtimestamp(1_700_000_000, UTC)


def test_not_reporting_rank_ignores_checkpoints(monkeypatch: object) -> None:
    monkeypatch.setenv("RANK", "1")  # type: ignore[attr-defined]
    api._reset_for_tests()
    try:
        exporter_lib.checkpoint_saved()
        assert exporter_lib.current_status() is None
    finally:
        api._reset_for_tests()


def test_the_trainjob_annotation_holds_the_api_fields_only() -> None:
    """The annotation the scraper writes on a TrainJob of Trainer before v2.2 is
    ``status.trainerStatus`` as the API stores it: no ``lastCheckpointTime``."""
    from exporter_lib.status_annotation import decode_annotation, encode_annotation

    state = State()
    state.update(progress_percentage=7)
    state.checkpoint_saved(1_700_000_000)
    status = state.status()
    assert status is not None
    value = encode_annotation(status)
    assert "lastCheckpointTime" not in value
    assert decode_annotation(value).progress_percentage == 7


def test_a_status_file_carries_the_checkpoint_to_the_sidecar(tmp_path: object) -> None:
    """Sidecar mode: a program in any language writes ``lastCheckpointTime`` into its
    status file; the sidecar's JSON and text bodies serve it."""
    from pathlib import Path

    from exporter_lib.exposition import Renderer
    from exporter_lib.files import StatusFileSource

    path = Path(str(tmp_path)) / "status.json"
    path.write_text(json.dumps({"progressPercentage": 3, "lastUpdatedTime":
                                "2026-01-01T00:00:00Z", "lastCheckpointTime":
                                "2025-12-31T23:40:00Z"}))
    renderer = Renderer(StatusFileSource(str(path)))
    body = renderer.render("application/json")
    assert body is not None
    assert json.loads(body.body)["lastCheckpointTime"] == "2025-12-31T23:40:00Z"
    text = renderer.render("text/plain")
    assert text is not None
    read = parse_text(text.body)
    assert isinstance(read, Fresh)
    assert read.status.last_checkpoint_time == datetime(2025, 12, 31, 23, 40, tzinfo=UTC)
