"""`python -m greenfed`: the same command as `greenfed` (the upgrade supervisor starts
the agent this way, so that the version on its path is the one that runs). `edge run`,
the agent itself, is parsed and run without the rest of the command line's modules
(greenfed/edge_run.py)."""

import sys

if sys.argv[1:3] == ["edge", "run"]:
    from greenfed.edge_run import main as edge_run

    sys.exit(edge_run(sys.argv[1:]))

from greenfed.cli import main

sys.exit(main())
