"""`alternative_shapes` on `/v1/jobs` (flexible shapes): stored with the spec, and a bad
one refused as a problem naming the field, on both store backends."""

from __future__ import annotations

import pytest

from tests.api.support import Api, job_spec, problem

TWO_BY_FOUR = {"workers": 2, "accelerators_per_worker": 4}


async def test_alternative_shapes_are_stored_with_the_spec(api: Api) -> None:
    token = await api.tenant("acme")
    spec = job_spec(accelerators_per_worker=8, alternative_shapes=[TWO_BY_FOUR])
    response = await api.submit(token, {**spec, "allow_unschedulable": True})
    assert response.status == 201, await response.text()
    job = await response.json()
    assert job["spec"]["alternative_shapes"] == [TWO_BY_FOUR]
    shown = await (await api.get(token, f"/v1/jobs/{job['id']}")).json()
    assert shown["spec"]["alternative_shapes"] == [TWO_BY_FOUR]
    # Omitted, there are none.
    plain = await (await api.submit(token, job_spec(name="plain"))).json()
    assert plain["spec"]["alternative_shapes"] == []


@pytest.mark.parametrize(
    ("alternatives", "name", "reason"),
    [
        ([{"workers": 2, "accelerators_per_worker": 2}], "$.alternative_shapes", "same total"),
        ([{"workers": 1, "accelerators_per_worker": 8}], "$.alternative_shapes", "repeats"),
        ([TWO_BY_FOUR] * 5, "$.alternative_shapes", "length <= 4"),
        ([{"workers": 0, "accelerators_per_worker": 8}], "$.alternative_shapes[0].workers", ">= 1"),
        ([{"worker": 2, "accelerators_per_worker": 4}], "$.alternative_shapes[0].worker", ""),
    ],
)
async def test_bad_alternative_shapes_are_problems_naming_the_field(
    api: Api, alternatives: list[dict[str, int]], name: str, reason: str
) -> None:
    token = await api.tenant("acme")
    spec = job_spec(accelerators_per_worker=8, alternative_shapes=alternatives)
    found = await problem(await api.submit(token, {**spec, "allow_unschedulable": True}), 422)
    assert [p["name"] for p in found["invalid_params"]] == [name]
    assert reason in found["invalid_params"][0]["reason"]
