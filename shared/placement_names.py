"""What a node's zone, region and labels may look like: one grammar for the agent's
settings, enrolment (cloud/fleet/enrolment_views.py) and births (cloud/fleet/
plausibility.py), so that a value one part accepts no other refuses.

A zone or region names a grid zone or a network region (`CA-ON`, `US-CAL-CISO`,
`eu-west-1`): letters, digits and `. _ : / -`, starting and ending with a letter or
digit. A label key is as Kubernetes' (`greenfed.io/timezone`); a label value is any
printable text that does not start like a spreadsheet formula or with a space (`= + -
@`, tab, CR: OWASP's CSV-injection list), so that a node's own words cannot turn into
a formula in a CSV export or a control sequence in a terminal.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final

MAX_PLACEMENT_CHARS: Final = 128
MAX_LABEL_KEY_CHARS: Final = 63
MAX_LABEL_VALUE_CHARS: Final = 256

# `$(?!\n)`: Python's `$` would also match before a trailing newline.
ZONE_PATTERN: Final = (
    rf"^([A-Za-z0-9]([A-Za-z0-9._:/-]{{0,{MAX_PLACEMENT_CHARS - 2}}}[A-Za-z0-9])?)?$(?!\n)"
)
LABEL_KEY_PATTERN: Final = (
    rf"^[A-Za-z0-9]([A-Za-z0-9._/-]{{0,{MAX_LABEL_KEY_CHARS - 2}}}[A-Za-z0-9])?$(?!\n)"
)
# Printable: no C0/C1 controls, DEL, or Unicode line and paragraph separators.
LABEL_VALUE_PATTERN: Final = (
    r"^([^=+\-@\s\x00-\x1f\x7f-\x9f\u2028\u2029]"
    rf"[^\x00-\x1f\x7f-\x9f\u2028\u2029]{{0,{MAX_LABEL_VALUE_CHARS - 1}}})?$(?!\n)"
)

_ZONE: Final = re.compile(ZONE_PATTERN)
_LABEL_KEY: Final = re.compile(LABEL_KEY_PATTERN)
_LABEL_VALUE: Final = re.compile(LABEL_VALUE_PATTERN)


# The cluster a registered cluster's node belongs to: declared by the control plane's
# bridge only (cloud/clusters/bridge.py). A node's own placement may not hold it (agent
# settings, births: `placement_error`), for a node of a cluster registered with
# accepts_secrets is sealed secrets at isolation "none" (cloud/fleet/secret_receivers.py).
CLUSTER_LABEL: Final = "greenfed.io/cluster"


def placement_error(
    zone: str, region: str, labels: Mapping[str, str], *, prefix: str = "$."
) -> tuple[str, str] | None:
    """(the field at fault, what is wrong with it) or None when all are valid; the field
    as a JSON path under `prefix`."""
    for name, value in (("zone", zone), ("region", region)):
        if _ZONE.match(value) is None:
            return (
                f"{prefix}{name}",
                f"{value[:60]!r} is not a zone or region name: letters, digits and . _ : / -, "
                f"at most {MAX_PLACEMENT_CHARS} characters, starting and ending with a "
                "letter or digit",
            )
    if CLUSTER_LABEL in labels:
        return (
            f"{prefix}labels.{CLUSTER_LABEL}",
            "reserved for the nodes of the clusters greenfed registers: a node may not declare it",
        )
    return label_error(labels, prefix=prefix)


def label_error(labels: Mapping[str, str], *, prefix: str = "$.") -> tuple[str, str] | None:
    """(the field at fault, what is wrong with it) or None when every label is valid."""
    for key, value in labels.items():
        if _LABEL_KEY.match(key) is None:
            return (
                f"{prefix}labels",
                f"label key {key[:60]!r}: letters, digits and . _ / -, at most "
                f"{MAX_LABEL_KEY_CHARS} characters, starting and ending with a letter or digit",
            )
        if _LABEL_VALUE.match(value) is None:
            return (
                f"{prefix}labels.{key}",
                f"label value {value[:60]!r}: printable text of at most "
                f"{MAX_LABEL_VALUE_CHARS} characters, not starting with = + - @ or a space",
            )
    return None
