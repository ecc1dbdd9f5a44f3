"""The schema's history: an ordered list of migrations, applied by `cloud.store.migrate`.

Append only. A migration, once released, never changes: it keeps a frozen copy of
the tables it touches rather than importing `cloud.store.schema`, so that a fresh
database walks exactly the steps an old one did.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from sqlalchemy.engine import Connection

from cloud.store.migrations import (
    v0001_initial,
    v0002_explanations,
    v0003_models,
    v0004_enrolment,
    v0005_usage,
    v0006_event_work_index,
    v0007_node_admin,
    v0008_retries,
    v0009_power_limits,
    v0010_tokens_limits_audit,
    v0011_dependencies_cpu_cores,
    v0012_sealing_keys,
    v0013_node_envelopes,
    v0014_clusters,
    v0015_agent_upgrades,
    v0016_job_control,
    v0017_job_arrays,
    v0018_fair_share,
    v0019_tenant_lending_limit,
    v0020_node_drain_waiting,
    v0021_usage_mark_seq_bigint,
    v0022_one_running_rollout,
    v0023_work_name_index,
    v0024_cluster_submissions,
    v0025_submitted_spec_digest,
)


@dataclass(frozen=True, slots=True)
class SchemaMigration:
    version: int
    name: str
    upgrade: Callable[[Connection], None]  # runs inside the migration's transaction


MIGRATIONS: Final[tuple[SchemaMigration, ...]] = (
    SchemaMigration(1, "initial", v0001_initial.upgrade),
    SchemaMigration(2, "explanations", v0002_explanations.upgrade),
    SchemaMigration(3, "models", v0003_models.upgrade),
    SchemaMigration(4, "enrolment", v0004_enrolment.upgrade),
    SchemaMigration(5, "usage", v0005_usage.upgrade),
    SchemaMigration(6, "event_work_index", v0006_event_work_index.upgrade),
    SchemaMigration(7, "node_admin", v0007_node_admin.upgrade),
    SchemaMigration(8, "retries", v0008_retries.upgrade),
    SchemaMigration(9, "power_limits", v0009_power_limits.upgrade),
    SchemaMigration(10, "tokens_limits_audit", v0010_tokens_limits_audit.upgrade),
    SchemaMigration(11, "dependencies_cpu_cores", v0011_dependencies_cpu_cores.upgrade),
    SchemaMigration(12, "sealing_keys", v0012_sealing_keys.upgrade),
    SchemaMigration(13, "node_envelopes", v0013_node_envelopes.upgrade),
    SchemaMigration(14, "clusters", v0014_clusters.upgrade),
    SchemaMigration(15, "agent_upgrades", v0015_agent_upgrades.upgrade),
    SchemaMigration(16, "job_control", v0016_job_control.upgrade),
    SchemaMigration(17, "job_arrays", v0017_job_arrays.upgrade),
    SchemaMigration(18, "fair_share", v0018_fair_share.upgrade),
    SchemaMigration(19, "tenant_lending_limit", v0019_tenant_lending_limit.upgrade),
    SchemaMigration(20, "node_drain_waiting", v0020_node_drain_waiting.upgrade),
    SchemaMigration(21, "usage_mark_seq_bigint", v0021_usage_mark_seq_bigint.upgrade),
    SchemaMigration(22, "one_running_rollout", v0022_one_running_rollout.upgrade),
    SchemaMigration(23, "work_name_index", v0023_work_name_index.upgrade),
    SchemaMigration(24, "cluster_submissions", v0024_cluster_submissions.upgrade),
    SchemaMigration(25, "submitted_spec_digest", v0025_submitted_spec_digest.upgrade),
)


def check_order(migrations: tuple[SchemaMigration, ...]) -> None:
    versions = [migration.version for migration in migrations]
    if versions != list(range(1, len(versions) + 1)):
        raise ValueError(f"migration versions must be 1..n in order, got {versions}")
