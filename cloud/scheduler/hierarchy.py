"""Hierarchical cohorts: a tree of queues above the tenants, and what each level may take.

A tenant's ``cohort`` names its parent; a ``Cohort`` record may name a parent of its own,
so cohorts nest (as Kueue's hierarchical cohorts, Volcano's hierarchical queues or a
Slurm account tree). Every node of the tree, per accelerator kind, has:

* a **nominal quota**: a tenant's own; a cohort's as configured, or, for a kind it does
  not list, the sum of its children's nominal quotas;
* a **borrowing limit**: how far above its nominal quota the node may go by borrowing
  what its siblings do not use (not listed: no limit beyond what they lend);
* a **lending limit**: how much of its *unused* nominal quota its siblings may borrow
  (not listed: all of it). What it does not lend stays reserved for its own subtree.

The rule (per kind): a node's *committed* amount is its usage, for a cohort the sum over
its children of what each holds plus what each keeps back unlent
(``max(0, nominal - committed - lending_limit)``). Work is admitted when, with it, every
node on the tenant's path stays within ``nominal + borrowing_limit`` and the root stays
within its nominal quota. With no lending limits this is the flat rule of quota.py (a
cohort as a whole within the sum of its members' quotas) applied at every level.

A cohort without a record that no record names as parent is the flat cohort of
quota.py; this module decides only for tenants whose parent chain has a record.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Final

from shared.messages import AcceleratorKind

from .model import KINDS, Tenant

# A limit that is not set: larger than any fleet.
UNLIMITED: Final = 1 << 60


class CohortTreeError(ValueError):
    """A tree that cannot be: a cycle of parents, a cohort named twice, a negative
    quota. ``field`` is the setting at fault, e.g. ``cohorts.research.parent``."""

    def __init__(self, field_path: str, message: str) -> None:
        super().__init__(f"{field_path}: {message}")
        self.field = field_path
        self.message = message


@dataclass(frozen=True, slots=True, kw_only=True)
class Cohort:
    """One inner node of the tree (see the module docstring for the meaning of each
    quota; a kind not listed takes the default described there)."""

    name: str
    parent: str | None = None
    nominal: Mapping[AcceleratorKind, int] = field(default_factory=dict)
    borrowing_limit: Mapping[AcceleratorKind, int] = field(default_factory=dict)
    lending_limit: Mapping[AcceleratorKind, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("nominal", "borrowing_limit", "lending_limit"):
            quotas: Mapping[AcceleratorKind, int] = getattr(self, name)
            for kind, count in quotas.items():
                if count < 0:
                    raise CohortTreeError(f"cohorts.{self.name}.{name}.{kind}", "must be >= 0")
            object.__setattr__(self, name, MappingProxyType(dict(quotas)))
        if self.parent == self.name:
            raise CohortTreeError(
                f"cohorts.{self.name}.parent", "a cohort cannot be its own parent"
            )


@dataclass(frozen=True, slots=True)
class _Node:
    """A tenant or a cohort, per kind index: nominal, borrowing and lending limits."""

    name: str
    is_tenant: bool
    parent: str | None  # a cohort name
    nominal: tuple[int, ...]
    borrowing_limit: tuple[int, ...]  # UNLIMITED where not set
    lending_limit: tuple[int, ...]  # UNLIMITED where not set


@dataclass(frozen=True, slots=True)
class Check:
    """Where the tree stops a tenant taking ``amount`` more: the largest excess over
    any limit on its path (<= 0: admitted), and whether it is the tenant's own."""

    own_excess: int  # over the tenant's nominal + borrowing limit
    path_excess: int  # over a cohort's nominal + borrowing limit, or the root's nominal
    blocking: str | None  # the cohort whose limit is furthest exceeded
    # For explanations: the blocking cohort (else the tenant's parent), before the amount.
    cohort: str
    cohort_committed: int
    cohort_nominal: int


UsageOf = Callable[[str], int]  # tenant name -> what it holds of the kind


