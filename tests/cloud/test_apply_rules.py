"""The pure rules behind names, id prefixes and apply (cloud/work/lookup.py,
cloud/work/spec_changes.py)."""

from __future__ import annotations

import msgspec
import pytest

from cloud.store import WorkRecord
from cloud.work.lookup import Ambiguous, as_id_prefix, by_name, by_prefix, is_full_id
from cloud.work.spec_changes import (
    IN_PLACE_DEPLOYMENT_FIELDS,
    applied_in_place,
    not_in_place,
    spec_changes,
)
from cloud.work.specs import AutoscaleSpec, CanarySpec, DeploymentSpec, TrainingJobSpec
from shared.work_literals import WorkState

ID = "01JDZ8M3QX7A0B9C2D4E6F8G0H"


def record(work_id: str, state: WorkState) -> WorkRecord:
    return WorkRecord(
        work_id=work_id, tenant_id="t", kind="training", spec=b"{}", priority="p1",
        state=state, state_reason=None, attempts=0, submitted_at=0.0, updated_at=0.0,
        idempotency_key=None, version=1,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("reference", "prefix"),
    [
        ("01jd", "01JD"),  # any case
        ("01J", None),  # too short: most recent ids share their first characters
        ("01JDI", None),  # I, L, O and U are no Crockford digits: a name, not a prefix
        ("train-a", None),
        (ID.lower(), ID),  # a whole id typed in lower case
    ],
)
def test_an_id_prefix_is_4_to_26_crockford_characters(reference: str, prefix: str | None) -> None:
    assert as_id_prefix(reference) == prefix


def test_a_full_id_is_a_ulid() -> None:
    assert is_full_id(ID)
    assert not is_full_id(ID.lower())
    assert not is_full_id(ID[:-1])


def test_a_name_means_its_one_live_work_else_the_newest_ended() -> None:
    live, ended = record("B", "running"), record("A", "succeeded")
    assert by_name("n", [live], []) == live
    assert by_name("n", [], [ended]) == ended
    assert by_name("n", [], []) is None
    both = by_name("n", [live, record("C", "pending")], [])
    assert isinstance(both, Ambiguous)
    assert [r.work_id for r in both.candidates] == ["B", "C"]
    assert both.by == "name"
    assert isinstance(by_prefix("01JD", [live, ended]), Ambiguous)
    assert by_prefix("01JD", [ended]) == ended


def test_changes_are_the_fields_that_differ_and_which_cannot_change_in_place() -> None:
    stored = DeploymentSpec(name="d", model_id="m1", replicas=2)
    applied = DeploymentSpec(name="d", model_id="m2", replicas=3, accelerators_per_replica=2)
    changes = spec_changes(stored, applied)
    assert [c.field for c in changes] == ["model_id", "replicas", "accelerators_per_replica"]
    assert msgspec.json.encode(changes[1]) == b'{"field":"replicas","before":2,"after":3}'
    assert not_in_place(changes, IN_PLACE_DEPLOYMENT_FIELDS) == ("accelerators_per_replica",)
    job = TrainingJobSpec(name="j", command=("python",))
    assert spec_changes(job, job) == ()


def test_under_autoscale_the_count_is_the_autoscalers() -> None:
    scale = AutoscaleSpec(min_replicas=2, max_replicas=8, target_requests_per_s=10.0)
    stored = DeploymentSpec(name="d", model_id="m", replicas=6, autoscale=scale)
    applied = DeploymentSpec(name="d", model_id="m", autoscale=scale)  # replicas: its floor
    assert spec_changes(stored, applied) == ()
    narrower = msgspec.structs.replace(scale, max_replicas=4)
    kept = applied_in_place(stored, DeploymentSpec(name="d", model_id="m", autoscale=narrower))
    assert kept.replicas == 4  # the autoscaler's 6, within the new bounds


def test_a_new_model_ends_a_canary_and_the_same_model_keeps_it() -> None:
    canary = CanarySpec(model_id="m2")
    stored = DeploymentSpec(name="d", model_id="m1", replicas=3, canary=canary)
    same = applied_in_place(stored, DeploymentSpec(name="d", model_id="m1", replicas=4))
    assert same.canary == canary
    assert same.replicas == 4
    moved = applied_in_place(stored, DeploymentSpec(name="d", model_id="m3", replicas=3))
    assert moved.canary is None
