"""The frameworks' checkpoint-save lines become ``lastCheckpointTime``.

The lines are the ones the frameworks print (their text is asserted against the real
frameworks' output in tests/exporter: test_exporter_{transformers,lightning,keras}.py);
here they are read from a pods/log body with the kubelet's timestamps.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from scraper.logsource.checkpoint_lines import is_save
from scraper.logsource.progress import LogProgress

SAVES = [
    "Saving model checkpoint to out/checkpoint-500",
    "Epoch 0, global step 8: 'val_loss' reached 0.93 (best 0.93), saving model to "
    "'/tmp/ckpt/epoch=0-step=8.ckpt' as top 1",
    "Epoch 1: saving model to /tmp/ckpt/e01.keras",
    "Epoch 2: val_loss improved from 0.91 to 0.88, saving model to /tmp/ckpt/best.keras",
]
NOT_SAVES = [
    "Epoch 2, global step 24: 'val_loss' was not in top 1",
    "Epoch 3: val_loss did not improve from 0.88000",
    "Saving model checkpoints is disabled",
    "{'loss': 0.5, 'epoch': 1.0}",
]


@pytest.mark.parametrize("line", SAVES)
def test_save_lines_match(line: str) -> None:
    assert is_save(line)


@pytest.mark.parametrize("line", NOT_SAVES)
def test_other_lines_do_not(line: str) -> None:
    assert not is_save(line)


def test_a_save_line_sets_the_checkpoint_time_and_later_ones_move_it() -> None:
    body = (b"2026-01-01T00:00:01.5Z 10%|#         | 10/100 [00:01<00:09]\n"
            b"2026-01-01T00:00:02Z Saving model checkpoint to out/checkpoint-10\n"
            b"2026-01-01T00:00:03Z 20%|##        | 20/100 [00:02<00:08]\n")
    progress = LogProgress()
    progress.read(body, ended=False, from_start=True)
    status = progress.status()
    assert status is not None and status.progress_percentage == 20
    assert status.last_checkpoint_time == datetime(2026, 1, 1, 0, 0, 2, tzinfo=UTC)
    assert "lastCheckpointTime" not in status.to_api()
    progress.read(body + b"2026-01-01T00:01:00Z Epoch 1: saving model to /c/e01.keras\n",
                  ended=False, from_start=True)
    later = progress.status()
    assert later is not None
    assert later.last_checkpoint_time == datetime(2026, 1, 1, 0, 1, tzinfo=UTC)


def test_no_save_line_no_checkpoint() -> None:
    progress = LogProgress()
    progress.read(b"2026-01-01T00:00:03Z 20%|##        | 20/100 [00:02<00:08]\n",
                  ended=False, from_start=True)
    status = progress.status()
    assert status is not None and status.last_checkpoint_time is None
