"""Limits and intervals of the API's long-lived streams and in-memory buffers.

Defaults suit production; tests pass smaller intervals to `create_app`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class ApiTuning:
    # Server-sent events: a comment line this often keeps proxies from closing idle streams.
    heartbeat_s: float = 15.0
    # The event log is read at least this often (commits of other replicas); commits of
    # this process wake the reader at once, at most once per `event_min_interval_s`.
    event_poll_interval_s: float = 1.0
    event_min_interval_s: float = 0.02
    event_page_size: int = 500
    # Events waiting for one slow stream; beyond this it re-reads from the store instead.
    event_queue_limit: int = 1000
    # Concurrent streams (events and followed logs): in all, and per tenant.
    max_streams: int = 1000
    max_streams_per_tenant: int = 64
    # Followed logs: how often the job's state is checked, and how long output may
    # still arrive after the job ended before the stream closes.
    log_state_poll_s: float = 1.0
    log_drain_s: float = 2.0
    # In-memory job output (fed by the `logs` MQTT channel).
    log_bytes_per_job: int = 1024 * 1024
    log_total_bytes: int = 128 * 1024 * 1024
    log_max_jobs: int = 4096
