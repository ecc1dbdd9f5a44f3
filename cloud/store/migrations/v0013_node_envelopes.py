"""Version 13: nodes held to what they enrolled as (issue 25).

- `join_tokens.envelope`, `enrolled_nodes.envelope`: what a node enrolled with the
  token may be (cloud/fleet/envelope.py `NodeEnvelope`, JSON); NULL: nothing fixed
  beyond the token's site, zone and region (older tokens and enrolments).
- `node_admin.approved`: the claim an admin approved (or a node's first birth set, where
  its envelope has no ceiling), JSON `NodeClaim`; `node_admin.trust_figures`: take the
  node's own speed and power figures instead of the model table's.
- `enrolment_failures`: failed join-token redemptions per remote address, a token
  bucket every replica shares.
"""

from __future__ import annotations

from sqlalchemy import Boolean, Column, Double, MetaData, Table, Text, text
from sqlalchemy.engine import Connection

_metadata = MetaData()

_enrolment_failures = Table(
    "enrolment_failures",
    _metadata,
    Column("address", Text, primary_key=True),
    Column("tokens", Double, nullable=False),
    Column("updated_at", Double, nullable=False),
)


def upgrade(connection: Connection) -> None:
    dialect = connection.dialect
    flag = dialect.type_compiler_instance.process(Boolean())

    def document(column: str) -> str:
        # As version 2 does: PostgreSQL's json; SQLite's text, checked to be valid.
        if dialect.name == "postgresql":
            return "json"
        return f"TEXT CHECK ({column} IS NULL OR json_valid({column}))"

    for table in ("join_tokens", "enrolled_nodes"):
        connection.execute(text(f"ALTER TABLE {table} ADD COLUMN envelope {document('envelope')}"))
    connection.execute(text(f"ALTER TABLE node_admin ADD COLUMN approved {document('approved')}"))
    connection.execute(
        text(f"ALTER TABLE node_admin ADD COLUMN trust_figures {flag} NOT NULL DEFAULT false")
    )
    _metadata.create_all(connection, tables=[_enrolment_failures], checkfirst=False)
