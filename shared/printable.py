"""Text someone else wrote, as printable text: every control character replaced.

A node's words (a failure reason, a GPU model, a taint, a provider), a cluster's (a
Slurm pending reason, its last error) and a tenant's reach the control plane's store
and an admin's terminal. There, a control character is a command rather than text:
NUL is refused in PostgreSQL's text (a pass that writes a reason holding one fails,
and so does every pass after it), ESC and CSI (`\\x9b`) start terminal escape
sequences (move the cursor, erase a line, OSC 52 writes the clipboard, OSC 8 hides a
link), CR or a newline rewrites a line or forges the next one.

`printable` replaces each C0 control character (tab and newline included), DEL, each
C1 control character, and the Unicode characters that reorder or break what follows
them (the bidirectional embeddings, overrides and isolates, whose right-to-left
override makes `exe.txt` read as `txt.exe`, and the line and paragraph separators)
with U+FFFD, so what they were stays visible as such and nothing else changes.
Ingestion applies it once to the free text of every birth, report and event a node
sends (cloud/fleet/node_text.py); the CLI applies it again to whatever a node, a
cluster or a tenant wrote that it prints (greenfed/), since a view may hold text from
elsewhere (a cluster, an older control plane).
"""

from __future__ import annotations

import re
from typing import Final

REPLACEMENT: Final = "\ufffd"
# C0 (U+0000..U+001F), DEL (U+007F), C1 (U+0080..U+009F), the line and paragraph
# separators (U+2028, U+2029), the bidirectional embeddings and overrides
# (U+202A..U+202E) and isolates (U+2066..U+2069).
CONTROL_CHARACTERS: Final = "\x00-\x1f\x7f-\x9f\u2028-\u202e\u2066-\u2069"
_CONTROL: Final = re.compile(f"[{CONTROL_CHARACTERS}]")


def has_control(text: str) -> bool:
    """Whether `text` holds a control character (C0, DEL, C1, bidi, separators)."""
    return _CONTROL.search(text) is not None


def printable(text: str) -> str:
    """`text` with each control character (C0, DEL, C1, bidi, separators) replaced by
    U+FFFD; `text` itself when it holds none."""
    if _CONTROL.search(text) is None:
        return text
    return _CONTROL.sub(REPLACEMENT, text)
