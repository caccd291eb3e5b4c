"""Each parser against what the real framework printed (tests/logsource/conftest.py).

A scrape reads the log as it grows: here the captured CRI entries are fed in growing
prefixes, as successive reads would see them, and the readings are checked against
the run's own facts (steps, epochs, the metric values the framework printed last).
"""

from __future__ import annotations

import re

import pytest

from exporter_lib.status import TrainerStatus
from scraper.logsource.progress import LogProgress
from scraper.logsource.segments import split
from tests.logsource.conftest import Captured

NAMES = {
    "tqdm": {"loss", "lr"},
    "tqdm_auto": {"loss", "lr"},
    "keras1": {"accuracy", "loss"},
    "keras2": {"accuracy", "loss"},
    "transformers": {"loss", "grad_norm", "learning_rate", "epoch", "eval_loss", "train_loss"},
    "lightning_rich": {"train_loss", "val_loss"},
    "lightning_tqdm": {"train_loss", "val_loss"},
    "katib": {"loss", "accuracy"},
}


def read_in_steps(captured: Captured, every: int = 1) -> list[TrainerStatus | None]:
    """The status after each read of a growing log (a fresh read of the whole log each time)."""
    out = []
    count = len(captured.entries)
    for upto in [*range(every, count, every), count]:
        progress = LogProgress()
        progress.feed(split(captured.pods_log(upto), ended=upto == count, trust_first=True))
        out.append(progress.status(ended=upto == count))
    return out


@pytest.mark.parametrize("name", sorted(NAMES))
def test_final_reading_has_the_run_metrics(captures: dict[str, Captured], name: str) -> None:
    statuses = read_in_steps(captures[name], every=max(1, len(captures[name].entries)))
    final = statuses[-1]
    assert final is not None
    assert NAMES[name] <= set(final.metrics_dict()), final.metrics_dict()
    if name != "katib":  # Katib lines carry metrics only
        assert final.progress_percentage == 100


@pytest.mark.parametrize("name", ["tqdm", "tqdm_auto", "keras1", "transformers"])
def test_progress_grows_through_the_run_and_eval_bars_do_not_count(
        captures: dict[str, Captured], name: str) -> None:
    statuses = read_in_steps(captures[name])
    seen = [s.progress_percentage for s in statuses if s and s.progress_percentage is not None]
    assert len(set(seen)) >= 3, seen  # readings in the middle, not only the end
    # An eval bar reaching 100 % mid-run (tqdm_loop's, the Trainer's) would break this.
    assert seen == sorted(seen), seen
    assert seen[-1] == 100


def test_keras_epochs_scale_progress(captures: dict[str, Captured]) -> None:
    """verbose=2 prints one line per epoch: e/E of the run after each."""
    statuses = [s for s in read_in_steps(captures["keras2"]) if s and s.progress_percentage]
    assert sorted({s.progress_percentage for s in statuses}) == [33, 66, 100]


def test_last_metric_values_are_the_last_printed(captures: dict[str, Captured]) -> None:
    raw = captures["tqdm"].raw.decode()
    last_loss = re.findall(r"loss=([\d.]+)", raw)[-1]
    final = read_in_steps(captures["tqdm"], every=len(captures["tqdm"].entries))[-1]
    assert final is not None and final.metrics_dict()["loss"] == last_loss
    raw = captures["keras2"].raw.decode()
    assert final is not None
    keras = read_in_steps(captures["keras2"], every=len(captures["keras2"].entries))[-1]
    assert keras is not None
    assert keras.metrics_dict()["loss"] == re.findall(r"loss: ([\d.]+)", raw)[-1]


def test_eta_comes_from_the_bar(captures: dict[str, Captured]) -> None:
    etas = [s.estimated_remaining_seconds for s in read_in_steps(captures["keras1"])
            if s and s.estimated_remaining_seconds is not None]
    assert etas and etas[-1] == 0
    tqdm = [s.estimated_remaining_seconds for s in read_in_steps(captures["tqdm"])
            if s and s.estimated_remaining_seconds is not None]
    assert tqdm and tqdm[-1] == 0


def test_lightning_tqdm_bar_gives_progress_only_when_fit_stops(
        captures: dict[str, Captured]) -> None:
    """``Epoch 3`` names no epoch count: no progress until "`Trainer.fit` stopped"."""
    statuses = read_in_steps(captures["lightning_tqdm"])
    mid = [s for s in statuses[:-1] if s and s.progress_percentage is not None]
    assert all(s.progress_percentage == 100 for s in mid)
    assert statuses[-1] is not None and statuses[-1].progress_percentage == 100
    assert any(s and "train_loss" in s.metrics_dict() for s in statuses[:-1])


@pytest.mark.parametrize("name", ["keras2", "keras1", "tqdm", "transformers", "katib"])
def test_overlapping_reads_give_what_one_read_gives(captures: dict[str, Captured],
                                                    name: str) -> None:
    """Each scrape re-reads the last second (``sinceTime`` has whole seconds): lines
    already applied come again and must not be applied after newer ones."""
    captured = captures[name]
    count = len(captured.entries)
    once = LogProgress()
    progress = LogProgress()
    for end in range(1, count + 1):
        # Up to three entries read again, as a read starting a second back would.
        start = max(0, end - 4)
        progress.read(render_slice(captured, start, end), ended=end == count,
                      from_start=start == 0)
        once = LogProgress()
        once.feed(split(captured.pods_log(end), ended=end == count, trust_first=True))
        assert progress.fraction == once.fraction, (end, progress, once)
    assert progress.status() == once.status()


def render_slice(captured: Captured, start: int, end: int) -> bytes:
    from tests.logsource.conftest import render
    return render(captured.entries[start:end])


def test_per_epoch_bars_of_unknown_number_never_read_as_the_whole_run(
        captures: dict[str, Captured]) -> None:
    """A real tqdm run drawing one bar per epoch (3, same description, nothing saying how
    many): a newcomer's run read 100 % after the first epoch.  A full plain bar reads at
    most 99 %; once a bar starts again from a lower count it gives no progress of its
    own, and the highest given before is kept (issue 27: a field once written is never
    left out while the run runs); the final reading gives no invented 100 %."""
    statuses = read_in_steps(captures["tqdm_epochs"])
    *running, final = statuses
    seen = [s.progress_percentage for s in running if s and s.progress_percentage is not None]
    assert seen and max(seen) <= 99, seen
    assert seen == sorted(seen), seen
    assert final is not None and final.progress_percentage == 99
    assert {"loss", "lr"} <= set(final.metrics_dict())
