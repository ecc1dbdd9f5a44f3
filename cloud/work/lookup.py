"""Which work a reference means: a full id, a name, or a unique prefix of an id.

Wherever an id is taken (REST path parameters, and through them every CLI command),
a person may type what they know instead:

1. a full id (26 characters) is that work, as always;
2. a name: the work of that name that has not ended; with none, the newest that has
   (names are reused run after run, like a Slurm job name); two or more not ended are
   ambiguous, unless they are all tasks of one job array: an array's name names the
   array (`array_named`), as its id does. The store counts each array once
   (`select_live_named`), so an array of many tasks is one match, never all of them;
3. otherwise a prefix of an id (at least `MIN_PREFIX` characters, any case): the one
   work whose id starts with it.

Nothing matching is not found (404); several are ambiguous (409, listing them). The
candidates are read by the API (cloud/api/references.py) from
cloud/store/work_lookup.py; this module only decides.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import msgspec

from cloud.store import TERMINAL_STATES, WorkRecord
from cloud.store.work_lookup import NamedArray

# ULIDs: 26 characters of Crockford base 32 (no I, L, O or U).
FULL_ID: Final = re.compile(r"[0-7][0-9A-HJKMNP-TV-Z]{25}")
MIN_PREFIX: Final = 4  # shorter would match most recent work: ids start with their time
_ID_PREFIX: Final = re.compile(r"[0-9A-HJKMNP-TV-Z]{4,26}")  # a whole id in lower case too
SHOWN_CANDIDATES: Final = 10


@dataclass(frozen=True, slots=True)
class Ambiguous:
    """The reference matches each of these (newest first, at most SHOWN_CANDIDATES of
    both together): work, and job arrays (a name's, each as one)."""

    reference: str
    by: str  # "name" or "id prefix"
    candidates: tuple[WorkRecord, ...]
    arrays: tuple[NamedArray, ...] = ()


def is_full_id(reference: str) -> bool:
    return FULL_ID.fullmatch(reference) is not None


def as_id_prefix(reference: str) -> str | None:
    """The reference as the start of an id (upper case), or None when no id starts so."""
    upper = reference.upper()
    return upper if _ID_PREFIX.fullmatch(upper) else None


def by_name(
    reference: str,
    active: Sequence[WorkRecord],
    newest: Sequence[WorkRecord],
    arrays: Sequence[NamedArray] = (),
) -> WorkRecord | Ambiguous | None:
    """`active`: the matches not ended that are no job array's task; `arrays`: the job
    arrays with tasks of the name not ended; `newest`: the newest match of all (ended or
    not). One live job array alone is `array_named`'s, not this (None)."""
    live = [record for record in active if record.state not in TERMINAL_STATES]
    if len(live) + len(arrays) > 1:
        shown = live[:SHOWN_CANDIDATES]
        return Ambiguous(
            reference, "name", tuple(shown), tuple(arrays[: SHOWN_CANDIDATES - len(shown)])
        )
    if live:
        return live[0]
    if arrays:
        return None
    return newest[0] if newest else None


def by_prefix(reference: str, matches: Sequence[WorkRecord]) -> WorkRecord | Ambiguous | None:
    if len(matches) == 1:
        return matches[0]
    if matches:
        return Ambiguous(reference, "id prefix", tuple(matches[:SHOWN_CANDIDATES]))
    return None


class _ArrayId(msgspec.Struct, frozen=True):
    array_id: str


class _ArrayMark(msgspec.Struct, frozen=True):
    """The one field of a stored training spec that says which array it is a task of."""

    array_task: _ArrayId | None = None


_ARRAY_MARK: Final = msgspec.json.Decoder(_ArrayMark)


def array_named(
    active: Sequence[WorkRecord], arrays: Sequence[NamedArray], newest: Sequence[WorkRecord]
) -> str | None:
    """The job array a name (`by_name`'s matches) names, or None: a person who names an
    array means the array, not one of its tasks. With live work of the name, the one
    array of it when nothing else of the name is live; with none, the array of the
    newest task of the name."""
    if active or arrays:
        return arrays[0].array_id if len(arrays) == 1 and not active else None
    if not newest or newest[0].kind != "training":
        return None
    try:
        mark = _ARRAY_MARK.decode(newest[0].spec).array_task
    except msgspec.DecodeError:
        return None  # a corrupt spec: the reference is left to the route to refuse
    return None if mark is None else mark.array_id
