"""Sidecar mode: ``python -m exporter_lib serve --status-file PATH`` or ``--push``.

``--status-file``: for training code in any language; it writes ``TrainerStatus``
JSON (camelCase, as ``docs/exporter.md`` shows) to a file, atomically (temp file +
rename), and this process serves it on ``/metrics`` exactly like the in-process
exporter.

``--push --token-file PATH``: for training code written for the push design
(Transformers' built-in Kubeflow integration, the Kubeflow SDK's
``update_trainjob_status``), unchanged: the sidecar writes a fresh random token to
``PATH`` (a shared ``emptyDir``; a restarted sidecar keeps the token it wrote there
earlier in the pod's life, so the trainer's cached token stays valid), accepts
``POST``s with it on the push path
(:mod:`exporter_lib.push`: 401 wrong token, 403 another TrainJob than this pod's as
:mod:`exporter_lib.identity` reads it, 400/422 bad bodies) and serves the newest
pushed status.  The trainer container finds it through
``KUBEFLOW_TRAINER_SERVER_URL``/``KUBEFLOW_TRAINER_SERVER_TOKEN`` (set by the
zero-code runtime overlay, ``charts/runtime-overlays/zero-code``).

Either way, on SIGTERM/SIGINT it writes the last status to its own container's
termination message and exits 0.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from types import FrameType

from exporter_lib.api import DEFAULT_HOST, DEFAULT_PORT, ENV_HOST, ENV_PORT, Exporter
from exporter_lib.exposition import StatusSource
from exporter_lib.files import ENV_STATUS_FILE, StatusFileSource
from exporter_lib.identity import ENV_POD_NAMESPACE, ENV_TRAINJOB_NAME, pod_trainjob
from exporter_lib.push import Replaceable, TokenFile
from exporter_lib.state import State

#: Token file modes ``--token-mode`` accepts: never readable or writable by others.
TOKEN_MODES = (0o400, 0o440, 0o600, 0o640)
_TOKEN_MODES_TEXT = ", ".join(f"{m:04o}" for m in TOKEN_MODES)


def main(argv: list[str] | None = None) -> int:
    """Run the sidecar until SIGTERM/SIGINT; returns the exit code (2 for bad arguments,
    1 when it cannot listen or cannot write the token file)."""
    parser = argparse.ArgumentParser(prog="python -m exporter_lib",
                                     description="Serve a TrainerStatus on /metrics.")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve a status file, or statuses pushed to it")
    source = serve.add_mutually_exclusive_group()
    source.add_argument("--status-file", default=None,
                        help=f"JSON status file to serve (default ${ENV_STATUS_FILE})")
    source.add_argument("--push", action="store_true",
                        help="serve what push clients (Transformers' Kubeflow integration, "
                             "the Kubeflow SDK) POST to the push path; needs --token-file")
    serve.add_argument("--token-file", default=None,
                       help="with --push: where to write the fresh random bearer token "
                            "(on a volume the trainer container mounts)")
    serve.add_argument("--token-mode", default="0600",
                       help="with --push: the token file's permission bits, octal, one of "
                            + _TOKEN_MODES_TEXT + " (default 0600)")
    serve.add_argument("--port", type=_port, default=os.environ.get(ENV_PORT) or DEFAULT_PORT,
                       help=f"TCP port, 0-65535 (0: any free one; default ${ENV_PORT} or "
                            f"{DEFAULT_PORT})")
    serve.add_argument("--host", default=os.environ.get(ENV_HOST) or DEFAULT_HOST)
    serve.add_argument("--termination-message-path", default=None,
                       help="where to write the last status on exit "
                            "(default $TRAINJOB_EXPORTER_TERMINATION_MESSAGE_PATH or "
                            "/dev/termination-log when present)")
    serve.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    token_mode = _token_mode(parser, args)
    if not args.push:
        args.status_file = args.status_file or os.environ.get(ENV_STATUS_FILE)
        if not args.status_file:
            parser.error("--status-file (or $KUBEFLOW_TRAINER_STATUS_FILE) or --push is required")
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    token = None
    if args.push:
        # Written before the port opens: a startupProbe that reaches /healthz knows the
        # trainer container, started after it, finds the token.
        token = TokenFile(args.token_file, token_mode, keep_existing=True)
        try:
            token.ensure()
        except OSError as exc:
            print(f"exporter_lib serve: cannot write the token file {args.token_file}: {exc}",
                  file=sys.stderr)
            return 1
    # Before the port opens: a SIGTERM right after the first answer (a kubelet stopping a
    # pod early) must still end in the termination message and exit 0, not the default kill.
    done = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        done.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    exporter = _exporter(args, token)
    if not exporter.serving:
        # In-process, a busy port must not stop training; here serving is the whole job.
        print(f"exporter_lib serve: cannot listen on {args.host}:{args.port} (see the warning "
              "above); nothing to do without it, exiting", file=sys.stderr)
        return 1
    if args.push:
        own = pod_trainjob()  # before enabling: that sets our own URL in this environment
        url = exporter.enable_push_compat(token_file=args.token_file, token_mode=token_mode)
        print(f"accepting pushes on {url} (token in {args.token_file}, mode {token_mode:04o}); "
              f"serving them on http://{args.host}:{exporter.port}/metrics",
              file=sys.stderr, flush=True)
        if own.name is None or own.namespace is None:
            print(f"exporter_lib serve: this pod's TrainJob is only known as {own.describe()}: "
                  f"pushes naming any {'TrainJob' if own.name is None else 'namespace'} are "
                  f"accepted (set {ENV_TRAINJOB_NAME} and {ENV_POD_NAMESPACE} through the "
                  "downward API to check them)", file=sys.stderr, flush=True)
    else:
        print(f"serving {args.status_file} on http://{args.host}:{exporter.port}/metrics",
              file=sys.stderr, flush=True)
    while not done.wait(3600):
        pass
    exporter.write_final_status()
    exporter.stop()
    return 0


def _port(text: str | int) -> int:
    """``--port``: an integer 0-65535 (the range of a TCP port)."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: not an integer") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port}: must be between 0 and 65535")
    return port


def _token_mode(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    if not args.push:
        if args.token_file is not None:
            parser.error("--token-file is only used with --push")
        return 0o600
    if not args.token_file:
        parser.error("--push needs --token-file PATH (a file on a volume the trainer "
                     "container mounts; it gets a fresh random token)")
    try:
        mode = int(args.token_mode, 8)
    except ValueError:
        mode = -1
    if mode not in TOKEN_MODES:
        parser.error(f"--token-mode {args.token_mode!r}: must be one of {_TOKEN_MODES_TEXT}"
                     " (the token must never be readable by other users)")
    return mode


def _exporter(args: argparse.Namespace, token: TokenFile | None) -> Exporter:
    source: StatusSource
    target: Replaceable
    if args.push:
        source = target = State()  # a push replaces the whole status, as in-process
    else:
        source, target = StatusFileSource(args.status_file), _ReadOnly()
    return Exporter(source, target, host=args.host, port=args.port, status_file=None,
                    termination_message_path=args.termination_message_path, serve=True,
                    token=token)


class _ReadOnly:
    """The status-file sidecar's target for pushes: none arrive, as no push token is ever
    configured (403)."""

    def replace(self, status: object, stamp: float | None = None) -> None:
        return None

if __name__ == "__main__":
    sys.exit(main())
