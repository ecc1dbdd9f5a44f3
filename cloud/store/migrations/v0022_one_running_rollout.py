"""Version 22: at most one agent rollout runs at a time, as a unique index on the
running ones (two would ask the same nodes for two versions).

The store checked before inserting, which two starts at once on PostgreSQL both passed:
a database may hold several running rollouts. The loop has only ever driven the latest
(cloud/upgrades/controller.py), so the others are cancelled here, before the index is
made, with a detail that says why; their rows are kept.
"""

from __future__ import annotations

import json

from sqlalchemy import text
from sqlalchemy.engine import Connection

_SUPERSEDED = (
    "cancelled when greenfed's store moved to one running rollout at a time: rollout "
    "{latest} was started at the same time and runs instead"
)


def upgrade(connection: Connection) -> None:
    _cancel_all_running_but_the_latest(connection)
    connection.execute(
        text(
            "CREATE UNIQUE INDEX uq_agent_rollouts_one_running ON agent_rollouts (phase) "
            "WHERE phase = 'running'"
        )
    )


def _cancel_all_running_but_the_latest(connection: Connection) -> None:
    # Newest first, as the loop picks the rollout it drives.
    running = connection.execute(
        text(
            "SELECT rollout_id, created_at, CAST(state AS TEXT) AS state FROM agent_rollouts "
            "WHERE phase = 'running' ORDER BY created_at DESC, rollout_id DESC"
        )
    ).all()
    if len(running) < 2:
        return
    latest = running[0]
    state_type = "json" if connection.dialect.name == "postgresql" else "TEXT"
    for superseded in running[1:]:
        state = json.loads(superseded.state)
        state["detail"] = _SUPERSEDED.format(latest=latest.rollout_id)
        state["finished_at"] = latest.created_at
        connection.execute(
            text(
                "UPDATE agent_rollouts SET phase = 'cancelled', "
                f"state = CAST(:state AS {state_type}) WHERE rollout_id = :rollout_id"
            ),
            {
                "state": json.dumps(state, separators=(",", ":")),
                "rollout_id": superseded.rollout_id,
            },
        )
