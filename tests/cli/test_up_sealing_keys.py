"""`greenfed up` pins each simulated node to the sealing key its agent holds this run
(new each run), whether the node enrolled now or in an earlier run: otherwise a second
`greenfed up` would drop every node's key at its birth and no job could get secrets."""

from __future__ import annotations

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from cloud.app_keys import ENROLLED_NODES
from cloud.store.enrolment import NewJoinToken
from greenfed.up import _pin_sealing_keys
from shared.sealing import public_key_text
from tests.api.support import running_api
from tests.store.databases import DatabaseUnderTest


async def test_every_enrolled_simulated_node_is_pinned_to_this_runs_key(
    database: DatabaseUnderTest,
) -> None:
    earlier, now = (public_key_text(X25519PrivateKey.generate()) for _ in range(2))
    async with running_api(database) as api:
        created = await api.store.create_join_token(NewJoinToken(ttl_s=60, max_uses=2))
        # Enrolled by an earlier run, with that run's key; and one enrolled without a key.
        await api.store.redeem_join_token(created.token, "sim-a100-0", sealing_public_key=earlier)
        await api.store.redeem_join_token(created.token, "sim-a100-1")

        await _pin_sealing_keys(
            api.app, {"sim-a100-0": now, "sim-a100-1": now, "never-enrolled": now}
        )

        for node_id in ("sim-a100-0", "sim-a100-1"):
            enrolled = await api.store.get_enrolled_node(node_id)
            assert enrolled is not None
            assert enrolled.sealing_public_key == now
            assert api.app[ENROLLED_NODES].pinned_sealing_key(node_id) == now
        assert await api.store.get_enrolled_node("never-enrolled") is None
        assert api.app[ENROLLED_NODES].pinned_sealing_key("never-enrolled") is None
