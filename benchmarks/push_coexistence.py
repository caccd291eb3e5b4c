"""Push and pull writing the same TrainJob: who owns which field, writes per minute, flapping.

``python -m benchmarks.push_coexistence [--epochs N] [--samples N] [--down-at P]``

Starts a local cluster with Kubeflow Trainer v2.3.0's ``TrainJobStatus`` gate on
(:class:`localdev.cluster.stack.Cluster` ``push=True``), runs the scraper as
deployed (``python -m scraper run --interval 1s``) and one real Transformers
training that reports both ways (``tests/helpers/coexistence.py``), then writes a
Markdown report (``benchmarks/reports/push-coexistence-<time>.md``) and prints it:

* per field of ``status.trainerStatus``, which field manager owns it at the end;
* changes of trainerStatus per minute by writer (the manager whose managedFields
  entry changed last), over the span from the first to the last change;
* owner changes (the set of managers owning any trainerStatus field) and flaps
  (an owner set coming back after another one);
* the held status at the end, and with ``--down-at`` whether the final arrived
  while the status server (the Trainer controller) was down across the end.

Nothing is mocked; the numbers are from the watch (every version, no polling).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from kubernetes import client

from localdev.cluster.owners import trainer_status_entries
from localdev.cluster.stack import Cluster
from tests.helpers.coexistence import Run, run_both_writers

REPORTS = Path(__file__).resolve().parent / "reports"
NAMESPACE = "coexistence"


def field_owners(obj: dict[str, Any]) -> dict[str, list[str]]:
    """``{trainerStatus field: [managers owning it]}`` from the object's managedFields."""
    result: dict[str, list[str]] = {}
    for entry in trainer_status_entries(obj):
        fields = entry["fieldsV1"]["f:status"]["f:trainerStatus"]
        for key in fields:
            if key.startswith("f:"):
                result.setdefault(key[2:], []).append(entry["manager"])
    return {k: sorted(v) for k, v in sorted(result.items())}


def flaps(run: Run) -> int:
    """Owner sets that come back after another owner set held trainerStatus."""
    seen: set[frozenset[str]] = set()
    count = 0
    previous: frozenset[str] | None = None
    for write in run.owner_changes:
        if write.owners in seen and write.owners != previous:
            count += 1
        seen.add(write.owners)
        previous = write.owners
    return count


def report(run: Run, label: str, scraper_ref: str, load: str) -> str:
    history = run.history
    counts = Counter(w.writer for w in history)
    rate = run.writes_per_minute
    span = (history[-1].at - history[0].at).total_seconds() if len(history) > 1 else 0.0
    last = run.versions[-1] if run.versions else {}
    lines = [
        f"# Push and pull on one TrainJob: {label}",
        "",
        f"Scraper: {scraper_ref}.  Trainer v2.3.0 with `TrainJobStatus` on (status server, "
        "field manager `trainer-status`); scraper `python -m scraper run --interval 1s` "
        "(`trainjob-scraper`); one Transformers training with exporter_lib's callback and "
        "Transformers' own KubeflowCallback (pushes at most every 5 s).",
        f"Machine load (uptime at the end): {load}.",
        "",
        f"Trainer container exit code {run.exit_code}, finished at {run.finished_at}.",
        "",
        f"Changes of trainerStatus seen by the watch: {len(history)} over {span:.0f} s.",
        "",
        "| writer | changes | per minute |",
        "|---|---|---|",
    ]
    for writer in sorted(counts, key=str):
        lines.append(f"| `{writer}` | {counts[writer]} | {rate.get(str(writer), 0.0):.1f} |")
    lines += [
        "",
        f"Owner changes: {len(run.owner_changes)}; flaps (an owner set coming back): "
        f"{flaps(run)}.",
        "",
        "Owner sequence: " + " -> ".join("+".join(sorted(w.owners)) or "-"
                                          for w in run.owner_changes),
        "",
        "Field owners at the end:",
        "",
        "| field | owners |",
        "|---|---|",
    ]
    for name, managers in field_owners(last).items():
        lines.append(f"| `{name}` | {', '.join(managers)} |")
    held = run.held or {}
    lines += ["", f"Held at the end: progressPercentage {held.get('progressPercentage')}, "
                  f"{len(held.get('metrics') or [])} metrics, lastUpdatedTime "
                  f"{held.get('lastUpdatedTime')}."]
    if run.down is not None:
        final = run.final_while_down or {}
        lines += ["", f"Status server down from {run.down[0]:%H:%M:%S} to {run.down[1]:%H:%M:%S}; "
                      f"held once the pod ended, still down: progressPercentage "
                      f"{final.get('progressPercentage')}."]
    lines += ["", "Every change (time seen, writer, owners, progress):", "", "```"]
    lines += [f"{w.at:%H:%M:%S.%f} {w.writer} {'+'.join(sorted(w.owners))} "
              f"{(w.status or {}).get('progressPercentage')}" for w in history]
    lines += ["```", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.push_coexistence",
                                     description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--samples", type=int, default=512)
    parser.add_argument("--down-at", type=int, default=None, metavar="PROGRESS",
                        help="stop the status server at this progress until the final arrived")
    parser.add_argument("--label", default="main", help="what scraper this measures")
    parser.add_argument("--scraper-pythonpath", default=None,
                        help="PYTHONPATH of the scraper process, to measure another version "
                        "(e.g. a `git archive` of its scraper/ and exporter_lib/)")
    parser.add_argument("--workdir", type=Path, default=None,
                        help="keep the cluster's logs here (default: a temporary directory)")
    parser.add_argument("--assets-dir", type=Path, default=None,
                        help="a bundle directory of scripts/stack-assets (default: build/reuse)")
    args = parser.parse_args(argv)
    started = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    scraper_env = None
    if args.scraper_pythonpath:
        inherited = os.environ.get("PYTHONPATH", "")
        scraper_env = {"PYTHONPATH": f"{args.scraper_pythonpath}:{inherited}"}
    with tempfile.TemporaryDirectory(prefix="push-coexistence-") as tmp, \
            Cluster(args.assets_dir, args.workdir, push=True) as cluster:
        assert isinstance(cluster, Cluster)
        scratch = args.workdir if args.workdir is not None else Path(tmp)
        with cluster.api_client() as api:
            client.CoreV1Api(api).create_namespace({"metadata": {"name": NAMESPACE}})
            run = run_both_writers(cluster, api, NAMESPACE, scratch, epochs=args.epochs,
                                   samples=args.samples, down_at_progress=args.down_at,
                                   scraper_env=scraper_env)
    load = os.getloadavg()
    text = report(run, args.label, f"branch {args.label}",
                  f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f} (2 cores)")
    REPORTS.mkdir(exist_ok=True)
    out = REPORTS / f"push-coexistence-{args.label}-{started}.md"
    out.write_text(text)
    print(text)
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
