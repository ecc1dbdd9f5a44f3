"""The tables as the code reads and writes them today (the shape after the last migration).

Migrations build the database; they never import this module (each keeps a frozen copy
of what it created), and tests/store/test_migrations.py checks that the migrated
database has exactly these tables and columns.
"""

from __future__ import annotations

from typing import Final

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Double,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    Table,
    Text,
    UniqueConstraint,
    false,
    text,
)

from cloud.store.jsontype import JsonDocument

metadata = MetaData()

# One row per applied migration; the highest version is the schema's version.
schema_version = Table(
    "schema_version",
    metadata,
    Column("version", Integer, primary_key=True, autoincrement=False),
    Column("name", Text, nullable=False),
    Column("applied_at", Double, nullable=False),
)

tenants = Table(
    "tenants",
    metadata,
    Column("id", Text, primary_key=True),
    Column("name", Text, nullable=False, unique=True),
    # The token the tenant was created with (before v0010 its only one). Authentication
    # reads `tenant_tokens` only, which holds this token too, with its state.
    Column("token_id", Text, nullable=False, unique=True),
    Column("token_hash", Text, nullable=False),
    Column("quotas", JsonDocument, nullable=False),
    Column("borrowing_limit", JsonDocument, nullable=False),
    Column("cohort", Text, nullable=True, index=True),
    Column("allowed_priorities", JsonDocument, nullable=False),
    Column("admin", Boolean, nullable=False),
    Column("created_at", Double, nullable=False),
    # At most this many of its work items placed at once, and pending (v0010); NULL: no cap.
    Column("max_running", Integer, nullable=True),
    Column("max_queued", Integer, nullable=True),
    # Of its unused quota, what the rest of its cohort may borrow (v0019); {}: all of it.
    Column("lending_limit", JsonDocument, nullable=False, server_default="{}"),
)

# Every bearer token of a tenant (v0010): the id in clear, the secret's salted scrypt
# hash. A rotated token has `replaced_by` and works until `expires_at` (the end of its
# overlap); a revoked one is refused from `revoked_at` on. Rows are never deleted, so
# a refused token is told why.
tenant_tokens = Table(
    "tenant_tokens",
    metadata,
    Column("id", Text, primary_key=True),
    Column("tenant_id", Text, ForeignKey("tenants.id"), nullable=False),
    Column("name", Text, nullable=False),
    Column("secret_hash", Text, nullable=False),
    Column("created_at", Double, nullable=False),
    Column("created_by", Text, nullable=True),
    Column("expires_at", Double, nullable=True),
    Column("rotated_at", Double, nullable=True),
    Column("replaced_by", Text, nullable=True),
    Column("revoked_at", Double, nullable=True),
    Column("last_used_at", Double, nullable=True),
    Index("ix_tenant_tokens_tenant", "tenant_id", "id"),
)

# What admins (and tenants managing their own tokens) did (v0010), append-only.
audit_log = Table(
    "audit_log",
    metadata,
    Column("seq", BigInteger().with_variant(Integer, "sqlite"), primary_key=True),
    Column("at", Double, nullable=False),
    Column("actor_id", Text, nullable=False),
    Column("actor", Text, nullable=False),
    Column("action", Text, nullable=False),
    Column("target", Text, nullable=False),
    Column("detail", JsonDocument, nullable=False),
    Index("ix_audit_log_at", "at"),
    Index("ix_audit_log_actor", "actor", "seq"),
    Index("ix_audit_log_action", "action", "seq"),
    sqlite_autoincrement=True,
)

work = Table(
    "work",
    metadata,
    Column("id", Text, primary_key=True),
    Column("tenant_id", Text, ForeignKey("tenants.id"), nullable=False),
    Column("kind", Text, nullable=False),
    Column("spec", JsonDocument, nullable=False),
    Column("priority", Text, nullable=False),
    Column("state", Text, nullable=False),
    Column("state_reason", Text, nullable=True),
    Column("attempts", Integer, nullable=False),
    Column("submitted_at", Double, nullable=False),
    Column("updated_at", Double, nullable=False),
    Column("idempotency_key", Text, nullable=True),
    Column("version", BigInteger, nullable=False),
    # The scheduler's latest explanation (JSON object) and when it was made (v0002).
    Column("explanation", JsonDocument, nullable=True),
    Column("explained_at", Double, nullable=True),
    # Failures of the job's own (non-zero exits) so far, retried by its max_retries, and
    # the earliest time its next attempt may be placed (v0008).
    Column("failures", Integer, nullable=False, server_default="0"),
    Column("not_before", Double, nullable=True),
    # Pending work kept out of the queue by a person: "held" or "suspended"; and the
    # placements a person's requeue or suspend ended (v0016, cloud/store/job_control.py).
    Column("hold", Text, nullable=True),
    Column("requeues", Integer, nullable=False, server_default="0"),
    # Work submitted with an idempotency key: the SHA-256 (hex) of its spec as submitted,
    # which a retry is compared with once a PATCH or an apply has changed `spec` (v0025,
    # `records.submitted_spec_digest`). NULL: no key, or stored before v0025.
    Column("submitted_spec_sha256", Text, nullable=True),
    UniqueConstraint("tenant_id", "idempotency_key", name="uq_work_idempotency_key"),
    Index("ix_work_tenant", "tenant_id", "id"),
    Index("ix_work_state", "state", "priority", "id"),
)

