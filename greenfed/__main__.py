"""`python -m greenfed`: the same command as `greenfed` (the upgrade supervisor starts
the agent this way, so that the version on its path is the one that runs)."""

import sys

from greenfed.cli import main

sys.exit(main())
