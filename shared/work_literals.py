"""The vocabularies of work, defined once: the scheduler core, the store, the REST
views, the event payloads and the CLI all import them from here (a leaf that imports
nothing, so none of them depends on another for a word).

Work kinds have one word per layer. Below the REST API (the scheduler, the store's
`kind` column, `work.state` events) a model server is `inference` work; the REST API
and spec files call the same work a `deployment` (`SpecKind`). `spec_kind_of` and
`work_kind_of` are the one mapping between the two.
"""

from __future__ import annotations

from typing import Final, Literal, get_args

WorkKind = Literal["training", "inference"]
SpecKind = Literal["training", "deployment"]
PriorityClass = Literal["p0", "p1", "p2"]
WorkState = Literal["pending", "scheduled", "running", "succeeded", "failed", "cancelled"]
AllocationState = Literal["assigned", "running"]
LabelOperator = Literal["In", "NotIn", "Exists", "DoesNotExist"]
# How a job must have ended for the work that depends on it to start (cloud/work/dependencies.py).
DependencyCondition = Literal["succeeded", "failed", "ended"]
# What becomes of a waiting job whose deadline can no longer be met.
DeadlinePolicy = Literal["fail", "keep"]
# The least isolation a training job accepts from the node that runs it, weakest first
# (docs/isolation.md): its own user and cgroups (`user`), namespaces of its own too
# (`sandbox`), or whatever the node gives (`none`).
IsolationRequirement = Literal["none", "user", "sandbox"]
# Where a training gang's workers must all be (cloud/scheduler/topology.py): one region
# (the default), one zone, one rack (the node label `rack`), or anywhere.
GangTopology = Literal["region", "zone", "rack", "any"]

WORK_KINDS: Final[tuple[WorkKind, ...]] = get_args(WorkKind)
PRIORITY_CLASSES: Final[tuple[PriorityClass, ...]] = get_args(PriorityClass)
WORK_STATES: Final[tuple[WorkState, ...]] = get_args(WorkState)
ALLOCATION_STATES: Final[tuple[AllocationState, ...]] = get_args(AllocationState)
DEPENDENCY_CONDITIONS: Final[tuple[DependencyCondition, ...]] = get_args(DependencyCondition)
GANG_TOPOLOGIES: Final[tuple[GangTopology, ...]] = get_args(GangTopology)


def spec_kind_of(kind: WorkKind) -> SpecKind:
    return "training" if kind == "training" else "deployment"


def work_kind_of(kind: SpecKind) -> WorkKind:
    return "training" if kind == "training" else "inference"
