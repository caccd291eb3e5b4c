"""Sidecar mode: ``python -m exporter_lib serve --status-file PATH``.

For training code in any language: it writes ``TrainerStatus`` JSON
(camelCase, as ``docs/exporter.md`` shows) to a file, atomically (temp file +
rename), and this process serves it on ``/metrics`` exactly like the in-process
exporter.  On SIGTERM/SIGINT it writes the last status to its own container's
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
from exporter_lib.files import ENV_STATUS_FILE, StatusFileSource


def main(argv: list[str] | None = None) -> int:
    """Run the sidecar until SIGTERM/SIGINT; returns the exit code (2 for bad arguments)."""
    parser = argparse.ArgumentParser(prog="python -m exporter_lib",
                                     description="Serve a TrainerStatus JSON file on /metrics.")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve a status file written by any program")
    serve.add_argument("--status-file", default=os.environ.get(ENV_STATUS_FILE),
                       help=f"JSON status file to serve (default ${ENV_STATUS_FILE})")
    serve.add_argument("--port", type=int, default=int(os.environ.get(ENV_PORT) or DEFAULT_PORT))
    serve.add_argument("--host", default=os.environ.get(ENV_HOST) or DEFAULT_HOST)
    serve.add_argument("--termination-message-path", default=None,
                       help="where to write the last status on exit "
                            "(default $TRAINJOB_EXPORTER_TERMINATION_MESSAGE_PATH or "
                            "/dev/termination-log when present)")
    serve.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    if not args.status_file:
        parser.error("--status-file (or $KUBEFLOW_TRAINER_STATUS_FILE) is required")
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    source = StatusFileSource(args.status_file)
    exporter = Exporter(source, _ReadOnly(), host=args.host, port=args.port, status_file=None,
                        termination_message_path=args.termination_message_path, serve=True)
    if not exporter.serving:
        # In-process, a busy port must not stop training; here serving is the whole job.
        print(f"exporter_lib serve: cannot listen on {args.host}:{args.port} (see the warning "
              "above); nothing to do without it, exiting", file=sys.stderr)
        return 1
    print(f"serving {args.status_file} on http://{args.host}:{exporter.port}/metrics",
          file=sys.stderr, flush=True)
    done = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        done.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    while not done.wait(3600):
        pass
    exporter.write_final_status()
    exporter.stop()
    return 0


class _ReadOnly:
    """The sidecar's target for pushes: none arrive, as no push token is ever configured (403)."""

    def replace(self, status: object, stamp: float | None = None) -> None:
        return None

if __name__ == "__main__":
    sys.exit(main())
