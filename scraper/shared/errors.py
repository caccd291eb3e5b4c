"""Errors any part of the scraper may raise to its caller."""

from __future__ import annotations

__all__ = ["ConfigError"]


class ConfigError(ValueError):
    """Invalid configuration; ``problems`` holds one ``option=value: reason`` per offence
    (the option's flag spelling, the value, and the limit or reason)."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("invalid configuration: " + "; ".join(problems))
