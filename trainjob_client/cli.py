"""``kubectl-trainjob``: the kubectl plugin that shows TrainJob progress.

kubectl runs any ``kubectl-<name>`` executable on ``PATH`` as ``kubectl <name>``, so::

    kubectl trainjob progress [NAME] [-n NS | -A] [--metrics loss,accuracy] [-o json|yaml]
    kubectl trainjob watch NAME [-n NS] [--metrics ...] [-o json|yaml] [--timeout SECONDS]

``progress`` prints one row per TrainJob; ``watch`` follows one TrainJob by a watch on
the API until its Complete or Failed condition is True or it reports 100 percent.
Exit codes: 0 done, 1 an error (message on stderr, ``error: ...`` like kubectl), 2 a
usage error (argparse), 3 ``watch`` saw the TrainJob fail, 130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from typing import IO, Any

import yaml

from trainjob_client import table
from trainjob_client.annotation import TRAINER_STATUS_ANNOTATION
from trainjob_client.bar import TrainJobBar
from trainjob_client.kube import (
    NoTrainerStatus,
    TrainJobReadError,
    TrainJobs,
    connect,
)
from trainjob_client.progress import TrainJobProgress, trainjob_progress

EXIT_ERROR = 1
EXIT_FAILED = 3
EXIT_INTERRUPTED = 130


def _metrics(value: str) -> list[str]:
    names = [n.strip() for n in value.split(",") if n.strip()]
    if not names:
        raise argparse.ArgumentTypeError(f"--metrics={value!r}: give metric names, "
                                         "comma-separated (e.g. loss,accuracy)")
    return names


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-n", "--namespace", help="namespace (default: the context's, else "
                                                  "default)")
    parser.add_argument("--metrics", type=_metrics, action="extend", default=[],
                        metavar="NAME[,NAME...]",
                        help="metrics to show as columns (repeatable), e.g. loss,accuracy")
    parser.add_argument("-o", "--output", choices=("table", "json", "yaml"), default="table",
                        help="output format (default: table)")
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, else "
                                             "~/.kube/config, else in-cluster)")
    parser.add_argument("--context", help="kubeconfig context (default: the current one)")


def _seconds(text: str) -> float:
    """``--timeout``'s value: a finite number of seconds above 0.

    Raises:
        argparse.ArgumentTypeError: anything else, naming the value and the limit.
    """
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds > 0")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``kubectl-trainjob`` (``progress`` and ``watch``)."""
    parser = argparse.ArgumentParser(
        prog="kubectl trainjob",
        description="Show the progress of Kubeflow TrainJobs (status.trainerStatus, or the "
                    f"{TRAINER_STATUS_ANNOTATION} annotation on Trainer before v2.2).")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    progress = commands.add_parser(
        "progress", help="print a table of TrainJobs and their progress",
        description="Print one row per TrainJob: progress bar and percent, ETA, age of the "
                    "last update and the chosen metrics.")
    progress.add_argument("name", nargs="?", help="one TrainJob (default: all in the namespace)")
    progress.add_argument("-A", "--all-namespaces", action="store_true",
                          help="TrainJobs of every namespace")
    _common(progress)
    follow = commands.add_parser(
        "watch", help="follow one TrainJob live until it ends or reports 100 percent",
        description="Follow one TrainJob until its Complete or Failed condition is True or "
                    "it reports 100 percent: a live bar on a terminal, one row (or JSON/YAML "
                    "document) per change otherwise.")
    follow.add_argument("name", help="the TrainJob")
    follow.add_argument("--timeout", type=_seconds, default=None, metavar="SECONDS",
                        help="give up after this many seconds (default: no limit)")
    _common(follow)
    return parser


def _dump(data: Any, output: str, out: IO[str]) -> None:
    if output == "json":
        out.write(json.dumps(data, indent=2, sort_keys=False) + "\n")
    else:
        out.write(yaml.safe_dump(data, sort_keys=False))


def _ascii_only(out: IO[str]) -> bool:
    return "utf" not in (getattr(out, "encoding", None) or "").lower()


def run_progress(args: argparse.Namespace, trainjobs: TrainJobs, namespace: str,
                 out: IO[str]) -> int:
    """``kubectl trainjob progress``: print the table (or JSON/YAML); return the exit code.

    Raises:
        NoTrainerStatus: ``NAME`` was given and it has no trainer status yet.
        TrainJobReadError: the read failed.
    """
    if args.name:
        item = trainjob_progress(trainjobs.get(namespace, args.name))
        if item.status is None:
            raise NoTrainerStatus(
                f'TrainJob "{item.name}" in namespace "{item.namespace}" has no trainer '
                f"status yet: "
                + (item.problem or f"neither status.trainerStatus nor the annotation "
                   f"{TRAINER_STATUS_ANNOTATION} is set (is the scraper deployed and the "
                   "training's exporter started?)"))
        items = [item]
    else:
        items = [trainjob_progress(t) for t in
                 trainjobs.list(None if args.all_namespaces else namespace)]
    if args.output != "table":
        _dump(items[0].to_dict() if args.name else {"items": [i.to_dict() for i in items]},
              args.output, out)
        return 0
    if not items:
        where = "any namespace" if args.all_namespaces else f'namespace "{namespace}"'
        print(f"No TrainJobs found in {where}.", file=sys.stderr)
        return 0
    out.write(table.render(items, args.metrics, all_namespaces=args.all_namespaces,
                           ascii_only=_ascii_only(out)))
    _warn_unreported(_reported(items), args.metrics, "no TrainJob shown reports")
    return 0


