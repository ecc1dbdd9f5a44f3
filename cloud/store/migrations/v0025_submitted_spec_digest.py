"""Version 25: the digest of the spec work was submitted with under an idempotency key.

A retry with the key was compared with the spec as stored, which a PATCH, an apply or
a deployment update changes: the retry of the original submission then got a 409
instead of the work. Work submitted with a key keeps the SHA-256 of its spec as
submitted (`cloud.store.records.submitted_spec_digest`, hex) to compare retries with.
Work stored before this version has none (NULL): its retries are compared with its
spec as stored, as before.
"""

from __future__ import annotations

from sqlalchemy import Text, text
from sqlalchemy.engine import Connection


def upgrade(connection: Connection) -> None:
    digest = connection.dialect.type_compiler_instance.process(Text())
    connection.execute(text(f"ALTER TABLE work ADD COLUMN submitted_spec_sha256 {digest}"))
