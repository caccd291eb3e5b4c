"""Status on disk: the status file, the termination message, and reading a status file.

* Status file (``KUBEFLOW_TRAINER_STATUS_FILE``): each status is written as one
  JSON object (``TrainerStatus.to_json()``) to a temporary file in the same
  directory, flushed, then renamed over the target - ``rename(2)`` is atomic on
  POSIX, so a reader sees the old or the new file, never a partial one.  Writes
  happen on a background thread, coalesced: the training loop never waits for a disk.
* Termination message: Kubernetes copies the file at the container's
  ``terminationMessagePath`` (default ``/dev/termination-log``) into
  ``status.containerStatuses[].state.terminated.message``, up to 4096 bytes.  The
  kubelet bind-mounts that file, so it is rewritten in place (a rename would
  replace the mount point).  Metrics are dropped from the end until the JSON fits;
  the JSON is never cut.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import threading
from typing import TYPE_CHECKING

from exporter_lib.status import MAX_STATUS_JSON_BYTES, StatusError, TrainerStatus

if TYPE_CHECKING:
    from exporter_lib.exposition import StatusSource

log = logging.getLogger("exporter_lib")

ENV_STATUS_FILE = "KUBEFLOW_TRAINER_STATUS_FILE"
ENV_TERMINATION_PATH = "TRAINJOB_EXPORTER_TERMINATION_MESSAGE_PATH"
DEFAULT_TERMINATION_PATH = "/dev/termination-log"
#: The kubelet keeps at most this many bytes of a termination message.
TERMINATION_MESSAGE_MAX_BYTES = 4096


def write_atomic(path: str, data: bytes, mode: int = 0o644) -> None:
    """Replace ``path`` with ``data`` atomically (temp file in the same directory + rename),
    with permission bits ``mode`` (default 0644: mkstemp's 0600 would hide a status file
    from a sidecar user; a token file asks for less).

    Raises:
        OSError: the directory is not writable or the disk is full.
    """
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=directory)
    try:
        # fchmod, not a umask-filtered create mode: the mode asked for is the mode set,
        # before any byte is written.
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def fit_termination_message(status: TrainerStatus,
                            limit: int = TERMINATION_MESSAGE_MAX_BYTES) -> bytes:
    """``status.to_json()`` within ``limit`` bytes, keeping the longest prefix of metrics that fits.

    Progress, remaining time and ``lastUpdatedTime`` always fit (under 120 bytes).
    """
    body = status.to_json()
    if len(body) <= limit:
        return body
    low, high = 0, len(status.metrics)  # invariant: prefix `low` fits, `high` does not
    while high - low > 1:
        middle = (low + high) // 2
        if len(_with_metrics(status, middle).to_json()) <= limit:
            low = middle
        else:
            high = middle
    return _with_metrics(status, low).to_json()


def _with_metrics(status: TrainerStatus, count: int) -> TrainerStatus:
    return status.model_copy(update={"metrics": status.metrics[:count]})


def write_termination_message(status: TrainerStatus | None, path: str, explicit: bool) -> bool:
    """Write the final status to ``path``; returns True when written.

    Unless ``explicit`` (the path was configured), the file must already exist:
    the kubelet creates it inside a container, and outside one we must not
    create ``/dev/termination-log`` on a developer's machine.  Never raises.
    """
    if status is None:
        return False
    if not explicit and not os.path.exists(path):
        return False
    try:
        with open(path, "wb") as handle:
            handle.write(fit_termination_message(status))
        return True
    except OSError as exc:
        log.warning("could not write the termination message to %s: %s", path, exc)
        return False


class StatusFileWriter:
    """Writes the status to a file after each change, from a daemon thread.

    The thread looks at the source's generation counter every ``interval``
    seconds and writes the newest status when it moved, so ``update()`` pays
    nothing for the file.  :meth:`flush` writes synchronously (used at exit).
    """

    def __init__(self, path: str, source: StatusSource, interval: float = 0.2) -> None:
        self.path = path
        self._source = source
        self._interval = interval
        self._event = threading.Event()
        self._stopping = False
        self._lock = threading.Lock()
        self._written: bytes | None = None
        self._failed = False
        self._thread = threading.Thread(target=self._run, name="trainjob-status-file",
                                        daemon=True)
        self._thread.start()

    def flush(self) -> None:
        """Write the current status now if it differs from the last written one."""
        status = self._source.status()
        if status is None:
            return
        body = status.to_json()
        with self._lock:
            if body == self._written:
                return
            try:
                write_atomic(self.path, body)
                self._written = body
                self._failed = False
            except OSError as exc:
                if not self._failed:  # log once per run of failures
                    log.warning("could not write the status file %s: %s", self.path, exc)
                self._failed = True

    def stop(self) -> None:
        """Stop the thread after a final flush."""
        self._stopping = True
        self._event.set()
        self._thread.join(timeout=5)
        self.flush()

    def _run(self) -> None:
        seen = -1
        while not self._event.wait(self._interval):
            generation = self._source.generation
            if generation != seen:
                seen = generation
                self.flush()


class StatusFileSource:
    """Reads a status file written by any program (sidecar mode).

    Offers ``generation``, ``rejected`` and ``status()`` like
    :class:`~exporter_lib.state.State`.  The file is re-read when its
    (inode, size, mtime) changes, checked on each ``status()`` call, so
    there is no polling thread.  A missing file means "no status yet"; an
    invalid one is logged once and the last valid status is kept.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.generation = 0
        self.rejected: dict[str, int] = {}
        self._lock = threading.Lock()
        self._key: tuple[int, int, int] | None = None
        self._status: TrainerStatus | None = None
        self._bad_key: tuple[int, int, int] | None = None
        self.refresh()

    def status(self) -> TrainerStatus | None:
        """The last valid status read from the file (re-reads it when it changed)."""
        self.refresh()
        return self._status

    def refresh(self) -> None:
        """Re-read the file if it changed since the last read; bumps ``generation``."""
        try:
            info = os.stat(self.path)
        except OSError:
            return
        key = (info.st_ino, info.st_size, info.st_mtime_ns)
        with self._lock:
            if key == self._key or key == self._bad_key:
                return
            try:
                with open(self.path, "rb") as handle:
                    body = handle.read(MAX_STATUS_JSON_BYTES + 1)  # bounded, whatever the file
                status = TrainerStatus.from_json(body)
            except (OSError, StatusError) as exc:
                self._bad_key = key
                self.rejected["file"] = self.rejected.get("file", 0) + 1
                log.warning("ignoring status file %s: %s", self.path, exc)
                return
            self._key = key
            if status != self._status:
                self._status = status
                self.generation += 1