def _reported(items: Sequence[TrainJobProgress]) -> set[str]:
    """The metric names the items' statuses report."""
    return {name for item in items if item.status is not None
            for name in item.status.metrics_dict()}


def _warn_unreported(reported: set[str], metrics: Sequence[str], what: str) -> None:
    """On stderr, each ``--metrics`` name not in ``reported`` (a typo shows only as
    ``<none>`` cells otherwise), with the names that are, and the one it differs from only
    in case (metric names are compared exactly)."""
    known = ", ".join(sorted(reported)) if reported else "none"
    by_case = {name.lower(): name for name in reported}
    for name in metrics:
        if name not in reported:
            near = by_case.get(name.lower())
            hint = f'; names are case-sensitive: did you mean "{near}"?' if near else ""
            print(f'Warning: {what} metric "{name}" (metrics reported: {known}){hint}',
                  file=sys.stderr)


def _finished(item: TrainJobProgress) -> bool:
    return item.ended or item.at_full_progress


def run_watch(args: argparse.Namespace, trainjobs: TrainJobs, namespace: str,
              out: IO[str]) -> int:
    """``kubectl trainjob watch``: follow until the TrainJob ends; return the exit code.

    Raises:
        TrainJobReadError: the TrainJob is missing, gets deleted, or a read failed, or
            ``--timeout`` passed first (the message names the last state).
    """
    live = args.output == "table" and out.isatty()
    bar = TrainJobBar(args.name, args.metrics, file=out) if live else None
    last: TrainJobProgress | None = None
    shown: tuple[Any, ...] | None = None
    reported: set[str] = set()  # every metric name seen during the watch
    try:
        for obj in trainjobs.watch(namespace, args.name, timeout=args.timeout):
            last = trainjob_progress(obj)
            reported |= _reported([last])
            if bar is not None:
                bar.show(last)
            elif (key := (last.state, last.status, last.problem)) != shown:
                # One line per change, not one per event of an unchanged status.
                _print_change(args, last, first=shown is None, out=out)
                shown = key
            if _finished(last):
                break
    finally:
        if bar is not None:
            bar.close()
        if args.output == "table" and last is not None:  # only the table shows --metrics
            _warn_unreported(reported, args.metrics, f'TrainJob "{args.name}" never reported')
    if last is None or not _finished(last):
        seen = "no trainer status" if last is None or last.status is None else \
            f"{last.status.progress_percentage}%"
        raise TrainJobReadError(
            f'TrainJob "{args.name}" in namespace "{namespace}" did not end within '
            f"--timeout={args.timeout:g}s (last seen: {seen}, "
            f"state {(last.state if last else '') or '<none>'})")
    if last.state == "Failed":
        print(f'TrainJob "{last.name}" in namespace "{last.namespace}" Failed', file=sys.stderr)
        return EXIT_FAILED
    return 0


def _print_change(args: argparse.Namespace, item: TrainJobProgress, *, first: bool,
                  out: IO[str]) -> None:
    if args.output == "json":
        out.write(json.dumps(item.to_dict(), separators=(",", ":")) + "\n")
    elif args.output == "yaml":
        out.write("---\n" + yaml.safe_dump(item.to_dict(), sort_keys=False))
    else:
        # kubectl get -w style: the header once, then one row per change.  Columns are
        # sized per line, so each row is rendered with the header and the header dropped.
        lines = table.render([item], args.metrics, ascii_only=_ascii_only(out)).splitlines()
        out.write(("\n".join(lines) if first else lines[1]) + "\n")
    out.flush()


def main(argv: Sequence[str] | None = None, out: IO[str] | None = None) -> int:
    """Run ``kubectl-trainjob`` with ``argv`` (default: ``sys.argv[1:]``); return the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "all_namespaces", False) and getattr(args, "name", None):
        parser.error("a TrainJob NAME and -A/--all-namespaces exclude each other")  # exit 2
    args.metrics = list(dict.fromkeys(args.metrics))  # a name given twice is one column
    out = out or sys.stdout
    try:
        connection = connect(args.kubeconfig, args.context)
        trainjobs = TrainJobs(connection.api_client)
        namespace = args.namespace or connection.namespace
        if args.command == "progress":
            return run_progress(args, trainjobs, namespace, out)
        return run_watch(args, trainjobs, namespace, out)
    except TrainJobReadError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
