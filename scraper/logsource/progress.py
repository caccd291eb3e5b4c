"""Per-target state: segments in, the newest complete reading out, as a TrainerStatus.

Which bar counts when a run prints several:

* nested bars (tqdm ``position > 0``, drawn with a cursor-up code: the Transformers
  Trainer's and many loops' eval bars) never count;
* of the top-level tqdm bars, the first one seen in this log counts, by its
  description with digits ignored (``train``, ``""`` for the Transformers Trainer,
  ``Epoch #`` for Lightning's TQDMProgressBar); a later bar with another description
  (a sequential eval or test loop) gives no progress;
* a Keras bar counts within the last ``Epoch e/E`` line: progress is
  ``(e - 1 + step/steps) / E``; Lightning's rich row ``Epoch e/E`` likewise;
* a bar that names its epoch but not how many (Lightning's TQDMProgressBar
  ``Epoch 3``) gives metrics and no progress: the fraction of an epoch is not the
  fraction of the run;
* a plain bar (no epochs known) that starts again from a lower count is one of
  several per-epoch bars of unknown number: from then on it gives no progress of its
  own (the highest progress given before is kept, without an ETA: the bar's own is an
  epoch's), and a full plain bar reads 99 %, not 100 % (it may be the first of
  several); 100 % comes with the container's end for a single bar only.

Reads of the log overlap (``sinceTime`` has whole seconds; a cut read is followed by a
short tail): :meth:`LogProgress.read` applies each segment once, where the bytes of
the answer show it begins (:mod:`.cursor`), so a read repeated or overlapping changes
nothing.  A re-read earlier redraw would otherwise read as a lower count, "a new bar".
Progress is the floor of the fraction in percent (100 only when the bar is full); it
never goes back and, once given, is never left out.  The
ETA: the bar's own remaining time, scaled to the run where the epochs are known (Keras:
seconds per step times the steps left in all epochs; per-epoch bars: the remaining
epochs at this epoch's pace).  Metrics: the newest value of each name from every
parser (postfix, Keras ``name: value``, Trainer dicts, Katib lines), the first 256 names
kept.  A framework's checkpoint-save line (:mod:`.checkpoint_lines`) sets
``lastCheckpointTime`` to its timestamp.  ``lastUpdatedTime`` is the timestamp of the
line that carried the newest reading, so a status never claims to be newer than
what the training printed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime

from exporter_lib.status import METRICS_MAX_ITEMS, REMAINING_SECONDS_MAX, TrainerStatus
from scraper.logsource import checkpoint_lines, katib, keras_bar, rich_bar, tqdm_bar, trainer_dicts
from scraper.logsource.cursor import ReadCursor
from scraper.logsource.reading import Reading
from scraper.logsource.segments import Segment, parse_time, segments_of, strip


@dataclass
class LogProgress:
    """What one target's log has told so far (see the module docstring)."""

    main_bar: str | None = None
    epoch: tuple[int, int] | None = None  # Keras: (current, count) from "Epoch e/E"
    fraction: float | None = None
    remaining: float | None = None
    metrics: dict[str, str] = field(default_factory=dict)
    updated: datetime | None = None
    checkpoint: datetime | None = None
    readings: int = 0
    cursor: ReadCursor = field(default_factory=ReadCursor)
    plain: bool = False  # the fraction is a plain bar's n/total (no epochs known)
    repeating: bool = False  # the plain bar started again: its count is per epoch
    _plain_done: float = 0.0
    _after_rich_row: bool = False

    def read(self, body: bytes, *, ended: bool, from_start: bool = False) -> int:
        """Apply the part of ``body`` (a pods/log answer, ``timestamps=true``) not
        applied before; returns how many segments gave a reading.

        ``ended``: the container has terminated (its last redraw is complete);
        ``from_start``: ``body`` begins at the log's start (else its first segment, when
        it shares no bytes with what was applied, may be cut and is dropped).
        """
        answer = strip(body)
        start = self.cursor.new_from(answer.content)
        segments, end = segments_of(answer, start or 0, ended=ended,
                                    trust_first=start is not None or from_start)
        self.cursor.advance(answer.content, start, end)
        return self.feed(segments)

    def feed(self, segments: list[Segment]) -> int:
        """Apply ``segments`` (oldest first, each once: see :meth:`read`); returns how
        many gave a reading."""
        used = 0
        for segment in segments:
            if not segment.complete or segment.nested:
                continue
            if checkpoint_lines.is_save(segment.text):
                saved = parse_time(segment.timestamp)
                if saved is not None and (self.checkpoint is None or saved > self.checkpoint):
                    self.checkpoint = saved
                self._after_rich_row = False
                continue
            reading = self._parse(segment.text)
            self._after_rich_row = bool(reading and reading.continues_metrics)
            if reading is None or not self._apply(reading):
                continue
            used += 1
            stamp = parse_time(segment.timestamp)
            if stamp is not None and (self.updated is None or stamp >= self.updated):
                self.updated = stamp
        self.readings += used
        return used

    def _parse(self, text: str) -> Reading | None:
        if self._after_rich_row:
            more = rich_bar.parse_continuation(text)
            if more is not None:
                return more
        for parser in (tqdm_bar.parse, keras_bar.parse, rich_bar.parse, trainer_dicts.parse,
                       katib.parse):
            reading = parser(text)
            if reading is not None:
                return reading
        return None

    def _apply(self, reading: Reading) -> bool:
        """Fold one reading in; False when it does not count (another bar)."""
        if reading.finished:
            self.fraction, self.remaining, self.plain = 1.0, 0.0, False
            return True
        if reading.bar == "keras" and reading.done is None:
            assert reading.epoch is not None and reading.epochs is not None
            self.epoch = (reading.epoch, reading.epochs)
            return True
        if reading.bar is not None and reading.bar not in ("keras", "lightning"):
            if self.main_bar is None:
                self.main_bar = reading.bar
            elif reading.bar != self.main_bar:
                return False
        self._merge(reading.metrics)
        if reading.done is None or not reading.total:
            return bool(reading.metrics)
        step = reading.done / reading.total
        epoch, epochs = reading.epoch, reading.epochs
        if reading.bar == "keras" and self.epoch is not None:
            epoch, epochs = self.epoch
        if reading.epoch_only:
            return True
        if epoch is not None and epochs:
            self._advance(min(1.0, (epoch - 1 + step) / epochs))
            self.remaining = self._run_remaining(reading, epoch, epochs)
            self.plain = False
            return True
        if reading.done < self._plain_done:
            self.repeating = True
        self._plain_done = reading.done
        if self.repeating:
            self.remaining = None  # the bar's own ETA is one epoch's
            return True
        self._advance(step)
        self.remaining, self.plain = reading.remaining, True
        return True

    def _advance(self, fraction: float) -> None:
        """Progress never goes back (a second ``fit`` starting at epoch 1 keeps it)."""
        self.fraction = fraction if self.fraction is None else max(self.fraction, fraction)

    @staticmethod
    def _run_remaining(reading: Reading, epoch: int, epochs: int) -> float | None:
        assert reading.done is not None and reading.total is not None
        later = epochs - epoch
        if reading.per_step is not None:
            return reading.per_step * (later * reading.total + reading.total - reading.done)
        if reading.remaining is None:
            return None
        if later == 0:
            return float(reading.remaining)
        if reading.elapsed is None:
            return None
        return reading.remaining + later * (reading.elapsed + reading.remaining)

    def _merge(self, metrics: tuple[tuple[str, str], ...]) -> None:
        for name, value in metrics:
            if name in self.metrics or len(self.metrics) < METRICS_MAX_ITEMS:
                self.metrics[name] = value

    def status(self, *, ended: bool = False) -> TrainerStatus | None:
        """The status read so far, or None before any reading with a timestamp;
        ``ended``: the container has terminated (a full plain bar then reads 100 %).

        Raises:
            StatusError: a value broke a Trainer API limit (a parser bug: counted
                as a parse failure by the caller, never written).
        """
        if self.updated is None or (self.fraction is None and not self.metrics):
            return None
        body: dict[str, object] = {"lastUpdatedTime": self.updated.isoformat(),
                                   "metrics": [{"name": n, "value": v}
                                               for n, v in self.metrics.items()]}
        if self.fraction is not None:
            percent = max(0, min(100, math.floor(self.fraction * 100 + 1e-9)))
            body["progressPercentage"] = min(percent, 99) if self.plain and (
                self.repeating or not ended) else percent
        if self.checkpoint is not None:
            body["lastCheckpointTime"] = self.checkpoint.isoformat()
        if self.remaining is not None and math.isfinite(self.remaining):
            body["estimatedRemainingSeconds"] = max(
                0, min(REMAINING_SECONDS_MAX, round(self.remaining)))
        return TrainerStatus.from_api(body)
