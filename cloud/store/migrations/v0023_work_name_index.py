"""Version 23: work found by its name in time that does not grow with history.

A name lives in the stored spec (a JSON document), and `cloud/store/work_lookup.py`
read every row of the tenant's work to find one: 300 ms at 200,000 jobs for a name
never used (a typo's 404), and as much for the runs of a name that have not ended. An
index on the spec's name (an expression index: `json_extract` on SQLite, `->>` on
PostgreSQL's `json`) narrows the rows read to the runs of that name. The lookup's query
must spell the expression exactly as it is here for either database to use the index
(`work_lookup.spec_name`).
"""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.engine import Connection

INDEX_NAME = "ix_work_name"
# The expression each database indexes; the lookup's query writes the same text.
NAME_EXPRESSION = {
    "postgresql": "(spec ->> 'name')",
    "sqlite": "json_extract(spec, '$.name')",
}


def upgrade(connection: Connection) -> None:
    expression = NAME_EXPRESSION[connection.dialect.name]
    connection.execute(
        text(f"CREATE INDEX {INDEX_NAME} ON work ({expression}, tenant_id, kind, id)")
    )
