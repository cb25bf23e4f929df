"""``python -m batch_worker run --run-dir URI --shard ID``."""

from __future__ import annotations

import sys

from batch_worker.cli import main

sys.exit(main())
