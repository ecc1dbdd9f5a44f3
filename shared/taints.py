"""Node taints as people write them, Kubernetes-style: `key=value:Effect`.

`dedicated=inference:NoSchedule` fences a node off for work that tolerates
`dedicated=inference`; `PreferNoSchedule` only makes other work avoid it. The value
and the effect may be left out (`gpu-maintenance`, `team=risk`): the effect is then
`NoSchedule`.
"""

from __future__ import annotations

import re
from typing import Final, Literal, get_args

TaintEffect = Literal["NoSchedule", "PreferNoSchedule"]
TAINT_EFFECTS: Final[tuple[TaintEffect, ...]] = get_args(TaintEffect)
MAX_TAINT_KEY_CHARS: Final = 253
MAX_TAINT_VALUE_CHARS: Final = 253
MAX_TAINTS: Final = 64
# The taint of a cordoned node (cloud/fleet/node_overlay.py); no work may tolerate it.
CORDON_TAINT_KEY: Final = "greenfed.io/unschedulable"

_KEY = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._/-]*[A-Za-z0-9])?")


def parse_taint(text: str) -> tuple[str, str, TaintEffect]:
    """(key, value, effect) of `key[=value][:Effect]`; ValueError says what is wrong."""
    body, _, effect = text.strip().partition(":")
    if effect and effect not in TAINT_EFFECTS:
        raise ValueError(f"taint {text!r}: the effect must be one of {', '.join(TAINT_EFFECTS)}")
    key, _, value = body.partition("=")
    if not _KEY.fullmatch(key) or len(key) > MAX_TAINT_KEY_CHARS:
        raise ValueError(
            f"taint {text!r}: the key must be letters, digits, '.', '_', '-' or '/' "
            f"(at most {MAX_TAINT_KEY_CHARS}), starting and ending with a letter or digit"
        )
    if len(value) > MAX_TAINT_VALUE_CHARS or any(c in value for c in "=: \t\n"):
        raise ValueError(f"taint {text!r}: the value must hold no '=', ':' or spaces")
    return key, value, effect or "NoSchedule"