# What a `WorkRecord` is made of: every column but the explanation, which only the
# explain route reads (snapshots of thousands of pending jobs should not carry it).
WORK_RECORD_COLUMNS = tuple(
    column for column in work.columns if column.name not in ("explanation", "explained_at")
)

allocations = Table(
    "allocations",
    metadata,
    Column("work_id", Text, ForeignKey("work.id", ondelete="CASCADE"), primary_key=True),
    Column("member_index", Integer, primary_key=True, autoincrement=False),
    Column("node_id", Text, nullable=False, index=True),
    Column("accelerator_kind", Text, nullable=False),
    Column("accelerators", Integer, nullable=False),
    Column("accelerator_ids", JsonDocument, nullable=False),
    Column("host_memory_bytes", BigInteger, nullable=False),
    Column("started_at", Double, nullable=False),
    Column("expected_end", Double, nullable=True),
    Column("borrowed", Boolean, nullable=False),
    Column("state", Text, nullable=False),
    Column("power_limit_w", Double, nullable=True),  # v0009: per device; NULL: default
    # v0011: CPU cores held beside a GPU/NPU member's devices (its cpus_per_worker)
    Column("cpu_cores", Integer, nullable=False, server_default="0"),
)

# What work waits for (v0011): `work_id` starts once the tenant's training job `job_id`
# has ended as `condition` says (succeeded, failed, ended); `position` is the entry's
# index in the dependent's depends_on. Written with the work, never changed.
work_dependencies = Table(
    "work_dependencies",
    metadata,
    Column("work_id", Text, ForeignKey("work.id", ondelete="CASCADE"), primary_key=True),
    Column("position", Integer, primary_key=True, autoincrement=False),
    # Not a foreign key: it would take a share lock on the job's row in the submitting
    # transaction, which the scheduling loop locks to update (jobs are never deleted).
    Column("job_id", Text, nullable=False),
    Column("condition", Text, nullable=False),
    Index("ix_work_dependencies_job", "job_id"),
)

# The tasks of job arrays (cloud/work/array_ranges.py): each an ordinary training job.
array_tasks = Table(
    "array_tasks",
    metadata,
    Column("array_id", Text, primary_key=True),
    Column("task_index", Integer, primary_key=True, autoincrement=False),
    Column("work_id", Text, ForeignKey("work.id", ondelete="CASCADE"), nullable=False, unique=True),
    Column("tenant_id", Text, nullable=False),
    Index("ix_array_tasks_tenant", "tenant_id", "array_id"),
)

node_generations = Table(
    "node_generations",
    metadata,
    Column("node_id", Text, primary_key=True),
    Column("generation", BigInteger, nullable=False),
)

events = Table(
    "events",
    metadata,
    Column("seq", BigInteger().with_variant(Integer, "sqlite"), primary_key=True),
    Column("tenant_id", Text, nullable=True),
    Column("work_id", Text, nullable=True),
    Column("kind", Text, nullable=False),
    Column("payload", JsonDocument, nullable=False),
    Column("at", Double, nullable=False),
    Column("event_id", Text, nullable=True, unique=True),
    Index("ix_events_tenant", "tenant_id", "seq"),
    Index("ix_events_work", "work_id", "seq"),
    sqlite_autoincrement=True,
)

models = Table(
    "models",
    metadata,
    Column("id", Text, primary_key=True),
    Column("tenant_id", Text, ForeignKey("tenants.id"), nullable=False),
    Column("name", Text, nullable=False),
    Column("sha256", Text, nullable=False, index=True),
    Column("size_bytes", BigInteger, nullable=False),
    Column("opset", Integer, nullable=False),
    Column("inputs", JsonDocument, nullable=False),
    Column("outputs", JsonDocument, nullable=False),
    Column("created_at", Double, nullable=False),
    Index("ix_models_tenant", "tenant_id", "id"),
)

