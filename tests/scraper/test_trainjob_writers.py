"""Who wrote a TrainJob's trainer status, from managedFields, and when the store saw it
(:mod:`scraper.shared.trainjobs`).  managedFields entries here have the shape kube-apiserver
v1.37 gives (copied field names, not an API reply); the store's clocks are fakes."""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from exporter_lib.status import TrainerStatus
from exporter_lib.status_annotation import TRAINER_STATUS_ANNOTATION
from scraper.shared.trainjobs import OUR_FIELD_MANAGER, TrainJobStore, slim_trainjob, writers_of
from scraper.write.annotation_target import Place, stored_after_apply

STATUS_FIELDS = {"f:status": {"f:trainerStatus": {".": {}, "f:lastUpdatedTime": {},
                                                  "f:progressPercentage": {}}}}


def _entry(manager: str, stamp: str, fields: dict[str, Any]) -> dict[str, Any]:
    return {"manager": manager, "operation": "Apply", "apiVersion": "trainer.kubeflow.org/v1alpha1",
            "time": stamp, "fieldsType": "FieldsV1", "fieldsV1": fields,
            "subresource": "status"}


def _trainjob(managed: list[dict[str, Any]], progress: int = 5,
              rv: str = "10") -> dict[str, Any]:
    return {"metadata": {"name": "tj", "namespace": "ns", "uid": "u1", "resourceVersion": rv,
                         "managedFields": managed},
            "status": {"trainerStatus": {"progressPercentage": progress,
                                         "lastUpdatedTime": "2026-01-01T00:00:00Z"}}}


def test_owner_of_last_updated_time_wins_over_a_later_co_owner() -> None:
    managed = [
        _entry("trainer-status", "2026-01-01T00:00:10Z", STATUS_FIELDS),
        # A co-owner of a subfield only, with a later time (e.g. it changed conditions).
        _entry("controller", "2026-01-01T00:05:00Z",
               {"f:status": {"f:trainerStatus": {"f:estimatedRemainingSeconds": {}},
                             "f:conditions": {}}}),
        _entry("other", "2026-01-01T00:09:00Z", {"f:status": {"f:conditions": {}}}),
    ]
    status_by, annotated_by = writers_of(managed)
    assert status_by is not None and status_by.manager == "trainer-status"
    assert status_by.time == 1767225610.0 and annotated_by is None


def test_shared_ownership_at_one_time_goes_to_the_other_writer() -> None:
    managed = [_entry(OUR_FIELD_MANAGER, "2026-01-01T00:00:10Z", STATUS_FIELDS),
               _entry("trainer-status", "2026-01-01T00:00:10Z", STATUS_FIELDS)]
    status_by, _ = writers_of(managed)
    assert status_by is not None and status_by.manager == "trainer-status"


def test_slim_keeps_exactly_what_writers_of_reads() -> None:
    annotation = {"f:metadata": {"f:annotations": {f"f:{TRAINER_STATUS_ANNOTATION}": {},
                                                   "f:other": {}}}}
    managed = [_entry("trainer-status", "2026-01-01T00:00:10Z", STATUS_FIELDS),
               _entry("kubectl", "2026-01-01T00:00:20Z", annotation),
               _entry("noise", "2026-01-01T00:00:30Z", {"f:spec": {"f:x": {}}})]
    full = writers_of(managed)
    obj = slim_trainjob(_trainjob(managed))
    assert [e["manager"] for e in obj["metadata"]["managedFields"]] == ["trainer-status",
                                                                        "kubectl"]
    assert writers_of(obj["metadata"]["managedFields"]) == full


@given(age=st.floats(0, 1e5), skew=st.floats(-1e4, 1e4))
def test_a_listed_write_is_aged_by_its_time_never_into_the_future(age: float,
                                                                   skew: float) -> None:
    wall = [1767225600.0 + age]
    mono = [5000.0]
    store = TrainJobStore(["ns"], clock=lambda: mono[0], wall=lambda: wall[0] + skew)
    store.on_list("ns", [slim_trainjob(_trainjob(
        [_entry("trainer-status", "2026-01-01T00:00:00Z", STATUS_FIELDS)]))])
    record = store.get("ns", "tj")
    assert record is not None and record.status_by is not None
    assert math.isclose(record.status_by.seen, mono[0] - max(0.0, age + skew), abs_tol=1e-6)
    assert record.status_by.seen <= mono[0]


