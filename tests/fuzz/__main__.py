"""``python -m tests.fuzz --cases N [--seed S] [--jobs 2] [--out DIR]`` / ``--replay DIR``."""

import sys

from tests.fuzz.runner import main

sys.exit(main())
