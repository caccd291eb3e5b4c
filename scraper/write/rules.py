"""What a :class:`scraper.write.writer.StatusWriter` decides by, and whom it tells.

Two small bundles instead of a dozen constructor parameters: :class:`WriteRules` (the
decision, the policies, where statuses go) and :class:`WriterHooks` (the leader fence,
the telemetry, the API's health, the TrainJob-gone callback).  Both default to what a
tool or a test outside a scraper process wants.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from scraper.kube.health import ApiHealth
from scraper.shared.outcome import NO_COUNTS, WriteCounts
from scraper.shared.pod_check import PodCheck
from scraper.shared.policy import DEFAULT_POLICY, WritePolicy
from scraper.shared.targets import Target
from scraper.shared.writes import Decide
from scraper.write.annotation_target import StatusTarget


def _write_always() -> bool:
    return True


def _ignore_gone(namespace: str, name: str) -> None:
    return None


def _ignore_check(target: Target, check: PodCheck) -> None:
    return None


@dataclass(frozen=True)
class WriteRules:
    """What decides a write and where it goes.

    Attributes:
        decide: the decision (:func:`scraper.decide.decision.decide`).
        policy: the default write policy (``--progress-floor``, ``--metrics-staleness``).
        policy_of: a TrainJob's write policy by ``(namespace, name)`` (its annotations
            over the default, :class:`scraper.shared.policy.PolicyResolver`); None: the
            default for every TrainJob.
        target: where statuses go (``--status-target``,
            :mod:`scraper.write.annotation_target`).
        other_writer_grace: ``--other-writer-grace`` in seconds (docs/scraper.md, "Other
            writers and time"); None: the policy's.
    """

    decide: Decide
    policy: WritePolicy = DEFAULT_POLICY
    policy_of: Callable[[str, str], WritePolicy] | None = None
    target: StatusTarget = StatusTarget.STATUS
    other_writer_grace: float | None = None


@dataclass(frozen=True)
class WriterHooks:
    """Whom the writer asks and tells.

    Attributes:
        may_write: the leader fence, checked before every write.
        counts: where each outcome, request time, deferral and clock skew is counted
            (:class:`~scraper.shared.outcome.WriteCounts`: the telemetry).
        on_gone: called with ``(namespace, name)`` when a write finds the TrainJob gone.
        health: told when a write finds the API server unreachable or gets an answer;
            its recoveries make the queued retries due.  None: not told.
        confirm_pod: reads the pod of a status's ``confirm`` target right before the
            status is sent, given when the status arrived (epoch seconds;
            :class:`scraper.discovery.pod_confirm.PodConfirmer`); None: no read, every such
            status is sent.
        on_pod_check: called with ``(target, PodCheck)`` after each of those reads.
    """

    may_write: Callable[[], bool] = field(default=_write_always)
    counts: WriteCounts = NO_COUNTS
    on_gone: Callable[[str, str], None] = field(default=_ignore_gone)
    health: ApiHealth | None = None
    confirm_pod: Callable[[Target, float | None], Awaitable[PodCheck]] | None = None
    on_pod_check: Callable[[Target, PodCheck], object] = field(default=_ignore_check)


#: Write always, count nothing, tell nobody: tools and tests outside a scraper process.
NO_HOOKS = WriterHooks()
