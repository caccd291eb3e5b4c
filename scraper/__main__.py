"""``python -m scraper``: the ``trainjob-scraper`` command."""

import sys

from scraper.cli import main

sys.exit(main())
