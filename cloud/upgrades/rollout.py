"""How a rollout of an agent version moves through the fleet: pure functions over its
stored state and the registry's view of the nodes (the loop drives them:
cloud/upgrades/controller.py).

Waves: the canaries first (`canary_percent` of the nodes to upgrade, at least one), then
waves that double in size, as AWS IoT Greengrass's exponential rollouts and Kubernetes'
surge do: a bad version meets few nodes, a good one reaches thousands in a handful of
waves. Which nodes are canaries is a stable hash of (rollout, node), so a rollout
samples the fleet rather than its alphabet.

A node in a started wave is `upgraded` once its birth says it runs the version, and
`failed` once its birth reports this rollout's upgrade did not take (it could not be
fetched, checked or installed; or the new version did not announce itself and the
agent rolled back: edge/upgrade/), or when the wave's bound passes without either.
A node that cannot upgrade itself is `skipped` at the start and never counts. A node that
runs the version already is `upgraded` from the start, in no wave (`ALREADY_ON_VERSION`):
it was not asked, so it never counts in a wave's failed share (where it would hide the
failures of the nodes that were).

As soon as more than `max_failure_share` of a wave's nodes failed, the rollout halts: no
further wave starts, the failed nodes are no longer asked (the ones that upgraded stay
so, the ones still on their way finish and are recorded). A wave none of whose nodes
is still `upgrading` is over, and the next one starts; after the last, the rollout has
`succeeded`.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Mapping
from typing import Final

import msgspec

from cloud.fleet.registry import NodeRecord
from cloud.upgrades.views import (
    NodeUpgradeState,
    RolloutNode,
    RolloutPhase,
    RolloutRequest,
    RolloutState,
    WaveView,
)

# The wave of a node that ran the version before the rollout started: none. Counted in
# the canaries' wave, ten such nodes and one failed canary would be a 9 % failed share,
# under the usual bound, and the next wave would start.
ALREADY_ON_VERSION: Final = -1


def wave_sizes(nodes: int, canary_percent: float) -> list[int]:
    """The waves' sizes: the canaries, then doubling, the last taking what is left."""
    if nodes == 0:
        return []
    canaries = min(nodes, max(1, math.ceil(nodes * canary_percent / 100)))
    sizes = [canaries]
    left = nodes - canaries
    size = canaries
    while left > 0:
        size = min(left, 2 * size)
        sizes.append(size)
        left -= size
    return sizes


def _sample_key(rollout_id: str, node_id: str) -> str:
    return hashlib.sha256(f"{rollout_id}/{node_id}".encode()).hexdigest()


def cannot_upgrade(record: NodeRecord | None) -> str | None:
    """Why a node cannot upgrade itself; None if it can."""
    if record is None:
        return "not known to this control plane"
    if not record.status.self_upgrade:
        return "its agent cannot upgrade itself (no supervisor runs it, or it is older)"
    return None


def new_rollout(
    rollout_id: str,
    rules: RolloutRequest,
    node_ids: Iterable[str],
    nodes: Mapping[str, NodeRecord],
    now: float,
) -> RolloutState:
    """The first state of a rollout over `node_ids`; its canaries start at once."""
    eligible: list[str] = []
    placed: dict[str, RolloutNode] = {}
    for node_id in sorted(set(node_ids)):
        record = nodes.get(node_id)
        if record is not None and record.status.agent_version == rules.version:
            placed[node_id] = RolloutNode(
                wave=ALREADY_ON_VERSION, state="upgraded", detail="ran it already", changed_at=now
            )
            continue
        why = cannot_upgrade(record)
        if why is not None:
            placed[node_id] = RolloutNode(wave=0, state="skipped", detail=why, changed_at=now)
        else:
            eligible.append(node_id)
    eligible.sort(key=lambda node_id: _sample_key(rollout_id, node_id))
    sizes = wave_sizes(len(eligible), rules.canary_percent)
    start = 0
    for wave, size in enumerate(sizes):
        for node_id in eligible[start : start + size]:
            state: NodeUpgradeState = "upgrading" if wave == 0 else "waiting"
            placed[node_id] = RolloutNode(wave=wave, state=state, changed_at=now)
        start += size
    return RolloutState(
        rules=rules,
        waves=len(sizes),
        current_wave=0,
        wave_started_at=now,
        nodes=dict(sorted(placed.items())),
    )