class CohortTree:
    """The tree over the tenants that have a configured cohort above them.

    Tenants and cohorts are separate namespaces: a tenant may share a cohort's name, so
    every lookup says which kind it wants and never falls back to the other."""

    def __init__(self, tenants: Mapping[str, Tenant], cohorts: Mapping[str, Cohort]) -> None:
        parent_of = {name: c.parent for name, c in cohorts.items()}
        for name in cohorts:
            seen = [name]
            parent = parent_of.get(name)
            while parent is not None:
                if parent in seen:
                    raise CohortTreeError(
                        f"cohorts.{name}.parent",
                        "parents form a cycle: " + " -> ".join([*seen, parent]),
                    )
                seen.append(parent)
                parent = parent_of.get(parent)
        # Cohorts of the tree: every record, every parent a record names, and every cohort
        # with a member that lends only part of its quota (the flat rule cannot say that).
        tree_cohorts = set(cohorts) | {p for p in parent_of.values() if p is not None}
        tree_cohorts |= {
            t.cohort for t in tenants.values() if t.cohort is not None and t.lending_limit
        }
        self.cohort_names: frozenset[str] = frozenset(tree_cohorts)
        # Per cohort, its children of each kind, kept apart (the class docstring).
        subcohorts: dict[str, list[str]] = {name: [] for name in tree_cohorts}
        members: dict[str, list[str]] = {name: [] for name in tree_cohorts}
        self.tenant_names: frozenset[str] = frozenset(
            t.name for t in tenants.values() if t.cohort in tree_cohorts
        )
        for name, parent in sorted(parent_of.items()):
            if parent is not None:
                subcohorts[parent].append(name)
        nodes: dict[str, _Node] = {}
        for name in sorted(self.tenant_names):
            tenant = tenants[name]
            members[tenant.cohort].append(name)  # type: ignore[index]
            nodes[name] = _Node(
                name=name,
                is_tenant=True,
                parent=tenant.cohort,
                nominal=tuple(tenant.nominal.get(kind, 0) for kind in KINDS),
                borrowing_limit=tuple(
                    tenant.borrowing_limit.get(kind, UNLIMITED) for kind in KINDS
                ),
                lending_limit=tuple(tenant.lending_limit.get(kind, UNLIMITED) for kind in KINDS),
            )
        self._tenant_nodes = nodes
        self._cohort_nodes: dict[str, _Node] = {}
        # Each cohort's children, sub-cohorts then member tenants, made once: `committed`
        # walks them for every quota decision.
        self._children: dict[str, list[_Node]] = {}
        for name in sorted(tree_cohorts):
            self._cohort_node(name, cohorts, subcohorts, members)
        # Per tenant: its ancestors, nearest first.
        self.path: dict[str, tuple[str, ...]] = {name: self._ancestors(name) for name in nodes}

    def _cohort_node(
        self,
        name: str,
        cohorts: Mapping[str, Cohort],
        subcohorts: Mapping[str, list[str]],
        members: Mapping[str, list[str]],
    ) -> _Node:
        found = self._cohort_nodes.get(name)
        if found is not None:
            return found
        record = cohorts.get(name) or Cohort(name=name)
        children = [
            self._cohort_node(child, cohorts, subcohorts, members) for child in subcohorts[name]
        ]
        children += [self._tenant_nodes[member] for member in members[name]]
        self._children[name] = children
        nominal = tuple(
            record.nominal.get(kind, sum(child.nominal[k] for child in children))
            for k, kind in enumerate(KINDS)
        )
        node = _Node(
            name=name,
            is_tenant=False,
            parent=record.parent,
            nominal=nominal,
            borrowing_limit=tuple(record.borrowing_limit.get(kind, UNLIMITED) for kind in KINDS),
            lending_limit=tuple(record.lending_limit.get(kind, UNLIMITED) for kind in KINDS),
        )
        self._cohort_nodes[name] = node
        return node

    def node(self, cohort: str) -> _Node:
        """The cohort named ``cohort`` (never a tenant of that name)."""
        return self._cohort_nodes[cohort]

    def _ancestors(self, tenant: str) -> tuple[str, ...]:
        found: list[str] = []
        parent = self._tenant_nodes[tenant].parent
        while parent is not None:
            found.append(parent)
            parent = self._cohort_nodes[parent].parent
        return tuple(found)

    def manages(self, tenant: str) -> bool:
        return tenant in self.tenant_names

    def root_of(self, tenant: str) -> str:
        return self.path[tenant][-1]

    def cohort_nominal(self, cohort: str, k: int) -> int:
        return self._cohort_nodes[cohort].nominal[k]

    # -- the rule ---------------------------------------------------------------

    def committed(
        self, node: _Node, k: int, usage_of: UsageOf, extra: Mapping[str, int] | None = None
    ) -> int:
        """What ``node`` holds of kind ``k`` for its parent's accounting, before what it
        keeps back unlent; ``extra``: amounts added to tenants' usage."""
        if node.is_tenant:
            return usage_of(node.name) + (extra or {}).get(node.name, 0)
        return sum(
            self._contribution(child, k, usage_of, extra) for child in self._children[node.name]
        )

    def _contribution(
        self, node: _Node, k: int, usage_of: UsageOf, extra: Mapping[str, int] | None
    ) -> int:
        committed = self.committed(node, k, usage_of, extra)
        kept_back = node.nominal[k] - committed - node.lending_limit[k]
        return committed + max(0, kept_back)

    def check(self, tenant: str, k: int, amount: int, usage_of: UsageOf) -> Check:
        """Whether ``tenant`` may hold ``amount`` more of kind ``k`` (module docstring)."""
        node = self._tenant_nodes[tenant]
        extra = {tenant: amount}
        usage = usage_of(tenant) + amount
        own_excess = usage - (node.nominal[k] + node.borrowing_limit[k])
        path_excess = -UNLIMITED
        blocking: str | None = None
        ancestors = self.path[tenant]
        for i, cohort in enumerate(ancestors):
            record = self._cohort_nodes[cohort]
            committed = self.committed(record, k, usage_of, extra)
            is_root = i == len(ancestors) - 1
            limit = record.nominal[k] + (0 if is_root else record.borrowing_limit[k])
            excess = committed - limit
            if excess > path_excess:
                path_excess, blocking = excess, cohort
        shown = blocking if blocking is not None and path_excess > 0 else ancestors[0]
        return Check(
            own_excess=own_excess,
            path_excess=path_excess,
            blocking=blocking if path_excess > 0 else None,
            cohort=shown,
            cohort_committed=self.committed(self._cohort_nodes[shown], k, usage_of),
            cohort_nominal=self._cohort_nodes[shown].nominal[k],
        )

    def borrowing(self, node: _Node, k: int, usage_of: UsageOf) -> bool:
        return self.committed(node, k, usage_of) > node.nominal[k]

    def lenders_reclaim_from(self, tenant: str, k: int, usage_of: UsageOf) -> set[str]:
        """Tenants whose work ``tenant`` may reclaim (``reclaims_from``)."""
        return {
            other for other in self.tenant_names if self.reclaims_from(tenant, other, k, usage_of)
        }

    def reclaims_from(self, tenant: str, other: str, k: int, usage_of: UsageOf) -> bool:
        """Whether ``tenant`` may reclaim ``other``'s work: in its tree, ``other`` borrows
        or is under a cohort that borrows, below the nearest cohort they share (a cohort
        reclaims what it lent, never what its own members share)."""
        if other == tenant or not self.manages(other):
            return False
        if self.root_of(other) != self.root_of(tenant):
            return False
        ours = self.path[tenant]
        chain = (
            self._tenant_nodes[other],
            *(self._cohort_nodes[cohort] for cohort in self.path[other]),
        )
        for node in chain:
            if not node.is_tenant and node.name in ours:
                return False
            if self.borrowing(node, k, usage_of):
                return True
        return False

    def ceiling(self, tenant: str, k: int) -> int:
        """The most of kind ``k`` the tenant could hold with nothing else running."""

        def nothing(_: str) -> int:
            return 0

        low, high = (
            0,
            max(self._tenant_nodes[tenant].nominal[k], 0)
            + sum(node.nominal[k] for node in self._tenant_nodes.values()),
        )
        while low < high:  # the largest amount the tree admits (monotone in the amount)
            middle = (low + high + 1) // 2
            check = self.check(tenant, k, middle, nothing)
            if check.own_excess <= 0 and check.path_excess <= 0:
                low = middle
            else:
                high = middle - 1
        return low

    def describe(self, tenant: str) -> str:
        """The tenant's place in the tree, for a person: ``root/…/parent``."""
        return "/".join(reversed(self.path[tenant]))