def test_a_watched_write_is_seen_when_delivered_even_within_one_second() -> None:
    mono = [100.0]
    store = TrainJobStore(["ns"], clock=lambda: mono[0], wall=lambda: 1767225700.0)
    entry = [_entry("trainer-status", "2026-01-01T00:00:00Z", STATUS_FIELDS)]
    store.on_list("ns", [slim_trainjob(_trainjob(entry))])
    listed = store.get("ns", "tj")
    assert listed is not None and listed.status_by is not None
    assert listed.status_by.seen == 0.0  # 100 s old when listed
    mono[0] = 150.0
    store.on_event("MODIFIED", slim_trainjob(_trainjob(entry, progress=6, rv="11")))
    changed = store.get("ns", "tj")
    assert changed is not None and changed.status_by is not None
    assert changed.status_by.seen == 150.0  # same entry time, new content: a new write
    mono[0] = 160.0
    store.on_event("MODIFIED", slim_trainjob(_trainjob(entry, progress=6, rv="12")))
    same = store.get("ns", "tj")
    assert same is not None and same.status_by is not None
    assert same.status_by.seen == 150.0  # another field changed: the same write


def test_a_tie_goes_to_the_manager_that_just_wrote_and_stays_with_it() -> None:
    # Our apply sent the lastUpdatedTime the other writer had set, in the same second as
    # its write: both co-own it at one time.  The apply answer knows it was ours.
    managed = [_entry("someone-else", "2026-01-01T00:00:10Z", STATUS_FIELDS),
               _entry(OUR_FIELD_MANAGER, "2026-01-01T00:00:10Z", STATUS_FIELDS)]
    answer, _ = writers_of(managed, seen=7.0, prefer=OUR_FIELD_MANAGER)
    assert answer is not None and answer.ours and answer.seen == 7.0
    assert answer.tied == {"someone-else", OUR_FIELD_MANAGER}
    assert writers_of(managed, prefer="nobody")[0].manager == "someone-else"  # type: ignore[union-attr]

    mono = [10.0]
    store = TrainJobStore(["ns"], clock=lambda: mono[0], wall=lambda: 1767225700.0)
    store.on_list("ns", [slim_trainjob(_trainjob(managed))])
    listed = store.get("ns", "tj")
    assert listed is not None and listed.status_by is not None
    assert listed.status_by.manager == "someone-else"  # a list cannot tell: the safe side
    store.keep("ns", "tj", replace(listed, status_by=answer))
    mono[0] = 11.0
    # The watch event of that same write (and a later one changing another field).
    for rv in ("10", "11"):
        store.on_event("MODIFIED", slim_trainjob(_trainjob(managed, rv=rv)))
        record = store.get("ns", "tj")
        assert record is not None and record.status_by is not None
        assert record.status_by.ours and record.status_by.seen == 7.0
    # New content under the same tied entries: nobody can tell who wrote it.
    store.on_event("MODIFIED", slim_trainjob(_trainjob(managed, progress=9, rv="12")))
    changed = store.get("ns", "tj")
    assert changed is not None and changed.status_by is not None
    assert changed.status_by.manager == "someone-else" and changed.status_by.seen == 11.0



@given(progress=st.none() | st.integers(0, 100), eta=st.none() | st.integers(0, 10**6),
       kept_progress=st.booleans(), kept_eta=st.booleans())
def test_the_store_holds_what_the_apply_answer_holds(progress: int | None, eta: int | None,
                                                      kept_progress: bool,
                                                      kept_eta: bool) -> None:
    # A field this status leaves unset stays when another manager owns it (SSA): the
    # status kept after a write is the answer's then, else the one sent.
    sent = TrainerStatus(progress_percentage=progress, estimated_remaining_seconds=eta,
                         last_updated_time=datetime(2026, 1, 1, tzinfo=UTC))
    answer = sent.to_api()
    if progress is None and kept_progress:
        answer["progressPercentage"] = 7
    if eta is None and kept_eta:
        answer["estimatedRemainingSeconds"] = 9
    stored = stored_after_apply({"status": {"trainerStatus": answer}}, Place.STATUS, sent)
    assert stored == TrainerStatus.from_api(answer)
    assert stored_after_apply({"metadata": {}}, Place.ANNOTATION, sent) is sent
