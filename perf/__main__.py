"""``python -m perf``: see :mod:`perf.cli`."""

import sys

from .cli import main

sys.exit(main())
