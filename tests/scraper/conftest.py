"""Fixtures of the scraper tests (defined in :mod:`tests.helpers.scraper`)."""

from tests.helpers.scraper import (  # noqa: F401 - fixtures are found by name
    exporter_factory,
    proxied,
    scraper_factory,
)
