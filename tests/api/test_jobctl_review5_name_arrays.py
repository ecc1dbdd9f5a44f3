"""A name shared by job arrays and other live work is ambiguous however many tasks the
arrays have (review 5, bug 1): the name names an array only when every live match is a
task of that one array (docs/rest.md#names-and-id-prefixes). The matches are read a
bounded number at a time, newest first; an array of more tasks than that bound must not
hide the other live work of its name. Both databases."""

from __future__ import annotations

from typing import Any

from tests.api.support import Api, bearer, job_spec, problem

TASKS = "0-11"  # 12 tasks: more than the matches a name lookup reads at once (11)


async def states(api: Api, token: str, *work_ids: str) -> list[str]:
    return [(await (await api.get(token, f"/v1/jobs/{w}")).json())["state"] for w in work_ids]


async def array_states(api: Api, token: str, array_id: str) -> dict[str, int]:
    body: dict[str, Any] = await (await api.get(token, f"/v1/jobs/{array_id}")).json()
    counts: dict[str, int] = body["array"]["states"]
    return counts


async def test_a_name_of_a_job_and_two_big_arrays_is_ambiguous_and_cancels_nothing(
    api: Api,
) -> None:
    token = await api.tenant("vision")
    single = await api.submitted(token, job_spec(name="sweep"))
    older = await api.submitted(token, job_spec(name="sweep", array=TASKS))
    newer = await api.submitted(token, job_spec(name="sweep", array=TASKS))

    shown = await problem(await api.get(token, "/v1/jobs/sweep"), 409)
    assert shown["type"].endswith("/ambiguous-reference")
    for work_id in (single, older, newer):
        assert work_id in shown["detail"]
    assert f"{newer} (job array, 12 tasks not ended, submitted " in shown["detail"]

    refused = await problem(await api.client.delete("/v1/jobs/sweep", headers=bearer(token)), 409)
    assert refused["type"].endswith("/ambiguous-reference")
    assert await states(api, token, single) == ["pending"]
    assert await array_states(api, token, older) == {"pending": 12}
    assert await array_states(api, token, newer) == {"pending": 12}

    # Waiting for "sweep" is as ambiguous: a 422 on the dependency, not the older array.
    waits = await api.submit(token, job_spec(name="after", depends_on=[{"job": "sweep"}]))
    body = await problem(waits, 422)
    assert [p["name"] for p in body["invalid_params"]] == ["$.depends_on[0].job"]
    assert single in body["detail"]


async def test_two_big_arrays_of_one_name_are_ambiguous_until_one_has_ended(api: Api) -> None:
    token = await api.tenant("vision")
    older = await api.submitted(token, job_spec(name="sweep", array=TASKS))
    newer = await api.submitted(token, job_spec(name="sweep", array=TASKS))
    body = await problem(await api.get(token, "/v1/jobs/sweep"), 409)
    assert older in body["detail"]
    assert newer in body["detail"]

    cancelled = await api.client.delete(f"/v1/jobs/{newer}", headers=bearer(token))
    assert cancelled.status == 200, await cancelled.text()
    # Only the older has live tasks now: the name names it, as its id does.
    shown = await api.get(token, "/v1/jobs/sweep")
    assert shown.status == 200, await shown.text()
    assert (await shown.json())["id"] == older


async def test_a_job_left_live_beside_a_big_ended_array_is_what_the_name_names(
    api: Api,
) -> None:
    token = await api.tenant("vision")
    single = await api.submitted(token, job_spec(name="sweep"))
    array = await api.submitted(token, job_spec(name="sweep", array=TASKS))
    cancelled = await api.client.delete(f"/v1/jobs/{array}", headers=bearer(token))
    assert cancelled.status == 200, await cancelled.text()
    assert (await (await api.get(token, "/v1/jobs/sweep")).json())["id"] == single


async def test_the_admin_sees_arrays_of_one_name_in_two_tenants_as_ambiguous(api: Api) -> None:
    acme = await api.tenant("acme")
    globex = await api.tenant("globex")
    ours = await api.submitted(acme, job_spec(name="sweep", array=TASKS))
    theirs = await api.submitted(globex, job_spec(name="sweep", array=TASKS))
    # Each tenant's own name names its own array...
    assert (await (await api.get(acme, "/v1/jobs/sweep")).json())["id"] == ours
    assert (await (await api.get(globex, "/v1/jobs/sweep")).json())["id"] == theirs
    # ...while the admin, reaching both, is asked which.
    body = await problem(
        await api.client.delete("/v1/jobs/sweep", headers=bearer(api.admin_token)), 409
    )
    assert ours in body["detail"]
    assert theirs in body["detail"]
    assert await array_states(api, acme, ours) == {"pending": 12}
