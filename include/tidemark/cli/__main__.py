"""``python -m tidemark.cli``: the same as the ``tidemark`` console script."""

import sys

from tidemark.cli import main

sys.exit(main())
