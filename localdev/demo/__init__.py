"""The demo, ``python -m localdev.demo`` (``make demo``; see :mod:`localdev.demo.runner`).

Parsing the command line imports nothing heavy: the demo's own needs (rich, numpy,
cryptography) are in the ``demo`` extra, which a deployed scraper does not install.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from pathlib import Path


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: must be at least 1")
    return value


def _interval(text: str) -> str:
    from scraper.syntax import IntervalOutOfRange, parse_interval

    try:
        parse_interval(text)
    except IntervalOutOfRange as exc:
        raise argparse.ArgumentTypeError(f"{text!r}: {exc}") from None
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _handler(args: argparse.Namespace) -> int:
    from localdev.demo import runner

    return runner.main(args)


_DESCRIPTION = """\
Run the whole path on this machine with live progress.

Local mode (no --kubeconfig and no $KUBECONFIG): build or reuse the local cluster
(kube-apiserver, etcd, kube-controller-manager, kube-scheduler, kwok, the JobSet and
Kubeflow Trainer controllers, a pod runner), create a TrainJob on the shipped
torch-distributed runtime, let the controllers make its JobSet, Job and pod, whose
training process (instrumented with exporter_lib) the pod runner runs; run the
scraper, show TrainJob status.trainerStatus live, then the final status as kubectl
reads it and the controllers' objects.

Cluster mode (--kubeconfig, or $KUBECONFIG unless --local): run the scraper against
that cluster and show its TrainJobs live.
"""


def build_parser() -> argparse.ArgumentParser:
    """The demo's argument parser (``python -m localdev.demo --help``)."""
    parser = argparse.ArgumentParser(
        prog="python -m localdev.demo",
        description=_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--framework", choices=("numpy", "transformers"), default="numpy",
                        help="training code: a numpy network (default, seconds) or a tiny "
                        "Hugging Face Transformers model (needs torch and transformers)")
    parser.add_argument("--zero-code", choices=("logs",), default=None, dest="zero_code",
                        help="logs: a training that imports nothing of this project and "
                        "prints a plain tqdm bar (localdev/demo/train_tqdm.py), on a runtime "
                        "whose pods carry trainjob-progress.dev/source: logs; the scraper "
                        "reads the bar from the pod's log (docs/log-source.md)")
    parser.add_argument("--epochs", type=_positive_int, default=4,
                        help="training epochs (default 4: about 90 s of training on two cores; "
                        "the first run also builds the local cluster: README.md, Times)")
    parser.add_argument("--interval", default="2s", type=_interval,
                        help="scrape interval given to the scraper (default 2s)")
    parser.add_argument("--kubeconfig", type=Path, default=None,
                        help="run the scraper against this cluster instead of a local "
                        "control plane (also taken from $KUBECONFIG)")
    parser.add_argument("--local", action="store_true",
                        help="use a local control plane even when $KUBECONFIG is set")
    parser.add_argument("--namespace", default=None,
                        help="cluster mode: only this namespace (default: all); refused in "
                        "local mode, whose TrainJob runs in namespace trainjob-demo")
    parser.add_argument("--duration", type=_positive_int, default=None,
                        help="cluster mode: stop this many seconds after the start, the "
                        "scraper's start-up included (default: Ctrl-C); refused in local "
                        "mode, which ends with its TrainJob")
    parser.add_argument("--push", action="store_true",
                        help="local mode: turn on Kubeflow Trainer's TrainJobStatus feature "
                        "gate, so its status server runs next to the scraper (both write "
                        "trainerStatus; docs/scraper.md, coexistence)")
    parser.add_argument("--keep", action="store_true",
                        help="keep the work directory (logs, kubeconfig) after the demo")
    parser.add_argument("--hold", action="store_true",
                        help="local mode: keep the cluster and the scraper running after the "
                        "training ends, until Ctrl-C, to try kubectl trainjob on it")
    parser.set_defaults(handler=_handler)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` and run the demo; returns the exit code."""
    args = build_parser().parse_args(argv)
    handler: Callable[[argparse.Namespace], int] = args.handler
    return handler(args)


