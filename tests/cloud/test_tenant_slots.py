"""Slots bounded overall and per tenant (cloud/tenant_slots.py): a few busy tenants
never hold every slot while another tenant holds none."""

from __future__ import annotations

import contextlib

import pytest

from cloud.tenant_slots import TenantSlots


class Refused(Exception):
    def __init__(self, per_tenant: bool) -> None:
        super().__init__(per_tenant)
        self.per_tenant = per_tenant


def _take(slots: TenantSlots, stack: contextlib.ExitStack, tenant_id: str) -> None:
    stack.enter_context(slots.slot(tenant_id, Refused))


def test_a_tenant_is_held_to_its_share() -> None:
    slots = TenantSlots(most=10, most_per_tenant=2)
    with contextlib.ExitStack() as stack:
        _take(slots, stack, "a")
        _take(slots, stack, "a")
        with pytest.raises(Refused) as refused:
            _take(slots, stack, "a")
        assert refused.value.per_tenant
        assert slots.held == 2
    assert slots.held == 0


def test_two_busy_tenants_leave_a_slot_for_a_third() -> None:
    # The model uploads' bounds (cloud/models/checking.py): 4 in all, 2 per tenant.
    slots = TenantSlots(most=4, most_per_tenant=2)
    with contextlib.ExitStack() as stack:
        _take(slots, stack, "a")
        _take(slots, stack, "a")
        _take(slots, stack, "b")
        with pytest.raises(Refused) as refused:
            _take(slots, stack, "b")  # would take the last free slot while holding one
        assert refused.value.per_tenant
        _take(slots, stack, "c")  # a tenant holding none gets it
        assert slots.held == 4
        with pytest.raises(Refused) as full:
            _take(slots, stack, "d")
        assert not full.value.per_tenant  # every slot held, each holder has one
    assert slots.held == 0


def test_a_slot_is_given_back_when_its_work_fails() -> None:
    slots = TenantSlots(most=2, most_per_tenant=1)
    with pytest.raises(RuntimeError), slots.slot("a", Refused):
        raise RuntimeError("upload broke off")
    with contextlib.ExitStack() as stack:
        _take(slots, stack, "a")
        _take(slots, stack, "b")
        assert slots.held == 2
