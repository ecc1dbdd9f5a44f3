"""The task indices of a job array, read from its `array` text (Slurm's `--array`).

`array = "0-99%10"` asks for tasks 0 to 99, at most 10 of them placed at once. The text
is comma-separated items, each an index (`7`), a range (`0-15`) or a range with a step
(`0-15:4`: 0, 4, 8, 12), then optionally `%N`, the throttle. Indices are whole numbers
from 0 to `MAX_ARRAY_INDEX`; an array has 1 to `MAX_ARRAY_TASKS` tasks, no index twice.

Pure and cheap: the spec checks it when decoded (a FieldError on `array` names what is
wrong), the API expands it into tasks, the scheduling loop reads the throttle.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from shared.errors import FieldError

# Each task is a job of its own (a row, events, an explanation): an array is capped so
# that one submission cannot flood the queue (Slurm's MaxArraySize plays that part).
MAX_ARRAY_TASKS: Final = 10_000
MAX_ARRAY_INDEX: Final = 999_999
MAX_ARRAY_TEXT: Final = 1024

# [0-9], not \d: \d takes every Unicode digit ("０-３", "٠-٣"), which int() reads too.
_ITEM: Final = re.compile(r"([0-9]{1,7})(?:-([0-9]{1,7})(?::([0-9]{1,7}))?)?")
_THROTTLE: Final = re.compile(r"[0-9]{1,7}")


@dataclass(frozen=True, slots=True)
class ArrayRange:
    """The tasks an `array` text asks for: their indices in ascending order, and at most
    how many may be placed at once (None: no limit)."""

    indices: tuple[int, ...]
    throttle: int | None

    @property
    def count(self) -> int:
        return len(self.indices)


def parse_array(text: str) -> ArrayRange:
    """The range `text` names, or a FieldError on `array` saying what is wrong."""
    if len(text) > MAX_ARRAY_TEXT:
        raise FieldError("array", f"has more than {MAX_ARRAY_TEXT} characters")
    ranges_text, percent, throttle_text = text.partition("%")
    throttle = None
    if percent:
        if _THROTTLE.fullmatch(throttle_text) is None:
            raise FieldError("array", f"{text!r}: the throttle after % is a whole number, e.g. %10")
        throttle = int(throttle_text)
        if throttle < 1:
            raise FieldError("array", f"{text!r}: the throttle %{throttle} must be at least 1")
    ranges: list[range] = []
    total = 0
    for item in ranges_text.split(","):
        matched = _ITEM.fullmatch(item)
        if matched is None:
            raise FieldError(
                "array",
                f"{text!r}: {item!r} is not an index, a range A-B or a stepped range A-B:S "
                "(e.g. 0-99%10, 1,3,5-7, 0-15:4)",
            )
        first = int(matched.group(1))
        last = first if matched.group(2) is None else int(matched.group(2))
        step = 1 if matched.group(3) is None else int(matched.group(3))
        if last > MAX_ARRAY_INDEX:
            raise FieldError("array", f"{text!r}: indices go from 0 to {MAX_ARRAY_INDEX}")
        if last < first:
            raise FieldError(
                "array", f"{text!r}: the range {item} is empty (it ends before it starts)"
            )
        if step < 1:
            raise FieldError("array", f"{text!r}: the step of {item} must be at least 1")
        span = range(first, last + 1, step)
        total += len(span)
        if total > MAX_ARRAY_TASKS:
            raise FieldError(
                "array", f"{text!r} asks for more than {MAX_ARRAY_TASKS} tasks, an array's most"
            )
        ranges.append(span)
    indices: set[int] = set()
    for span in ranges:
        for index in span:
            if index in indices:
                raise FieldError("array", f"{text!r} names task {index} twice")
            indices.add(index)
    return ArrayRange(indices=tuple(sorted(indices)), throttle=throttle)


def task_name(array_id: str, index: int) -> str:
    """How a person names one task: the array's id, an underscore, its index (Slurm's
    `JOBID_7`); REST paths and the CLI take it wherever they take a job's id."""
    return f"{array_id}_{index}"


_TASK_NAME: Final = re.compile(r"([0-7][0-9A-HJKMNP-TV-Z]{25})_([0-9]{1,7})")


def split_task_name(text: str) -> tuple[str, int] | None:
    """(array id, index) of a task's name, e.g. ``01J…_7``; None: not a task's name."""
    matched = _TASK_NAME.fullmatch(text)
    if matched is None:
        return None
    return matched.group(1), int(matched.group(2))