# Secrets every replica must share (e.g. the key that signs model download URLs).
secrets = Table(
    "secrets",
    metadata,
    Column("name", Text, primary_key=True),
    Column("value", Text, nullable=False),
    Column("created_at", Double, nullable=False),
)

# The `secrets` row that names the cluster. It is made with the store, so a new database
# is a new cluster; every `desired` document carries it (cloud/loop/publisher.py), and a
# backup keeps it, so a restored store is the same cluster to the agents.
CLUSTER_ID_SECRET: Final = "cluster-id"

# Join tokens an admin hands to new nodes (v0004): only the token's SHA-256 is kept
# (the token is 256 random bits, so a fast hash is enough; it is shown once). `site`,
# `zone`, `region` and `labels` are what an enrolling node gets where it names none.
join_tokens = Table(
    "join_tokens",
    metadata,
    Column("id", Text, primary_key=True),
    Column("token_sha256", Text, nullable=False, unique=True),
    Column("created_at", Double, nullable=False),
    Column("expires_at", Double, nullable=False),
    Column("max_uses", Integer, nullable=False),
    Column("uses", Integer, nullable=False),
    Column("revoked_at", Double, nullable=True),
    Column("site", Text, nullable=True),
    Column("zone", Text, nullable=True),
    Column("region", Text, nullable=True),
    Column("labels", JsonDocument, nullable=False),
    Column("created_by", Text, nullable=True),
    # v0013: what nodes enrolled with it may be (cloud/fleet/envelope.py); NULL: nothing
    # beyond site, zone and region.
    Column("envelope", JsonDocument, nullable=True),
)

# Node identities that traded a join token for credentials (v0004). A revoked node
# keeps its row (revoked_at set) and is refused until it enrols again with a new token.
enrolled_nodes = Table(
    "enrolled_nodes",
    metadata,
    Column("node_id", Text, primary_key=True),
    Column("enrolled_at", Double, nullable=False),
    Column("join_token_id", Text, nullable=True),
    Column("revoked_at", Double, nullable=True),
    Column("username", Text, nullable=True),
    # v0012: the node's sealing public key (base64) it enrolled with; NULL: none pinned.
    Column("sealing_public_key", Text, nullable=True),
    # v0013: what it may be (cloud/fleet/envelope.py `NodeEnvelope`); NULL: not held.
    Column("envelope", JsonDocument, nullable=True),
)

# Registered clusters with schedulers of their own (v0014, cloud/clusters/).
clusters = Table(
    "clusters",
    metadata,
    Column("name", Text, primary_key=True),
    Column("kind", Text, nullable=False),
    Column("created_at", Double, nullable=False),
    Column("created_by", Text, nullable=False),
    Column("spec", JsonDocument, nullable=False),  # cloud/clusters/views.py ClusterSpec
)

# Agent versions the control plane serves, and their rollouts (v0015, cloud/upgrades/).
agent_packages = Table(
    "agent_packages",
    metadata,
    Column("version", Text, primary_key=True),
    Column("sha256", Text, nullable=False),
    Column("size_bytes", BigInteger, nullable=False),
    Column("signature", Text, nullable=False),
    Column("published_at", Double, nullable=False),
    Column("published_by", Text, nullable=False),
    # Base64: backups (cloud/store/backup_file.py) carry rows as JSON, text as it is.
    Column("content_base64", Text, nullable=False),
)
agent_rollouts = Table(
    "agent_rollouts",
    metadata,
    Column("rollout_id", Text, primary_key=True),
    Column("version", Text, nullable=False),
    Column("phase", Text, nullable=False),  # cloud/upgrades/views.py RolloutPhase
    Column("created_at", Double, nullable=False),
    Column("created_by", Text, nullable=False),
    Column("state", JsonDocument, nullable=False),  # cloud/upgrades/views.py RolloutState
    # One running rollout at a time (v0022): two would ask the same nodes for two versions.
    Index(
        "uq_agent_rollouts_one_running",
        "phase",
        unique=True,
        sqlite_where=text("phase = 'running'"),
        postgresql_where=text("phase = 'running'"),
    ),
)

# Failed join-token redemptions per remote address (v0013): a token bucket every
# replica shares (cloud/api/enrolment.py).
enrolment_failures = Table(
    "enrolment_failures",
    metadata,
    Column("address", Text, primary_key=True),
    Column("tokens", Double, nullable=False),
    Column("updated_at", Double, nullable=False),
)

