"""Cluster registrations an earlier greenfed accepted and today's rules refuse (a
work_dir with a space, a rest_url with no port) never stop a control plane from
starting or listing the others, and can still be removed; on SQLite and PostgreSQL."""

from __future__ import annotations

import msgspec
from sqlalchemy import update

from cloud.clusters.views import MAX_CLUSTERS, ClusterSpec, SlurmAccessSpec
from cloud.store import Store, TenantRecord
from cloud.store.audit import Actor, NewAudit
from cloud.store.clusters import ClusterRecord
from cloud.store.schema import clusters


def _audit(tenant: TenantRecord, action: str, target: str) -> NewAudit:
    return NewAudit(
        actor=Actor(tenant_id=tenant.tenant_id, name=tenant.name), action=action, target=target
    )


async def _register(store: Store, tenant: TenantRecord, name: str) -> None:
    spec = ClusterSpec(name=name, zone="DE", region="eu-central", slurm=SlurmAccessSpec())
    record = ClusterRecord(spec=spec, created_at=1.0, created_by=tenant.tenant_id)
    await store.add_cluster(
        record, audit=_audit(tenant, "cluster.add", name), max_clusters=MAX_CLUSTERS
    )


async def test_a_registration_todays_rules_refuse_is_left_out_not_fatal(
    store: Store, tenant: TenantRecord
) -> None:
    await _register(store, tenant, "lab")
    await _register(store, tenant, "old")
    # As an earlier greenfed stored it: a work_dir Slurm cuts at its space.
    stored = msgspec.json.decode(
        msgspec.json.encode(ClusterSpec(name="old", zone="DE", region="eu-central"))
    )
    stored["slurm"]["work_dir"] = "/scratch/with space"
    async with store._engine.begin() as connection:
        await connection.execute(
            update(clusters)
            .where(clusters.c.name == "old")
            .values(spec=msgspec.json.encode(stored))
        )

    assert [record.spec.name for record in await store.list_clusters()] == ["lab"]
    removed = await store.remove_cluster("old", audit=_audit(tenant, "cluster.remove", "old"))
    assert (removed.spec.name, removed.spec.zone) == ("old", "DE")
    assert [record.spec.name for record in await store.list_clusters()] == ["lab"]
