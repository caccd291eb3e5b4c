"""The process-wide exporter: ``start()``, ``update()``, ``stop()``, ``current_status()``.

One :class:`State` per process holds what the training code reported; one
:class:`Exporter` serves it.  Only the reporting process (global rank 0 by
default, see :mod:`exporter_lib.ranks`) keeps a state; elsewhere ``update()``
returns at once.

Configuration (arguments win over the environment):

| variable | meaning | default |
| --- | --- | --- |
| ``TRAINJOB_EXPORTER_PORT`` | TCP port to serve on (0: any free port) | 28080 |
| ``TRAINJOB_EXPORTER_HOST`` | address to bind | ``0.0.0.0`` |
| ``KUBEFLOW_TRAINER_STATUS_FILE`` | also write each status to this file | unset |
| ``TRAINJOB_EXPORTER_TERMINATION_MESSAGE_PATH`` | final status on exit | ``/dev/termination-log`` |
"""

from __future__ import annotations

import atexit
import errno
import logging
import os
import signal
import threading
from collections.abc import Mapping
from types import FrameType

from exporter_lib.exposition import Renderer, StatusSource
from exporter_lib.files import (
    DEFAULT_TERMINATION_PATH,
    ENV_STATUS_FILE,
    ENV_TERMINATION_PATH,
    StatusFileWriter,
    write_termination_message,
)
from exporter_lib.identity import TrainJobRef, pod_trainjob, status_path
from exporter_lib.push import (
    ENV_SERVER_URL,
    ENV_TOKEN_PATH,
    PushEndpoint,
    Replaceable,
    TokenFile,
)
from exporter_lib.ranks import is_reporting_process
from exporter_lib.server import ServerThread
from exporter_lib.state import State
from exporter_lib.status import TrainerStatus

log = logging.getLogger("exporter_lib")

DEFAULT_PORT = 28080
DEFAULT_HOST = "0.0.0.0"
ENV_PORT = "TRAINJOB_EXPORTER_PORT"
ENV_HOST = "TRAINJOB_EXPORTER_HOST"


class _NoState:
    """Stands in for :class:`State` on processes that do not report: every call is a no-op."""

    generation = 0
    rejected: dict[str, int] = {}

    def update(self, progress_percentage: float | None = None,
               estimated_remaining_seconds: float | None = None,
               metrics: Mapping[str, object] | None = None) -> None:
        return None

    def checkpoint_saved(self, when: float | None = None) -> None:
        return None

    def replace(self, status: TrainerStatus, stamp: float | None = None) -> None:
        return None

    def status(self) -> TrainerStatus | None:
        return None


