"""`greenfed tokens` and `greenfed audit`: bearer tokens (a tenant's own; the admin's
anyone's, `--tenant`) and the admin's audit log, through `greenfed.api_client`.

People get tables (`-o wide`: with more columns); `-o json` and `-o yaml` print the API's
data (`greenfed.output`). A token's secret is printed once, when it is made, with a line
saying so.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Final

import msgspec
from rich.table import Table

from cloud.access.views import AuditList, TokenCreated, TokenList, TokenRotated, TokenView
from greenfed.api_client import ApiClient, path_segment
from greenfed.arguments import EXIT_OK
from greenfed.output import Output, emit
from greenfed.work_commands import ago, at_utc, console, get_and_show, plain

_SHOWN_ONCE: Final = "token (shown only now, keep it secret)"
_STATE_STYLE: Final = {"active": "green", "rotated": "yellow", "expired": "dim", "revoked": "red"}


def _tenant_params(tenant: str | None) -> dict[str, str]:
    return {} if tenant is None else {"tenant": tenant}


# `-o wide`: each of a token's times whole, and the token that replaced it.
TOKENS_WIDE: Final = (
    "created (UTC)", "last used (UTC)", "rotated (UTC)", "replaced by", "expires (UTC)",
    "revoked (UTC)",
)  # fmt: skip


def render_tokens(tokens: TokenList, output: Output) -> None:
    table = Table(title=f"tokens: {tokens.count}", title_justify="left")
    for column in ("id", "tenant", "name", "state", "created", "by", "last used", "until"):
        table.add_column(column, no_wrap=column in ("id", "state"))
    for column in TOKENS_WIDE if output.wide else ():
        table.add_column(column)
    for token in tokens.items:
        until = at_utc(token.revoked_at or token.expires_at)
        table.add_row(
            token.id,
            token.tenant,
            token.name,
            f"[{_STATE_STYLE.get(token.state, '')}]{token.state}[/]",
            ago(token.created_at),
            token.created_by or "",
            ago(token.last_used_at),
            until,
            *(
                (
                    at_utc(token.created_at),
                    at_utc(token.last_used_at),
                    at_utc(token.rotated_at),
                    token.replaced_by or "",
                    at_utc(token.expires_at),
                    at_utc(token.revoked_at),
                )
                if output.wide
                else ()
            ),
        )
    console(output.out, wide=output.wide).print(table)


async def list_tokens(client: ApiClient, *, tenant: str | None, output: Output) -> int:
    return await get_and_show(
        client,
        "/v1/tokens",
        TokenList,
        lambda tokens: render_tokens(tokens, output),
        output=output,
        params=_tenant_params(tenant),
    )


def _made(token: TokenView, secret: str) -> str:
    return (
        f"token {token.id} ({token.name}) of tenant {token.tenant} created\n"
        f"{_SHOWN_ONCE}: {secret}\n"
    )


async def create_token(client: ApiClient, name: str, *, tenant: str | None, output: Output) -> int:
    reply = await client.ask(
        "POST",
        "/v1/tokens",
        TokenCreated,
        params=_tenant_params(tenant),
        body=msgspec.json.encode({"name": name}),
    )
    created = reply.value
    emit(output, reply.payload, lambda: output.out.write(_made(created, created.token)))
    return EXIT_OK


async def rotate_token(
    client: ApiClient, token_id: str, *, overlap_s: float | None, output: Output
) -> int:
    body = None if overlap_s is None else msgspec.json.encode({"overlap_s": overlap_s})
    reply = await client.ask(
        "POST", f"/v1/tokens/{path_segment(token_id)}/rotate", TokenRotated, body=body
    )
    emit(output, reply.payload, lambda: output.out.write(_rotated_lines(reply.value)))
    return EXIT_OK


def _rotated_lines(rotated: TokenRotated) -> str:
    old = rotated.replaced
    until = f"until {at_utc(old.expires_at)}" if old.state == "rotated" else "no more (overlap 0)"
    return (
        f"token {old.id} ({old.name}) of tenant {old.tenant} rotated: it works {until}\n"
        f"replacement {rotated.token.id}\n{_SHOWN_ONCE}: {rotated.token.token}\n"
    )


async def revoke_token(client: ApiClient, token_id: str, *, output: Output) -> int:
    reply = await client.ask("DELETE", f"/v1/tokens/{path_segment(token_id)}", TokenView)

    def said() -> None:
        token = reply.value
        output.out.write(
            f"token {token.id} ({token.name}) of tenant {token.tenant} revoked at "
            f"{at_utc(token.revoked_at)}\n"
        )

    emit(output, reply.payload, said)
    return EXIT_OK


def _detail(detail: object) -> str:
    if not isinstance(detail, Mapping) or not detail:
        return ""
    return ", ".join(f"{key} {_change(value)}" for key, value in detail.items())


def _change(value: object) -> str:
    if isinstance(value, Mapping) and set(value) == {"from", "to"}:
        return f"{_value(value['from'])} → {_value(value['to'])}"
    return _value(value)


def _value(value: object) -> str:
    if value is None:
        return "none"
    if isinstance(value, Mapping):
        return ",".join(f"{k}={v}" for k, v in value.items()) or "{}"
    if isinstance(value, list):
        return ",".join(str(item) for item in value) or "[]"
    return str(value)


async def list_audit(
    client: ApiClient,
    *,
    since: datetime | None,
    actor: str | None,
    action: str | None,
    limit: int | None,
    cursor: str | None,
    output: Output,
) -> int:
    params = {
        key: value
        for key, value in (
            ("since", since.isoformat() if since else None),
            ("actor", actor),
            ("action", action),
            ("limit", None if limit is None else str(limit)),
            ("cursor", cursor),
        )
        if value is not None
    }
    return await get_and_show(
        client,
        "/v1/audit",
        AuditList,
        lambda entries: render_audit(entries, output),
        output=output,
        params=params,
    )


def render_audit(entries: AuditList, output: Output) -> None:
    """`wide`: each entry's sequence number (`seq`) too."""
    table = Table(title=f"audit: {entries.count}", title_justify="left")
    for column in ("at (UTC)", "actor", "action", "target", "detail"):
        table.add_column(column, overflow="fold" if column == "detail" else "ellipsis")
    if output.wide:
        table.add_column("seq", justify="right")
    for entry in entries.items:
        table.add_row(
            at_utc(entry.at),
            entry.actor,
            entry.action,
            entry.target,
            plain(_detail(msgspec.json.decode(entry.detail))),
            *((str(entry.seq),) if output.wide else ()),
        )
    console(output.out, wide=output.wide).print(table)
    if entries.next_cursor:
        console(output.out).print(f"more: --cursor {entries.next_cursor}")
