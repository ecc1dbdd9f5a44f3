"""Published JSON Schemas whose patterns every validator compiles.

greenfed's Structs hold strings to Python patterns ending `$(?!\\n)`: Python's `$` also
matches before a final newline, which the lookahead refuses. JSON Schema's patterns
are ECMA-262 regular expressions, where `$` (no multiline flag) matches only at the
very end, so `$` alone says the same there; and RE2-based validators (Go's, Rust's,
google-re2) refuse every lookaround and read no `\\u` escape. What greenfed
publishes (`GET /v1/schemas`, `greenfed schema`, `/openapi.json`) has the portable form;
the Structs keep theirs."""

from __future__ import annotations

from typing import Any, Final

_PYTHON_END: Final = "$(?!\\n)"


def portable_pattern(pattern: str) -> str:
    r"""The pattern as ECMA-262 and RE2 read it alike: `$` for `$(?!\n)`, and `\uXXXX`
    escapes (Python's and ECMA's, not RE2's) as `\xXX` or the character itself."""
    out: list[str] = []
    index = 0
    while index < len(pattern):
        char = pattern[index]
        if char != "\\" or index + 1 >= len(pattern):
            out.append(char)
            index += 1
            continue
        escape = pattern[index : index + 6]
        if escape[1] == "u" and len(escape) == 6 and _is_hex(escape[2:]):
            code = int(escape[2:], 16)
            out.append(f"\\x{code:02x}" if code <= 0xFF else chr(code))
            index += 6
            continue
        out.append(pattern[index : index + 2])  # any other escape, kept whole
        index += 2
    return "".join(out).replace(_PYTHON_END, "$")


def _is_hex(text: str) -> bool:
    return all(char in "0123456789abcdefABCDEF" for char in text)


def portable(node: Any) -> Any:
    """`node` (a schema, or any part of one) with its patterns in the portable form."""
    if isinstance(node, dict):
        out: dict[str, Any] = {}
        for key, value in node.items():
            if key == "pattern" and isinstance(value, str):
                out[key] = portable_pattern(value)
            elif key == "patternProperties" and isinstance(value, dict):
                out[key] = {portable_pattern(k): portable(v) for k, v in value.items()}
            else:
                out[key] = portable(value)
        return out
    if isinstance(node, list):
        return [portable(item) for item in node]
    return node
