"""What a user reads of a work item's usage (cloud/usage/views.py): amounts in different
currencies are never summed, for the work item nor for one of its members."""

from __future__ import annotations

from cloud.store import UsageHour
from cloud.usage.views import usage_summary

HOUR_S = 3600.0
T0 = 1_800_000_000.0 - 1_800_000_000.0 % HOUR_S


def hour(start_s: float, cost: float, currency: str, *, member_index: int = 0) -> UsageHour:
    return UsageHour(
        work_id="job-1", member_index=member_index, node_id=f"n{member_index}",
        hour_start=start_s, tenant_id="t1", work_kind="training", zone="DE",
        accelerator_kind="gpu", energy_j=3.6e6, measured_j=3.6e6, gap_s=0.0, gco2_g=400.0,
        cost=cost, currency=currency, counterfactual_gco2_g=None,
        fallback=currency != "EUR",
    )  # fmt: skip


def test_a_member_priced_in_two_currencies_keeps_them_apart() -> None:
    # DE's prices were lost for the second hour: the static table's dollars priced it.
    usage = usage_summary([hour(T0, 0.10, "EUR"), hour(T0 + HOUR_S, 5.00, "USD")])
    (member,) = usage.members
    assert member.costs == {"EUR": 0.10, "USD": 5.00}
    assert (member.cost, member.currency) == (None, None)
    assert member.energy_kwh == 2.0
    assert usage.costs == member.costs
    assert (usage.cost, usage.currency) == (None, None)


def test_a_member_priced_in_one_currency_has_its_cost_in_it() -> None:
    usage = usage_summary(
        [
            hour(T0, 0.10, "EUR"),
            hour(T0 + HOUR_S, 0.20, "EUR"),
            hour(T0, 5.00, "USD", member_index=1),  # another member's currency
        ]
    )
    first, second = usage.members
    assert (first.cost, first.currency, first.costs) == (0.10 + 0.20, "EUR", {"EUR": 0.10 + 0.20})
    assert (second.cost, second.currency, second.costs) == (5.00, "USD", {"USD": 5.00})
    assert (usage.cost, usage.currency) == (None, None)
    assert usage.costs == {"EUR": 0.10 + 0.20, "USD": 5.00}