# Live accounting (v0005, cloud/usage/): one row per allocation (work, member, node)
# and UTC hour, added to by each flush. `counterfactual_gco2_g` is what the carbon-
# agnostic baseline's placement would have emitted for the same energy (NULL: no
# counterfactual); `fallback`: some of it used a fallback grid value.
usage_hours = Table(
    "usage_hours",
    metadata,
    Column("work_id", Text, primary_key=True),
    Column("member_index", Integer, primary_key=True),
    Column("node_id", Text, primary_key=True),
    Column("hour_start", Double, primary_key=True),
    Column("tenant_id", Text, nullable=False),
    Column("work_kind", Text, nullable=False),
    Column("zone", Text, nullable=False),
    Column("accelerator_kind", Text, nullable=False),
    Column("energy_j", Double, nullable=False),
    Column("measured_j", Double, nullable=False),
    Column("gap_s", Double, nullable=False),
    Column("gco2_g", Double, nullable=False),
    Column("cost", Double, nullable=False),
    Column("currency", Text, nullable=False),
    Column("counterfactual_gco2_g", Double, nullable=True),
    Column("fallback", Boolean, nullable=False),
    Column("updated_at", Double, nullable=False),
    Index("ix_usage_hours_tenant_hour", "tenant_id", "hour_start"),
    Index("ix_usage_hours_hour", "hour_start"),
)

# How far each node's telemetry has been counted (v0005), written in the same
# transaction as the usage it produced: a restart resumes from here, and the energy
# counters' differences cover the time it was down. `seq` is the node's own number,
# up to 2**53 (BIGINT since v0021).
usage_marks = Table(
    "usage_marks",
    metadata,
    Column("node_id", Text, primary_key=True),
    Column("instance_id", Text, nullable=False),
    Column("seq", BigInteger, nullable=False),
    Column("sampled_at", Double, nullable=False),
    Column("energy_j", JsonDocument, nullable=False),
)

# The carbon-agnostic baseline's choice for each work item at its first placement
# (v0005): its kWh per zone relative to the work's own (`zone_factors`; NULL: the
# baseline would not have run it then).
usage_counterfactuals = Table(
    "usage_counterfactuals",
    metadata,
    Column("work_id", Text, primary_key=True),
    Column("tenant_id", Text, nullable=False),
    Column("decided_at", Double, nullable=False),
    Column("baseline", Text, nullable=False),
    Column("zone_factors", JsonDocument, nullable=True),
)

# Per tenant (by name), its decayed past usage for fair share (v0018,
# cloud/scheduler/fair_share.py): kind -> accelerator-seconds weighted by age, as of `as_of`.
fair_share_usage = Table(
    "fair_share_usage",
    metadata,
    Column("tenant", Text, primary_key=True),
    Column("accelerator_seconds", JsonDocument, nullable=False),
    Column("as_of", Double, nullable=False),
)

# What an admin set on a node (v0007): cordoned (no new work), draining (its work moved
# off), and taints and labels
# added to those its agent declares. `taints` is a list of `key=value:Effect` strings.
node_admin = Table(
    "node_admin",
    metadata,
    Column("node_id", Text, primary_key=True),
    Column("cordoned", Boolean, nullable=False),
    Column("draining", Boolean, nullable=False),
    Column("taints", JsonDocument, nullable=False),
    Column("labels", JsonDocument, nullable=False),
    Column("updated_at", Double, nullable=False),
    # v0013: the claim an admin approved, or the node's first birth set (`NodeClaim`,
    # cloud/fleet/envelope.py); trust_figures: its own speed and power figures count.
    Column("approved", JsonDocument, nullable=True),
    Column("trust_figures", Boolean, nullable=False, server_default=false()),
)

# What each draining node's drain waits for, as the scheduling leader's latest pass found
# (v0020, cloud/loop/drain.py): replaced with the pass's commit when it changes, read by
# the replicas that do not lead. `waiting` is a list of strings.
node_drain_waiting = Table(
    "node_drain_waiting",
    metadata,
    Column("node_id", Text, primary_key=True),
    Column("waiting", JsonDocument, nullable=False),
)

# Each attempt greenfed submitted to a cluster (v0024, cloud/clusters/bridge.py): claimed
# before the cluster is asked to run it, so that no control plane, restarted or another
# replica, ever submits it again (a cluster without accounting forgets an ended job).
cluster_submissions = Table(
    "cluster_submissions",
    metadata,
    Column("work_id", Text, ForeignKey("work.id", ondelete="CASCADE"), primary_key=True),
    Column("attempt", Integer, primary_key=True, autoincrement=False),
    Column("cluster", Text, nullable=False),
    Column("claimed_at", Double, nullable=False),
)
