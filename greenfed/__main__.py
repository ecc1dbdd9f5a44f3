"""`python -m greenfed`: the same command as `greenfed` (the upgrade supervisor starts
the agent this way, so that the version on its path is the one that runs). `edge run`,
the agent itself, is parsed and run without the rest of the command line's modules
(greenfed/edge_run.py)."""

import sys

if sys.argv[1:3] == ["edge", "run"]:
    # Before anything imports what an idle agent never uses (pathlib imports urllib.parse,
    # which imports ipaddress): edge/deferred_imports.py.
    from edge.deferred_imports import defer_imports

    defer_imports()
    from greenfed.edge_run import main as edge_run

    sys.exit(edge_run(sys.argv[1:]))

from greenfed.cli import main

sys.exit(main())
