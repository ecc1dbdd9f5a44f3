"""Typed keys for what the aiohttp application holds (no module globals)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from aiohttp import web
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from cloud.api.streams import StreamLimits
from cloud.api.tuning import ApiTuning
from cloud.broker_accounts.accounts import BrokerAccounts
from cloud.clusters.runtime import ClusterFleet
from cloud.fleet.enrolled import EnrolledNodes
from cloud.fleet.ingest import Ingestor
from cloud.fleet.liveness import Liveness
from cloud.fleet.node_admin import StoredDrainWaiting
from cloud.fleet.node_pages import NodePages
from cloud.fleet.outage import BrokerOutageJudge
from cloud.fleet.registry import NodeRegistry
from cloud.loop.loop import SchedulingLoop
from cloud.metrics import MetricsRegistries
from cloud.models.blobs import BlobStore
from cloud.models.signing import ModelUrlSigner
from cloud.secrets.at_rest import SecretsAtRest
from cloud.signals.service import SignalService
from cloud.store import Store, TenantRecord
from cloud.streams.events import EventHub
from cloud.streams.logs import JobLogStore
from cloud.usage.accountant import Accountant
from shared.settings import Settings

SETTINGS = web.AppKey("settings", Settings)
# The key `desired` documents and enrolment certificates are signed with
# (`cloud.signing_key_file`), read once as the app starts.
SIGNING_KEY = web.AppKey("signing_key", Ed25519PrivateKey)
REGISTRY = web.AppKey("registry", NodeRegistry)
NODE_PAGES = web.AppKey("node_pages", NodePages)  # `/v1/nodes`' kept JSON
# What drains wait for as the leader stored it, for a replica that does not lead.
DRAIN_WAITING = web.AppKey("drain_waiting", StoredDrainWaiting)
INGESTOR = web.AppKey("ingestor", Ingestor)
# Decides when a silent node is offline and when its work is lost.
LIVENESS = web.AppKey("liveness", Liveness)
# Blames on the broker the wills that came with the control plane's own loss of it.
BROKER_OUTAGES = web.AppKey("broker_outages", BrokerOutageJudge)
# /metrics's series: the fleet's (for anyone) and those naming tenants (authenticated).
METRICS = web.AppKey("metrics", MetricsRegistries)
# The token a Prometheus scrape sends to see the tenant series too (cloud/scrape_token.py).
SCRAPE_TOKEN = web.AppKey("scrape_token", str)
SIGNALS = web.AppKey("signals", SignalService)
# Tasks the app runs in the background; a runner watches them to fail fast (e.g. MQTT auth).
BACKGROUND_TASKS: web.AppKey[list[asyncio.Task[None]]] = web.AppKey("background_tasks")
# The durable store, opened (and migrated) when the app starts.
STORE = web.AppKey("store", Store)
# Where the admin token was written when this data directory's admin was created.
ADMIN_TOKEN_FILE = web.AppKey("admin_token_file", Path)
JOB_LOGS = web.AppKey("job_logs", JobLogStore)
EVENT_HUB = web.AppKey("event_hub", EventHub)
STREAMS = web.AppKey("streams", StreamLimits)
TUNING = web.AppKey("tuning", ApiTuning)
# Uploaded model files, stored by content in the data directory.
MODEL_BLOBS = web.AppKey("model_blobs", BlobStore)
# Signs the model URLs agents download from (a key shared through the store).
MODEL_URL_SIGNER = web.AppKey("model_url_signer", ModelUrlSigner)
# The scheduling loop (it runs passes only while this process leads).
SCHEDULER = web.AppKey("scheduler", SchedulingLoop)
# Set when the app begins to shut down: long-lived streams end at once.
STOPPING = web.AppKey("stopping", asyncio.Event)
# Creates and disables nodes' broker accounts (`cloud.broker_accounts`); closed at cleanup.
BROKER_ACCOUNTS = web.AppKey("broker_accounts", BrokerAccounts)

# Live usage accounting (present when scheduling and `usage.enabled` are on).
ACCOUNTANT = web.AppKey("accountant", Accountant)

# Encrypts tenants' secrets into the specs the store keeps, and opens them for release
# (cloud/secrets/); its key is read once, when the app starts.
SECRETS_AT_REST = web.AppKey("secrets_at_rest", SecretsAtRest)

# The registered clusters with schedulers of their own, a bridge each (cloud/clusters/).
CLUSTERS = web.AppKey("clusters", ClusterFleet)

# The node ids ingestion admits (enrolled and unrevoked; cloud/fleet/enrolled.py).
ENROLLED_NODES = web.AppKey("enrolled_nodes", EnrolledNodes)

# The authenticated tenant of a request (set by the auth middleware).
TENANT = web.RequestKey("tenant", TenantRecord)
# Set when an admin confirmed a bulk destructive action (cloud/api/bulk_actions.py).
BULK_CONFIRMED = web.RequestKey("bulk_confirmed", bool)
# The destructive action an admin past the limit has not confirmed: `audit_entry` stops
# it where it would be recorded, being done (cloud/api/bulk_actions.py).
BULK_UNCONFIRMED = web.RequestKey("bulk_unconfirmed", str)
