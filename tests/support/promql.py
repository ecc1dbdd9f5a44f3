"""What a PromQL expression reads: the metric names it selects, the labels its selectors
match on and those its groupings keep (for the alert-rule and dashboard checks).

A tokenizer, not a parser: string literals are hidden first, then selectors, ranges,
offsets and label lists; what is left that is neither a function call, an aggregation
nor a keyword is a metric name.
"""

from __future__ import annotations

import re

_STRING = re.compile(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_NAME_MATCHER = re.compile(r"__name__\s*(=~|!=|!~|=)\s*\x00(\d+)\x00")
_RANGE = re.compile(r"\[[^\[\]]*\]")
_OFFSET = re.compile(r"\boffset\s+-?[0-9smhdwy]+|@\s*(?:[0-9.]+|start\(\)|end\(\))")
_LABEL_LIST = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_TOKEN = re.compile(
    r"(?P<number>0[xX][0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)"
    r"|(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(?P<call>\s*\()?"
)
# Words that are not metric names where they stand without a "(" after them.
_KEYWORDS = frozenset(
    {
        "and", "or", "unless", "atan2", "bool", "offset", "inf", "nan",
        "by", "without", "on", "ignoring", "group_left", "group_right",
        "sum", "min", "max", "avg", "group", "stddev", "stdvar", "count",
        "count_values", "bottomk", "topk", "quantile", "limitk", "limit_ratio",
    }
)  # fmt: skip


def _hide_strings(promql: str) -> tuple[str, list[str]]:
    """`promql` with each string literal replaced by a NUL-quoted index into the list."""
    strings: list[str] = []

    def hide(match: re.Match[str]) -> str:
        strings.append(match.group(0))
        return f"\x00{len(strings) - 1}\x00"

    return _STRING.sub(hide, promql), strings


def metric_names(promql: str) -> set[str]:
    """The metric names a (variable-free) PromQL expression selects: identifiers that are
    neither functions, aggregations, keywords, label names nor inside strings."""
    text, strings = _hide_strings(promql)
    names: set[str] = set()
    for matchers in _MATCHERS.findall(text):
        for operator, index in _NAME_MATCHER.findall(matchers):
            assert operator == "=", f'{promql!r}: only __name__="..." is understood here'
            names.add(strings[int(index)][1:-1])
    text = _MATCHERS.sub(" ", text)
    text = _RANGE.sub(" ", text)
    text = _OFFSET.sub(" ", text)
    text = _LABEL_LIST.sub(" ", text)
    text = re.sub(r"\x00\d+\x00", " ", text)
    for token in _TOKEN.finditer(text):
        name = token.group("name")
        if name is None or token.group("call") is not None:
            continue
        if name.lower() not in _KEYWORDS:
            names.add(name)
    return names


_SELECTOR = re.compile(r"(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)\s*\{(?P<matchers>[^{}]*)\}")
_MATCHER_LABEL = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)")


_GROUPING = re.compile(r"\b(?:by|on|group_left|group_right)\s*\((?P<labels>[^()]*)\)")


def grouping_labels(promql: str) -> set[str]:
    """The labels `by`, `on` and `group_left/right` name: the result keeps them, so the
    metrics underneath must carry them."""
    text, _ = _hide_strings(promql)
    return {
        label.strip()
        for grouping in _GROUPING.finditer(text)
        for label in grouping.group("labels").split(",")
        if label.strip()
    }


def matched_labels(promql: str) -> dict[str, set[str]]:
    """Metric name -> the label names its selectors match on (`name{label=...}`)."""
    text, _ = _hide_strings(promql)
    matched: dict[str, set[str]] = {}
    for selector in _SELECTOR.finditer(text):
        labels = set(_MATCHER_LABEL.findall(selector.group("matchers"))) - {"__name__"}
        matched.setdefault(selector.group("name"), set()).update(labels)
    return matched
