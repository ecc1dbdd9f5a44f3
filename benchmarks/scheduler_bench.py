"""Scheduler core benchmark (the same as `greenfed bench scheduler`).

python benchmarks/scheduler_bench.py --nodes 10000 --jobs 20000 --json
python benchmarks/scheduler_bench.py --sweep --json
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cloud.eval.scheduler_bench import main

if __name__ == "__main__":
    sys.exit(main())
