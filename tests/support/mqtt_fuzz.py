"""Random and malformed MQTT messages, on every channel, for the fuzz tests and benchmark.

Deterministic for a seed. Each message is one of: random bytes, truncated or
corrupted JSON, a real-looking payload with one field replaced by something absurd
(huge or negative numbers, 1e300 timestamps, seq 2^62, wrong types, giant strings,
thousands of accelerators), or a payload for another node than its topic names —
on real node ids (to disturb a healthy node), unknown ones, and topics that are
not node topics at all.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from typing import Any

from shared.topics import Channel, Topics

CHANNELS = (
    Channel.STATUS,
    Channel.TELEMETRY,
    Channel.REPORTED,
    Channel.EVENTS,
    Channel.LOGS,
    Channel.DESIRED,
)

ABSURD: tuple[Any, ...] = (
    None,
    True,
    -1,
    0,
    2**62,
    2**64,
    -(2**63),
    1e300,
    -1e300,
    1.5,
    "",
    "x" * 5000,
    "\u0000\ud7ff\uffff",
    [],
    {},
    [1, 2, 3],
    {"nested": {"deeper": [{"id": "gpu0"}] * 3}},
)


def _accelerator(index: int) -> dict[str, Any]:
    return {
        "id": f"gpu{index}",
        "kind": "gpu",
        "vendor": "nvidia",
        "model": "A100",
        "memory_bytes": 80 * 2**30,
        "compute_units": 108,
        "max_power_w": 400.0,
    }


def _payload(channel: Channel, node_id: str, now_s: float, rng: random.Random) -> dict[str, Any]:
    """A well-formed-looking payload of the channel (what a lying node would send)."""
    if channel is Channel.STATUS:
        return {
            "schema_version": "1.2",
            "node_id": node_id,
            "state": "online",
            "instance_id": f"fuzz-{rng.randrange(4)}",
            "agent_version": "fuzz",
            "site": rng.choice(["cloud", "edge"]),
            "zone": "DE",
            "region": "europe-west3",
            "labels": {},
            "host": {
                "hostname": "h",
                "os": "Linux",
                "arch": "x86_64",
                "cpu_logical_cores": 8,
                "memory_total_bytes": 2**34,
            },
            "accelerators": [_accelerator(i) for i in range(rng.choice([1, 8, 689]))],
            "telemetry_interval_s": 1.0,
            "started_at": now_s,
            "sent_at": now_s,
        }
    if channel is Channel.TELEMETRY:
        return {
            "node_id": node_id,
            "instance_id": f"fuzz-{rng.randrange(4)}",
            "seq": rng.choice([0, 1, 2**62]),
            "sampled_at": now_s,
            "interval_s": 1.0,
            "cpu_utilization_pct": 10.0,
            "memory_used_bytes": 1,
            "memory_total_bytes": 2,
            "accelerators": [{"id": "gpu0", "utilization_pct": 5.0, "memory_used_bytes": 1}],
        }
    if channel is Channel.REPORTED:
        return {
            "node_id": node_id,
            "instance_id": "fuzz",
            "observed_generation": rng.choice([0, 999_999]),
            "reported_at": now_s,
            "training": [{"job_id": f"job-{rng.randrange(100)}", "state": "succeeded"}],
            "deployments": [{"deployment_id": "d", "state": "ready"}],
        }
    if channel is Channel.EVENTS:
        return {
            "node_id": node_id,
            "event_id": f"e{rng.randrange(10**9)}",
            "kind": "failed",
            "subject": "job-1",
            "occurred_at": now_s,
        }
    if channel is Channel.LOGS:
        return {
            "node_id": node_id,
            "job_id": f"job-{rng.randrange(100)}",
            "offset": rng.randrange(10**6),
            "text": "pwned\n",
            "sent_at": now_s,
        }
    return {  # desired: what a forger would put on a node's desired topic
        "node_id": node_id,
        "generation": 999_999,
        "issued_at": now_s,
        "training": [{"job_id": "evil", "command": ["sh", "-c", "touch /tmp/pwned"]}],
    }


def _mutated(body: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    key = rng.choice(sorted(body))
    return {**body, key: rng.choice(ABSURD)}


def messages(
    topics: Topics,
    node_ids: tuple[str, ...],
    count: int,
    *,
    seed: int = 0,
    now_s: float = 1.7e9,
    include_desired: bool = True,
) -> Iterator[tuple[str, bytes]]:
    """`count` (topic, payload) pairs; `node_ids`: the real nodes to aim at (mixed with
    unknown ones). Payloads are never empty (an empty retained status is a deletion,
    which a broker ACL, not ingestion, must keep a node from sending for another)."""
    rng = random.Random(seed)
    channels = CHANNELS if include_desired else CHANNELS[:-1]
    for index in range(count):
        target = rng.choice(node_ids) if rng.random() < 0.6 else f"ghost-{rng.randrange(500)}"
        channel = rng.choice(channels)
        topic = topics.node(target, channel)
        style = rng.randrange(7)
        if style == 0:
            payload = rng.randbytes(rng.randrange(1, 300))
        elif style == 1:
            text = json.dumps(_payload(channel, target, now_s, rng))
            payload = text[: rng.randrange(1, max(2, len(text)))].encode()
        elif style == 2:
            payload = json.dumps(_mutated(_payload(channel, target, now_s, rng), rng)).encode()
        elif style == 3:  # a payload naming another node than its topic
            payload = json.dumps(_payload(channel, f"other-{index % 7}", now_s, rng)).encode()
        elif style == 4:  # plausible-looking lies (689 GPUs, seq 2^62, success reports)
            payload = json.dumps(_payload(channel, target, now_s, rng)).encode()
        elif style == 5:
            payload = json.dumps(rng.choice(ABSURD)).encode() or b"null"
            topic = rng.choice([topic, f"{topics.root}/v1/nodes/{target}", f"{topics.root}/v1/x"])
        else:
            depth = rng.randrange(1, 200)
            payload = (b"[" * depth + b"1" + b"]" * depth) if rng.random() < 0.5 else b"\xff\xfe"
        yield topic, payload
