"""``python -m tuner.cli``: the ``tuner`` command."""

import sys

from .main import main

sys.exit(main())
