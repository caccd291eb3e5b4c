"""The realistic exporter payload the farms serve, rendered by exporter_lib itself.

About 15 series: the exporter's own two families (4 series), progress, remaining
seconds, last update time, seven numeric training metrics and one text metric.
"""

from __future__ import annotations

from collections.abc import Mapping

from exporter_lib.exposition import Renderer
from exporter_lib.state import State

ACCEPT_JSON = "application/json"


def training_metrics(step: int) -> dict[str, object]:
    """The metrics a typical training loop reports at ``step``."""
    return {
        "loss": 2.0 / (1 + step * 0.01),
        "accuracy": min(0.99, 0.5 + step * 0.0001),
        "learning_rate": 3e-4,
        "epoch": step // 1000,
        "step": step,
        "grad_norm": 1.25,
        "samples_per_second": 812.5,
        "phase": "train",
    }


def report(state: State, step: int, extra: Mapping[str, object] | None = None) -> None:
    """One ``update()`` as a training loop makes it."""
    metrics = training_metrics(step)
    if extra:
        metrics.update(extra)
    state.update(progress_percentage=min(100, step / 100), estimated_remaining_seconds=3600 -
                 step * 0.36, metrics=metrics)


def render_payloads(step: int = 4242) -> tuple[bytes, bytes]:
    """``(prometheus text, json)`` bodies of one status, as the exporter serves them."""
    state = State()
    report(state, step)
    renderer = Renderer(state)
    text = renderer.render(None)
    js = renderer.render(ACCEPT_JSON)
    assert text is not None and js is not None
    return text.body, js.body


def series_count(text: bytes) -> int:
    """Sample lines in a Prometheus text body."""
    return sum(1 for line in text.splitlines() if line and not line.startswith(b"#"))