def _outcome(
    rollout_id: str, version: str, entry: RolloutNode, record: NodeRecord | None
) -> RolloutNode | None:
    """A changed entry for an `upgrading` node its birth decides; None: undecided."""
    if record is None:
        return None
    status = record.status
    if status.agent_version == version:
        return msgspec.structs.replace(entry, state="upgraded", detail="")
    report = status.agent_upgrade
    if report is not None and report.version == version and report.rollout_id == rollout_id:
        return msgspec.structs.replace(
            entry, state="failed", detail=f"{report.outcome}: {report.detail}"[:1024]
        )
    return None


def advance(
    rollout_id: str,
    version: str,
    phase: RolloutPhase,
    state: RolloutState,
    nodes: Mapping[str, NodeRecord],
    now: float,
) -> tuple[RolloutPhase, RolloutState]:
    """The rollout's phase and state after what the nodes' births say now. A halted
    rollout starts no wave, but the nodes it had asked still finish (they are on their
    way) and are recorded as they do."""
    changed = dict(state.nodes)
    for node_id, entry in state.nodes.items():
        if entry.state != "upgrading":
            continue
        decided = _outcome(rollout_id, version, entry, nodes.get(node_id))
        if decided is None and now - state.wave_started_at > state.rules.wave_timeout_s:
            decided = msgspec.structs.replace(
                entry,
                state="failed",
                detail=f"no answer within the wave's {state.rules.wave_timeout_s:g} s",
            )
        if decided is not None:
            changed[node_id] = msgspec.structs.replace(decided, changed_at=now)
    state = msgspec.structs.replace(state, nodes=changed)
    if phase != "running":
        return phase, state
    wave = [entry for entry in changed.values() if entry.wave == state.current_wave]
    wave = [entry for entry in wave if entry.state != "skipped"]
    failed = sum(1 for entry in wave if entry.state == "failed")
    limit = state.rules.max_failure_share
    # Halt as soon as the failures pass the share of the whole wave: its stragglers
    # could not bring the share back under.
    if failed and failed / len(wave) > limit:
        return "halted", _finish(
            state, now, f"wave {state.current_wave + 1}: {failed} of {len(wave)} nodes failed"
        )
    if any(entry.state == "upgrading" for entry in wave):
        return "running", state
    next_wave = state.current_wave + 1
    if next_wave >= state.waves:
        return "succeeded", _finish(state, now, "")
    started = {
        node_id: msgspec.structs.replace(entry, state="upgrading", changed_at=now)
        if entry.wave == next_wave and entry.state == "waiting"
        else entry
        for node_id, entry in changed.items()
    }
    return "running", msgspec.structs.replace(
        state, nodes=started, current_wave=next_wave, wave_started_at=now
    )


def _finish(state: RolloutState, now: float, detail: str) -> RolloutState:
    return msgspec.structs.replace(state, finished_at=now, detail=detail)


def asked_nodes(phase: RolloutPhase, state: RolloutState) -> frozenset[str]:
    """The nodes whose `desired` document names the rollout's version: those asked and
    not failed, and those that run it (so a node that goes back by hand is asked again);
    a cancelled rollout asks nobody."""
    if phase == "cancelled":
        return frozenset()
    return frozenset(
        node_id
        for node_id, entry in state.nodes.items()
        if entry.state in ("upgrading", "upgraded")
    )


def waves_of(state: RolloutState) -> tuple[WaveView, ...]:
    views = []
    for wave in range(state.waves):
        entries = [entry for entry in state.nodes.values() if entry.wave == wave]
        entries = [entry for entry in entries if entry.state != "skipped"]
        views.append(
            WaveView(
                wave=wave,
                nodes=len(entries),
                upgraded=sum(1 for entry in entries if entry.state == "upgraded"),
                failed=sum(1 for entry in entries if entry.state == "failed"),
                upgrading=sum(1 for entry in entries if entry.state == "upgrading"),
                waiting=sum(1 for entry in entries if entry.state == "waiting"),
            )
        )
    return tuple(views)