class Exporter:
    """A serving exporter: HTTP server, optional status file, final-status writer.

    Build it with :func:`start` (the sidecar and benchmarks build one directly from a
    status ``source`` and the ``state`` pushes replace; the push sidecar passes a
    ``token`` already written, so the token exists before the port opens).  ``port``
    is the bound port (``None`` when not serving: another rank, or the port was
    taken); ``serving`` says which.  Nothing else is public: the parts it is built
    from stay its own.
    """

    def __init__(self, source: StatusSource, state: Replaceable, *, host: str, port: int,
                 status_file: str | None, termination_message_path: str | None,
                 serve: bool, token: TokenFile | None = None) -> None:
        self._source = source
        self.host = host
        self.port: int | None = None
        self._token = token if token is not None else TokenFile()
        self._trainjob = TrainJobRef(None, None)
        self._refused: dict[str, int] = {}
        push = PushEndpoint(state, self._token.token, lambda: self._trainjob)
        self._server: ServerThread | None = None
        self._writer: StatusFileWriter | None = None
        self._termination_path = termination_message_path or os.environ.get(ENV_TERMINATION_PATH)
        self._final_written = False
        self._lock = threading.Lock()
        if serve:
            try:
                self._server = ServerThread(host, port, Renderer(source, self._refused), push,
                                            self._refused)
                self.port = self._server.port
                if isinstance(state, State):  # reports and pushes wake held scrapes
                    state.on_progress = self._server.progress_moved
                log.info("trainjob exporter serving on http://%s:%d/metrics", host, self.port)
            except (OSError, OverflowError) as exc:  # OverflowError: a port beyond 65535
                reason = ("port already in use" if getattr(exc, "errno", None) == errno.EADDRINUSE
                          else str(exc))
                # In-process, training goes on without it; the sidecar exits (its caller).
                log.warning("trainjob exporter cannot serve on %s:%d (%s)", host, port, reason)
        if status_file and serve:
            self._writer = StatusFileWriter(status_file, source)

    @property
    def serving(self) -> bool:
        """True while the HTTP server runs."""
        return self._server is not None

    @property
    def url(self) -> str | None:
        """``http://<host>:<port>`` when serving (loopback for a wildcard host), else
        ``None``: the address this process itself reaches the exporter at."""
        if self.port is None:
            return None
        host = "127.0.0.1" if self.host in ("", "0.0.0.0") else (
            "[::1]" if self.host == "::" else
            f"[{self.host}]" if ":" in self.host else self.host)
        return f"http://{host}:{self.port}"

    def enable_push_compat(self, namespace: str | None = None, name: str | None = None,
                           token_file: str | None = None, *,
                           token_mode: int | None = None) -> str | None:
        """Point ``KUBEFLOW_TRAINER_SERVER_URL``/``_TOKEN`` at this exporter; returns the URL.

        The URL is plain http to :attr:`url` with the push design's path for this pod's
        TrainJob: ``namespace``/``name`` when given, else as the pod is told
        (:func:`exporter_lib.identity.pod_trainjob`: ``$TRAINJOB_NAME``, an upstream
        ``$KUBEFLOW_TRAINER_SERVER_URL``, ``$PET_MASTER_ADDR``; the namespace from the
        service account).  Pushes naming another TrainJob are refused (403) for each
        part known; an unknown name shows as ``trainjob`` in the URL and is not checked.
        The token is a fresh random secret in ``token_file`` (default: a new 0600 temp
        file; ``token_mode``, default 0600, sets a given file's permission bits), checked
        on every push.  Returns ``None`` (and sets nothing) when not serving.

        Raises:
            OSError: ``token_file`` cannot be written.
        """
        if self.port is None:
            return None
        if token_file is not None:
            self._token.use_path(token_file, token_mode)
        environ = dict(os.environ)
        if environ.get(ENV_SERVER_URL, "").startswith(f"{self.url}/"):
            del environ[ENV_SERVER_URL]  # our own URL from an earlier call tells nothing
        told = pod_trainjob(environ)
        own = TrainJobRef(namespace or told.namespace, name or told.name,
                          "enable_push_compat()" if name else told.source)
        self._trainjob = own
        path = self._token.ensure()
        url = (f"{self.url}"
               f"{status_path(own.namespace or 'default', own.name or 'trainjob')}")
        os.environ[ENV_SERVER_URL] = url
        os.environ[ENV_TOKEN_PATH] = path
        return url

    def write_final_status(self) -> bool:
        """Flush the status file and write the termination message (once; never raises)."""
        with self._lock:
            if self._writer is not None:
                self._writer.flush()
            if self._final_written:
                return False
            explicit = self._termination_path is not None
            written = write_termination_message(self._source.status(),
                                                self._termination_path or DEFAULT_TERMINATION_PATH,
                                                explicit)
            self._final_written = written
            return written

    def stop(self) -> None:
        """Stop serving and stop the status-file thread after a last write."""
        if self._server is not None:
            self._server.stop()
            self._server = None
        if self._writer is not None:
            self._writer.stop()


# -- process-wide singletons ---------------------------------------------------

_lock = threading.Lock()
_state: State | _NoState | None = None
_exporter: Exporter | None = None
_final: Exporter | None = None  # kept after stop(): the final status is still written at exit
_hooks_installed = False


def _get_state() -> State | _NoState:
    global _state
    with _lock:
        if _state is None:
            _state = State() if is_reporting_process() else _NoState()
        return _state


def update(progress_percentage: float | None = None,
           estimated_remaining_seconds: float | None = None,
           metrics: Mapping[str, object] | None = None) -> None:
    """Report progress from the training loop.  Thread-safe, non-blocking, never raises.

    Args:
        progress_percentage: 0..100 (percent); floats are floored, out-of-range values clamped.
        estimated_remaining_seconds: seconds >= 0; rounded up, clamped to int32.
        metrics: ``{name: value}`` merged into the metrics reported so far; values are
            numbers, bools or text of 1..64 characters (kept exactly; numbers are shown
            by their shortest round-tripping text).

    ``None`` leaves a field unchanged.  ``lastUpdatedTime`` becomes now.  Values
    breaking a limit are dropped or clamped and logged once (rules:
    :mod:`exporter_lib.state`).  Cost: O(number of metrics) constant-time checks
    and one lock; everything else happens when somebody reads the status.
    Works before :func:`start` (the status is served once started).
    """
    state = _state
    if state is None:
        state = _get_state()
    state.update(progress_percentage, estimated_remaining_seconds, metrics)


def checkpoint_saved(when: float | None = None) -> None:
    """Report that the training saved a checkpoint.  Thread-safe, never raises.

    Args:
        when: the save's time, unix seconds; default now.  Not a finite number from 0
            up to 60 s ahead of this clock (``state.CHECKPOINT_AHEAD_SECONDS``), or
            earlier than the checkpoint already reported: ignored and logged once (the
            last checkpoint never moves back).

    Served as ``lastCheckpointTime`` (JSON) and
    ``trainjob_last_checkpoint_timestamp_seconds`` (Prometheus text); the scraper uses it
    for the work a preemption would lose (docs/preemption.md).  ``lastUpdatedTime``
    becomes now.  The framework callbacks call it from their save hooks.
    """
    state = _state
    if state is None:
        state = _get_state()
    state.checkpoint_saved(when)


