"""Fair sharing between siblings: dominant-resource share with decayed past usage.

A tenant's (or cohort's) *usage* of a kind is what it holds now plus its **decayed past
usage**: the exponentially weighted average of what it held, with weights halving every
``half_life_s`` (``DecayedUsage``; 0: what it holds now only). Its *share* of a kind is
that usage over its nominal quota (a kind it has no quota of: ``1 + usage / capacity``,
after anything within quota; an unmanaged tenant: usage over the fleet's capacity), and
its **dominant share** the largest over kinds (DRF).

Ordering (queue_order.py): within a priority class, pending work is taken from the
sibling with the smallest dominant share at every level of the cohort tree, from the
top: first the top-level cohort (or tenant without a configured cohort) with the
smallest share, then, inside it, the child with the smallest share, down to the tenant.
``sort_key`` is that path of shares, compared level by level.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

from .hierarchy import CohortTree
from .model import KIND_INDEX, KINDS

PastUsage = Mapping[str, tuple[float, ...]]  # tenant -> decayed average held, per KINDS
NO_PAST_USAGE: Final[PastUsage] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class DecayedUsage:
    """One tenant's accumulator: accelerator-seconds per kind, each weighted by
    ``2 ** -(age / half_life_s)``, as of ``as_of``. Advanced incrementally: the cost is
    one multiplication per kind, whatever the history."""

    accelerator_seconds: tuple[float, ...]  # per KINDS
    as_of: float

    @staticmethod
    def empty(now: float) -> DecayedUsage:
        return DecayedUsage((0.0,) * len(KINDS), now)

    def advanced(self, now: float, held: Sequence[int], half_life_s: float) -> DecayedUsage:
        """Decayed to ``now``, adding ``held`` (per kind) as held since ``as_of``."""
        elapsed = max(0.0, now - self.as_of)
        if half_life_s <= 0:
            return DecayedUsage((0.0,) * len(KINDS), now)
        rate = math.log(2) / half_life_s
        keep = math.exp(-rate * elapsed)
        # The integral of a constant `held` over the interval, decayed to `now`.
        added = (1.0 - keep) / rate
        return DecayedUsage(
            tuple(
                old * keep + count * added
                for old, count in zip(self.accelerator_seconds, held, strict=True)
            ),
            now,
        )

    def average(self, now: float, half_life_s: float) -> tuple[float, ...]:
        """The weighted average held (accelerators), decayed to ``now``: the unit the
        share adds to what is held now."""
        if half_life_s <= 0:
            return (0.0,) * len(KINDS)
        rate = math.log(2) / half_life_s
        keep = math.exp(-rate * max(0.0, now - self.as_of))
        return tuple(value * keep * rate for value in self.accelerator_seconds)


def kind_usage(usage: Mapping[str, float]) -> tuple[float, ...]:
    """Per kind (KINDS order) from a mapping by kind name; unknown names are ignored."""
    values = [0.0] * len(KINDS)
    for kind, value in usage.items():
        k = KIND_INDEX.get(kind)  # type: ignore[call-overload]
        if k is not None:
            values[k] = value
    return tuple(values)


def dominant_share(
    used: Sequence[float], nominal: Sequence[int] | None, capacity: Sequence[int]
) -> float:
    """DRF share of one tenant or cohort (module docstring); ``nominal`` None: unmanaged."""
    share = 0.0
    for k, amount in enumerate(used):
        if amount <= 0:
            continue
        if nominal is None:
            kind_share = amount / capacity[k]
        elif nominal[k] > 0:
            kind_share = amount / nominal[k]
        else:
            kind_share = 1.0 + amount / capacity[k]
        share = max(share, kind_share)
    return share


class ShareBook:
    """Dominant shares of the tenants and cohorts, from what each holds now (``held``)
    and its decayed past (``past``); ``refresh`` after usage changes."""

    def __init__(
        self,
        tree: CohortTree | None,
        nominal: Mapping[str, Sequence[int]],
        capacity: Sequence[int],
        past: PastUsage,
    ) -> None:
        self.tree = tree
        self._nominal = nominal
        self._capacity = capacity
        self._past = past

    def used(self, tenant: str, held: Sequence[int] | None) -> list[float]:
        past = self._past.get(tenant)
        now = held if held is not None else (0,) * len(KINDS)
        if past is None:
            return [float(value) for value in now]
        return [value + before for value, before in zip(now, past, strict=True)]

    def tenant_share(self, tenant: str, held: Sequence[int] | None) -> float:
        # Read for every lane refreshed: without a past, what it holds is its usage as is.
        if tenant not in self._past:
            if held is None:
                return 0.0
            return dominant_share(held, self._nominal.get(tenant), self._capacity)
        return dominant_share(self.used(tenant, held), self._nominal.get(tenant), self._capacity)

    def cohort_share(self, cohort: str, held_of: Mapping[str, Sequence[int]]) -> float:
        tree = self.tree
        assert tree is not None
        total = [0.0] * len(KINDS)
        for tenant in tree.tenant_names:
            if cohort in tree.path[tenant]:
                for k, value in enumerate(self.used(tenant, held_of.get(tenant))):
                    total[k] += value
        node = tree.node(cohort)
        return dominant_share(total, node.nominal, self._capacity)

    def sort_key(
        self, tenant: str, held_of: Mapping[str, Sequence[int]], cohort_shares: dict[str, float]
    ) -> tuple[float, ...]:
        """Shares from the top of the tenant's tree down to the tenant (module docstring);
        ``cohort_shares`` caches cohorts' shares for one refresh."""
        own = self.tenant_share(tenant, held_of.get(tenant))
        tree = self.tree
        if tree is None or not tree.manages(tenant):
            return (own,)
        shares: list[float] = []
        for cohort in reversed(tree.path[tenant]):
            share = cohort_shares.get(cohort)
            if share is None:
                share = cohort_shares[cohort] = self.cohort_share(cohort, held_of)
            shares.append(share)
        shares.append(own)
        return tuple(shares)


@dataclass(frozen=True, slots=True)
class Standing:
    """One tenant's position for `greenfed tenants`."""

    parent_path: tuple[str, ...]  # from the top cohort down to its parent; () without one
    dominant_share: float
    rank: int  # among its siblings, 1 = served first
    siblings: int  # including itself


def standings(
    book: ShareBook,
    cohort_of: Mapping[str, str | None],
    held_of: Mapping[str, Sequence[int]],
) -> dict[str, Standing]:
    """Each tenant's path, dominant share and rank among its siblings: the tenants with
    the same parent cohort (or, without one, the other tenants without one), by share
    as queue_order.py would serve them, then name."""
    cohort_shares: dict[str, float] = {}
    tree = book.tree

    def path(name: str) -> tuple[str, ...]:
        if tree is not None and tree.manages(name):
            return tuple(reversed(tree.path[name]))
        cohort = cohort_of[name]
        return () if cohort is None else (cohort,)

    paths = {name: path(name) for name in cohort_of}
    shares = {name: book.sort_key(name, held_of, cohort_shares)[-1] for name in cohort_of}
    groups: dict[tuple[str, ...], list[tuple[float, str]]] = {}
    for name in cohort_of:
        groups.setdefault(paths[name], []).append((shares[name], name))
    result: dict[str, Standing] = {}
    for members in groups.values():
        members.sort()
        for rank, (share, name) in enumerate(members, start=1):
            result[name] = Standing(paths[name], share, rank, len(members))
    return result
