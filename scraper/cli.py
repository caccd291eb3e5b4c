"""``trainjob-scraper`` command line (also ``python -m scraper``).

Subcommands are pluggable: each is one ``add_<name>(subparsers)`` function in
:data:`SUBCOMMANDS` that adds its parser and sets ``handler`` (a callable
taking the parsed namespace and returning an exit code).  Adding one is adding
a function to that list.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import re
import signal
import sys
from collections.abc import Callable, Sequence
from typing import Any

from scraper.config import (
    DURATION_FIELDS,
    ENV_PREFIX,
    ConfigError,
    ScraperSettings,
    load_settings,
    removed_option,
    unknown_environment,
)

Handler = Callable[[argparse.Namespace], int]
AddSubcommand = Callable[["argparse._SubParsersAction[argparse.ArgumentParser]"], None]

_LIST_FIELDS = {"namespaces"}

def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _attach_dashed_values(given: list[str]) -> list[str]:
    """``--resync-interval -1s`` as ``--resync-interval=-1s``: argparse takes a value
    that starts with a dash and is not a plain number (``-1s``, ``-5m``) for an unknown
    option and says only "expected one argument", so the option's own check (which
    names the value and the limit) never ran.  Only flags that take a value are joined."""
    takes_value = {"--config"} | {_flag(name) for name, info in
                                  ScraperSettings.model_fields.items()
                                  if info.annotation is not bool}
    out: list[str] = []
    i = 0
    while i < len(given):
        if (given[i] in takes_value and i + 1 < len(given)
                and re.match(r"-[\d.]", given[i + 1])):
            out.append(f"{given[i]}={given[i + 1]}")
            i += 2
            continue
        out.append(given[i])
        i += 1
    return out


def add_run(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``run``: the scraper service.  One flag per :class:`ScraperSettings` field."""
    parser = subparsers.add_parser(
        "run",
        help="watch trainer pods, scrape their exporters, write TrainJob status",
        description=(
            "Discover the rank-0 trainer pod of every TrainJob, scrape its progress "
            "exporter and write TrainJob.status.trainerStatus by server-side apply. "
            f"Every option can also be set as an environment variable ({ENV_PREFIX}<OPTION>, "
            f"e.g. {ENV_PREFIX}INTERVAL=15s) or in the --config file; flags win over the "
            "environment, which wins over the file. Durations take 30s, 2m, 1h or seconds."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--config", metavar="FILE",
                        help="YAML or JSON file of options (keys as the flags, without --)")
    for name, info in ScraperSettings.model_fields.items():
        shown: object = "unset" if info.default_factory is not None or info.default is None \
            else info.default
        if name in DURATION_FIELDS and isinstance(shown, float):
            shown = f"{shown:g}s"
        elif name == "stall_after":
            shown = "auto"  # None is the auto threshold (scraper.stall.rule), not "off"
        env = f"{ENV_PREFIX}{name.upper()}"
        # argparse formats help with %: a literal one is written %% there.
        help_text = f"{info.description} [env {env}; default: {shown}]".replace("%", "%%")
        if info.annotation is bool:
            parser.add_argument(_flag(name), dest=name, action=argparse.BooleanOptionalAction,
                                default=None, help=help_text)
        elif name in _LIST_FIELDS:
            parser.add_argument(_flag(name), dest=name, metavar="NS[,NS...]", default=None,
                                help=help_text)
        else:
            parser.add_argument(_flag(name), dest=name, metavar=name.upper(), default=None,
                                help=help_text)
    parser.set_defaults(handler=_run)
    # The generated help already says where the default comes from.
    parser.formatter_class = argparse.RawDescriptionHelpFormatter


def _run(args: argparse.Namespace) -> int:
    flags: dict[str, Any] = {
        name: getattr(args, name) for name in ScraperSettings.model_fields
        if getattr(args, name, None) is not None
    }
    # Before the options are checked and whatever the log level: a misspelled variable
    # may be why another option is not what was meant.
    for problem in unknown_environment():
        print(f"trainjob-scraper: warning: {problem}", file=sys.stderr)
    try:
        settings = load_settings(flags, args.config)
    except ConfigError as exc:
        print(f"trainjob-scraper: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=settings.log_level,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # APScheduler logs every added job and every run at INFO: keep its warnings only.
    logging.getLogger("apscheduler").setLevel(logging.WARNING)
    _log_write_rate(settings)
    return asyncio.run(_serve(settings))


def _log_write_rate(settings: ScraperSettings) -> None:
    """Say at start which write rate is in effect: a --write-qps at or above the ceiling
    turns the adaptive rate off, and nothing else would tell."""
    from scraper.write.rate import adapts

    qps, ceiling = settings.write_qps, settings.write_qps_max
    if adapts(qps, ceiling):
        logging.getLogger("scraper.write.rate").info(
            "status writes: adaptive rate from %g up to %g writes/s (--write-qps, "
            "--write-qps-max), burst %d", qps, ceiling, settings.write_burst)
    else:
        logging.getLogger("scraper.write.rate").warning(
            "status writes: a fixed %g writes/s, burst %d: --write-qps-max %g is not above "
            "--write-qps, so the rate does not adapt to the API server", qps,
            settings.write_burst, ceiling)


async def _serve(settings: ScraperSettings) -> int:
    from scraper.app import ScraperApp  # heavy imports only when running
    from scraper.supervisor import RootTaskFailed

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        app = ScraperApp(settings)
    except Exception as exc:  # building the parts reads the kubeconfig; no request yet
        source = f"--kubeconfig {settings.kubeconfig}" if settings.kubeconfig else \
            "the in-cluster ServiceAccount or the default kubeconfig"
        print(f"trainjob-scraper: cannot load the Kubernetes configuration from {source}: "
              f"{' '.join(str(exc).split())}", file=sys.stderr)
        return 1
    try:
        await app.run(stop)
    except ConfigError as exc:  # the API server rejected an option (the selector)
        print(f"trainjob-scraper: {exc}", file=sys.stderr)
        return 2
    except RootTaskFailed as exc:  # already logged with its traceback when it happened
        print(f"trainjob-scraper: {exc}: {exc.__cause__!r}", file=sys.stderr)
        return 1
    except OSError as exc:  # e.g. the listen port is taken
        print(f"trainjob-scraper: {exc}", file=sys.stderr)
        return 1
    return 0


#: Every subcommand's ``add_*`` function, in ``--help`` order.
SUBCOMMANDS: list[AddSubcommand] = [add_run]


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with every registered subcommand."""
    parser = argparse.ArgumentParser(
        prog="trainjob-scraper",
        description="Pull-based progress for Kubeflow TrainJobs: scrape trainer pods' "
        "exporters and write TrainJob.status.trainerStatus.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for add in SUBCOMMANDS:
        add(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``trainjob-scraper`` console script; returns the exit code."""
    given = sys.argv[1:] if argv is None else list(argv)
    for arg in given:
        flag = arg.split("=", 1)[0]
        hint = removed_option(flag) if flag.startswith("--") else None
        if hint:  # argparse alone would say only "unrecognized arguments"
            print(f"trainjob-scraper: {flag} was removed: {hint}", file=sys.stderr)
            return 2
    args = build_parser().parse_args(_attach_dashed_values(given))
    handler: Handler = args.handler
    return handler(args)


if __name__ == "__main__":
    sys.exit(main())
