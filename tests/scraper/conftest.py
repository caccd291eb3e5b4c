"""Fixtures of the scraper tests (helpers live in ``scraper_testutil``)."""

from scraper_testutil import (  # noqa: F401 - fixtures and hooks are found by name
    exporter_factory,
    pytest_runtest_makereport,
    scraper_factory,
)