EMPTY_COHORTS: Final[Mapping[str, Cohort]] = MappingProxyType({})


def tree_of(tenants: Mapping[str, Tenant], cohorts: Mapping[str, Cohort]) -> CohortTree | None:
    """The tree, where there is one: configured cohorts, or a cohort member that lends
    only part of its quota; None: flat cohorts only (quota.py's fast rule).

    A pass asks once per judged job for the same snapshot's mappings: the last answer
    is kept (with the mappings it was built from, so their ids stay theirs)."""
    global _last_tree
    last = _last_tree
    if last is not None and last[0] is tenants and last[1] is cohorts:
        return last[2]
    tree = (
        CohortTree(tenants, cohorts)
        if cohorts or any(t.cohort is not None and t.lending_limit for t in tenants.values())
        else None
    )
    _last_tree = (tenants, cohorts, tree)
    return tree


# tree_of's last answer; replaced whole (one assignment), so a reader in another thread
# sees an old entry or a new one, never half of each. A tree is immutable once built.
_last_tree: tuple[Mapping[str, Tenant], Mapping[str, Cohort], CohortTree | None] | None = None


def cohort_map(cohorts: Sequence[Cohort]) -> Mapping[str, Cohort]:
    """Cohorts by name, in name order; a name given twice is refused."""
    found: dict[str, Cohort] = {}
    for cohort in cohorts:
        if cohort.name in found:
            raise CohortTreeError(f"cohorts.{cohort.name}", "named twice")
        found[cohort.name] = cohort
    return MappingProxyType(dict(sorted(found.items())))
