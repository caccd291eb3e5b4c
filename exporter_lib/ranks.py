"""Which process of a distributed job reports progress.

Only one process per TrainJob should serve the exporter: the scraper reads the
rank-0 pod (see ``docs/architecture.md``), and several ranks serving on one
pod would race for the port.  The facts come from the environment variables
that ``torchrun``, Kubeflow Trainer's torch runtime, Open MPI and MPICH set.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

#: Global rank variables, most specific first (torchrun / Trainer, Open MPI, MPICH/Intel MPI).
GLOBAL_RANK_VARS = ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK")
#: Node-local rank variables, consulted only when no global rank is set.
LOCAL_RANK_VARS = ("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID")


def global_rank(environ: Mapping[str, str] | None = None) -> int | None:
    """The process's global rank from the environment, or ``None`` when unset or unparsable."""
    env = os.environ if environ is None else environ
    for var in GLOBAL_RANK_VARS:
        rank = _int(env.get(var))
        if rank is not None:
            return rank
    return None


def is_reporting_process(
    environ: Mapping[str, str] | None = None, reporting_rank: int = 0
) -> bool:
    """True when this process should serve the exporter.

    Rule: the process whose global rank equals ``reporting_rank`` (default 0)
    reports.  Without a global rank,
    only the process with local rank 0 reports (one node, no global rank known);
    without either, the process is alone and reports.
    """
    env = os.environ if environ is None else environ
    rank = global_rank(env)
    if rank is not None:
        return rank == reporting_rank
    for var in LOCAL_RANK_VARS:
        local = _int(env.get(var))
        if local is not None:
            return local == 0
    return True


def _int(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        return int(text.strip())
    except ValueError:
        return None
