"""The sides of ``benchmarks.vs_push`` and the cases a plan runs them at.

Five sides, each a JSON key and a row label that states its settings:

* ``push_as_shipped``: the Kubeflow SDK (5 s throttle, 5 s timeout, no retry) and Trainer
  v2.3.0's status server as shipped (its client: QPS 5, burst 10,
  ``pkg/apis/config/v1alpha1/defaults.go``);
* ``push_equal_budget``: the same with ``statusServer.qps``/``burst`` (a documented
  setting, ``configuration_types.go``) set to the run's budget;
* ``push_best``: that budget, and the Trainer built with our patch
  ``patches/trainer-statusserver-deadline.diff`` (not upstream's): a POST waits at most
  2 s for a slot of the status server's QPS/burst and is refused (429) at once when none
  comes sooner, and an admitted one applies under a 2.5 s deadline of its own;
* ``pull``: our scraper at its defaults (``--write-qps``/``--write-burst`` 20/30, the
  rate adapting up to ``--write-qps-max`` 200 on the API server's signals);
* ``pull_equal_budget``: our scraper at a fixed rate of the run's budget
  (``--write-qps-max`` equal to ``--write-qps``, so the rate never rises above push's).
  The defaults adapt, so this is always a session of its own.

The budget (QPS, burst) defaults to the scraper's starting rate and burst, fixed
(:func:`equal_budget`): then push (b) and (c) get pull's budget.  The cliff runs at
push's shipped 5/10 instead.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from localdev.cluster.assets import AssetsError, repo_root

#: Trainer v2.3.0's status server client defaults (``defaults.go``).
SHIPPED_QPS, SHIPPED_BURST = 5.0, 10
#: The patched status server's longest wait for a slot and its apply deadline, seconds
#: (``patches/trainer-statusserver-deadline.diff``).
BEST_SLOT_WAIT_SECONDS, BEST_DEADLINE_SECONDS = 2.0, 2.5
SIDE_KEYS = ("push_as_shipped", "push_equal_budget", "push_best", "pull", "pull_equal_budget")


@dataclass(frozen=True)
class Budget:
    """Writes per second (sustained) and in a burst."""

    qps: float
    burst: int
    #: The adaptive rate's ceiling (writes/s); None: a fixed rate of ``qps``.
    ceiling: float | None = None

    def text(self) -> str:
        adapts = f", adapting up to {self.ceiling:g}/s" if self.ceiling is not None else ""
        return f"{self.qps:g}/s, burst {self.burst}{adapts}"


def pull_defaults() -> Budget:
    """The scraper's default write budget (``scraper.config.ScraperSettings``): its start
    and burst, and the ceiling its rate adapts up to (None when the defaults are fixed)."""
    from scraper.config import ScraperSettings
    from scraper.write.rate import adapts

    fields = ScraperSettings.model_fields
    qps = float(fields["write_qps"].default)
    ceiling = float(fields["write_qps_max"].default)
    return Budget(qps, int(fields["write_burst"].default),
                  ceiling if adapts(qps, ceiling) else None)


def equal_budget() -> Budget:
    """The budget push (b), push (c) and ``pull_equal_budget`` share unless ``--budget``
    says otherwise: the scraper's starting rate and burst, as a fixed rate."""
    start = pull_defaults()
    return Budget(start.qps, start.burst)


@dataclass(frozen=True)
class Side:
    """One side: ``key`` (JSON), ``design`` (``push``/``pull``), its write budget, whether
    the Trainer is our patched build, and the row label."""

    key: str
    design: str
    budget: Budget
    patched: bool = False
    label: str = field(default="", compare=False)

    def scraper_flags(self) -> tuple[str, ...]:
        """The scraper's flags (pull): none at the defaults; else the budget, with the
        ceiling at the budget's own rate when it is fixed (the rate then never rises)."""
        if self.design != "pull" or self.budget == pull_defaults():
            return ()
        qps = f"{self.budget.qps:g}"
        ceiling = qps if self.budget.ceiling is None else f"{self.budget.ceiling:g}"
        return ("--write-qps", qps, "--write-burst", str(self.budget.burst),
                "--write-qps-max", ceiling)

    @property
    def slug(self) -> str:
        """The side in a namespace name (DNS label)."""
        return self.key.replace("_", "-")


