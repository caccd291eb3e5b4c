"""``python -m localdev.demo``: the demo (``make demo``)."""

import sys

from localdev.demo import main

sys.exit(main())
