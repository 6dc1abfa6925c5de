"""``python -m relax_tune.cli``: the ``relax-tune`` command."""

import sys

from .commands import main

sys.exit(main())
