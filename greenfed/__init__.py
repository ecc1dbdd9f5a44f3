"""The ``greenfed`` command line.

``cli.py`` the entry point and its commands; ``arguments.py`` exit statuses and
argparse types; ``api_client.py`` the one client of the REST API (base URL, token
discovery, time limits, problem+json errors); ``work_cli.py`` and
``work_commands.py`` the tenant's commands and their tables; ``nodes_cli.py`` the
fleet table; ``spec_files.py`` JSON/TOML/YAML spec files; ``up.py`` ``greenfed
up`` (embedded broker, control plane and simulated fleet in one process);
``broker.py`` the embedded broker; ``ports.py`` and ``data_dir_lock.py`` what a
second control plane on the same port or data directory runs into. The commands
that talk to a running control plane import none of its server code
(``cloud.api``, the store); ``up``, ``cloud``, ``eval`` and ``bench`` run parts of
it in-process.
"""
