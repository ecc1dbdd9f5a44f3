"""A separate process using the store, for tests that need more than one process.

python tests/store/child.py open SETTINGS_JSON
    open (and so migrate) the store, print the migrations it applied as JSON
python tests/store/child.py submit SETTINGS_JSON TENANT_ID
    submit work for ever, printing each id once `submit_work` has returned
    (committed: what a 201 would acknowledge)
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from cloud.store import open_store
from shared.settings import StoreSettings


async def open_and_report(settings: StoreSettings) -> None:
    store = await open_store(settings)
    print(json.dumps(list(store.migrations.applied)), flush=True)
    await store.close()


async def submit_forever(settings: StoreSettings, tenant_id: str) -> None:
    store = await open_store(settings)
    print("ready", flush=True)
    index = 0
    while True:
        result = await store.submit_work(
            tenant_id,
            kind="training",
            spec=msgspec.json.encode({"index": index}),
            priority="p1",
            idempotency_key=f"key-{index}",
        )
        sys.stdout.write(f"{index} {result.work.work_id}\n")
        sys.stdout.flush()
        index += 1


def main() -> None:
    command, settings_json = sys.argv[1], sys.argv[2]
    settings = msgspec.json.decode(settings_json, type=StoreSettings)
    if command == "open":
        asyncio.run(open_and_report(settings))
    elif command == "submit":
        asyncio.run(submit_forever(settings, sys.argv[3]))
    else:
        raise SystemExit(f"unknown command {command}")


if __name__ == "__main__":
    main()
