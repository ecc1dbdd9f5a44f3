"""RFC 9457 problem details: the body of every REST API error
(`application/problem+json`). The API builds it (cloud/api/problems.py); the CLI
decodes it."""

from __future__ import annotations

from typing import Final

import msgspec

PROBLEM_CONTENT_TYPE: Final = "application/problem+json"


class InvalidParam(msgspec.Struct, frozen=True):
    name: str
    reason: str


class ProblemBody(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    type: str
    title: str
    status: int
    detail: str = ""
    instance: str = ""
    invalid_params: tuple[InvalidParam, ...] = ()


# What confirms an admin's bulk destructive action past the per-minute limit (the 428
# problem, cloud/api/bulk_actions.py; the CLI's --confirm-bulk).
CONFIRM_HEADER: Final = "Greenfed-Confirm"
CONFIRM_VALUE: Final = "bulk"