def current_status() -> TrainerStatus | None:
    """The status as it would be served now, or ``None`` before the first update."""
    state = _state if _state is not None else _get_state()
    return state.status()


def start(port: int | None = None, host: str | None = None, *, status_file: str | None = None,
          termination_message_path: str | None = None, reporting_rank: int = 0,
          install_signal_handler: bool = True) -> Exporter:
    """Start serving ``/metrics`` in a daemon thread; idempotent (returns the running exporter).

    Args:
        port: TCP port; default ``$TRAINJOB_EXPORTER_PORT`` or 28080; 0 picks a free port.
        host: bind address; default ``$TRAINJOB_EXPORTER_HOST`` or ``0.0.0.0``.
        status_file: also write each status there; default ``$KUBEFLOW_TRAINER_STATUS_FILE``.
        termination_message_path: where the final status goes on exit; default
            ``$TRAINJOB_EXPORTER_TERMINATION_MESSAGE_PATH``, else ``/dev/termination-log``
            when that file exists (the kubelet creates it in a container).
        reporting_rank: the global rank that serves (others get a non-serving exporter).
        install_signal_handler: on SIGTERM write the final status, then let the previous
            handler (or the default action) run.  Only possible from the main thread.

    A port already in use logs one warning; training goes on without serving.
    Never raises for configuration problems; bad ``$TRAINJOB_EXPORTER_PORT`` falls back
    to 28080 with a warning.
    """
    global _exporter, _final, _state, _hooks_installed
    with _lock:
        if _exporter is not None:
            return _exporter
        reporting = is_reporting_process(reporting_rank=reporting_rank)
        if _state is None or isinstance(_state, _NoState) == reporting:
            _state = State() if reporting else _NoState()
        state = _state
        exporter = Exporter(
            state, state,
            host=host or os.environ.get(ENV_HOST) or DEFAULT_HOST,
            port=_port(port),
            status_file=status_file or os.environ.get(ENV_STATUS_FILE) or None,
            termination_message_path=termination_message_path,
            serve=reporting,
        )
        _exporter = _final = exporter
        if reporting and not _hooks_installed:
            _hooks_installed = True
            atexit.register(_at_exit)
            if install_signal_handler:
                _install_sigterm()
        return exporter


def stop() -> None:
    """Stop the running exporter (if any) and forget it; the reported status is kept."""
    global _exporter
    with _lock:
        exporter, _exporter = _exporter, None
    if exporter is not None:
        exporter.stop()


def enable_push_compat(namespace: str | None = None, name: str | None = None,
                       token_file: str | None = None) -> str | None:
    """Make push-design clients report into this process's exporter (starting it if needed).

    Sets ``KUBEFLOW_TRAINER_SERVER_URL`` (loopback http, the push path) and
    ``KUBEFLOW_TRAINER_SERVER_TOKEN`` (a private token file the exporter checks),
    so the Kubeflow SDK's ``update_trainjob_status`` and Transformers' Kubeflow
    integration post into it unchanged.  Returns the URL, or ``None`` when this
    process does not serve.  Opt-in: nothing calls it for you.
    """
    return start().enable_push_compat(namespace, name, token_file)


def get_exporter() -> Exporter | None:
    """The running exporter, or ``None`` before :func:`start`."""
    return _exporter


def _reset_for_tests() -> None:
    """Stop and forget everything, re-reading rank variables on next use (tests only)."""
    global _state, _final
    stop()
    with _lock:
        _state = None
        _final = None


def _port(port: int | None) -> int:
    if port is not None:
        return port
    text = os.environ.get(ENV_PORT)
    if not text:
        return DEFAULT_PORT
    try:
        return int(text)
    except ValueError:
        log.warning("%s=%r is not a port number; using %d", ENV_PORT, text, DEFAULT_PORT)
        return DEFAULT_PORT


def _at_exit() -> None:
    exporter = _final
    if exporter is not None:
        exporter.write_final_status()


def _install_sigterm() -> None:
    if threading.current_thread() is not threading.main_thread():
        log.info("not installing a SIGTERM handler: start() was called off the main thread")
        return
    previous = signal.getsignal(signal.SIGTERM)

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        _at_exit()
        if callable(previous):
            previous(signum, frame)
        elif previous == signal.SIG_IGN:
            return
        else:  # default action: die by the signal, as without us
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)

    try:
        signal.signal(signal.SIGTERM, on_sigterm)
    except ValueError as exc:  # e.g. embedded interpreters
        log.info("not installing a SIGTERM handler: %s", exc)
