"""Whether this replica leads now: one flag, built first and shared by the parts that
scrape, write and watch for stalls (set by the target manager on each change of the
Lease, docs/scraper.md, "Leader changes")."""

from __future__ import annotations

__all__ = ["Leadership"]


class Leadership:
    """The flag; calling it reads it (a ``Callable[[], bool]`` for the parts that ask)."""

    def __init__(self, leading: bool) -> None:
        self.leading = leading

    def __call__(self) -> bool:
        return self.leading