def make_side(key: str, budget: Budget) -> Side:
    """The side ``key`` of :data:`SIDE_KEYS` at ``budget`` (push as shipped and pull at
    their own defaults whatever ``budget``)."""
    shipped = Budget(SHIPPED_QPS, SHIPPED_BURST)
    defaults = pull_defaults()
    if key == "push_as_shipped":
        return Side(key, "push", shipped,
                    label=f"push as shipped (status server {shipped.text()})")
    if key == "push_equal_budget":
        return Side(key, "push", budget, label=f"push, status server {budget.text()}")
    if key == "push_best":
        return Side(key, "push", budget, True,
                    label=f"best push: status server {budget.text()}, a slot within "
                    f"{BEST_SLOT_WAIT_SECONDS:g} s or 429, apply deadline "
                    f"{BEST_DEADLINE_SECONDS:g} s (our patch)")
    if key == "pull":
        return Side(key, "pull", defaults, label=f"pull at its defaults ({defaults.text()})")
    if key == "pull_equal_budget":
        return Side(key, "pull", budget, label=f"pull capped at {budget.text()} (fixed)")
    raise ValueError(f"side={key!r}: must be one of {SIDE_KEYS}")


@dataclass(frozen=True)
class Case:
    """N TrainJobs reporting every ``every`` s, a percentage point every
    ``percent_seconds`` s, measured over ``window`` s, for ``sides``."""

    jobs: int
    every: float
    percent_seconds: float
    window: float
    sides: tuple[str, ...]

    @property
    def label(self) -> str:
        return (f"N={self.jobs} every={self.every:g}s "
                f"percent={self.percent_seconds:g}s")


ALL = SIDE_KEYS
BUDGETED = ("push_equal_budget", "push_best", "pull", "pull_equal_budget")
CLIFF_SIDES = ("push_as_shipped", "push_best", "pull_equal_budget")
CLIFF_JOBS = (20, 30, 40, 60, 100, 200)


def main_cases(jobs: list[int] | None = None) -> list[Case]:
    """The main table (issue 37 item 4): every 1 s at N = 20, 200, 1000 for every side;
    every 10 s and 60 s at N = 20 and 200 for push (b), (c) and pull; a percentage every
    60 s at N=200; windows of 10 min (5 min at N=1000).  ``jobs``: only these N."""
    def window(n: int) -> float:
        return 300.0 if n >= 1000 else 600.0
    cases = [Case(n, 1.0, 15.0, window(n), ALL) for n in (20, 200, 1000)]
    cases += [Case(n, every, 15.0, window(n), BUDGETED) for n in (20, 200)
              for every in (10.0, 60.0)]
    cases.append(Case(200, 1.0, 60.0, window(200), BUDGETED))
    return [c for c in cases if jobs is None or c.jobs in jobs]


def cliff_cases(jobs: list[int] | None = None, window: float = 180.0) -> list[Case]:
    """The cliff (item 3): every 1 s at :data:`CLIFF_JOBS`, 3-minute windows, push as
    shipped, push with the deadline and pull capped (the run's budget: 5/10)."""
    return [Case(n, 1.0, 15.0, window, CLIFF_SIDES) for n in (jobs or CLIFF_JOBS)]


def trainer_best_binary() -> Path:
    """Build (or reuse) the patched Trainer (``scripts/stack-assets trainer-best``) and
    return its ``trainer-controller-manager``.

    Raises:
        AssetsError: the build failed (the message quotes its last stderr lines).
    """
    script = repo_root() / "scripts" / "stack-assets"
    proc = subprocess.run(["bash", str(script), "trainer-best"], capture_output=True,
                          text=True, timeout=5400, check=False)
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    if proc.returncode or not lines:
        tail = "\n".join(proc.stderr.splitlines()[-30:])
        raise AssetsError(f"{script} trainer-best failed (exit {proc.returncode}):\n{tail}")
    binary = Path(lines[-1].strip()) / "trainer-controller-manager"
    if not binary.is_file():
        raise AssetsError(f"{script} trainer-best printed {lines[-1]!r}: no {binary.name}")
    return binary
