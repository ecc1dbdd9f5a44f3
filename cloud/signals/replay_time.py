"""One "now" for a replayed trace: its grid retold on the clock the scheduler plans by.

A chain that replays a recorded year reads the trace at the wall clock's date and
time in that year (`units.replay_clock`), but the scheduling loop, deadlines,
`not_before` and explanations all run on the wall clock. A grid told in the
trace's year next to a queue told in this year puts every forecast hour years in
the past of the loop's "now": temporal shifting then sees no cleaner hour ahead
and never defers. So the service hands out its grid on the planning clock: every
series moves by the replay offset (a whole number of hours, so hour boundaries
stay hour boundaries) and `now_s` becomes the planning clock's now. The values
are the recorded ones; only the labels of the hours change. Accounting, the
loop's policy and `/v1/signals` all read this one grid, so they agree on "now".
"""

from __future__ import annotations

import dataclasses

from cloud.signals.grid import HOUR_S, GridSignals


def replay_offset_s(planning_now_s: float, signals_now_s: float) -> float:
    """The planning clock minus the signals' clock, rounded to whole hours: the two
    clocks are read a moment apart, and a replay maps the time of day unchanged."""
    return round((planning_now_s - signals_now_s) / HOUR_S) * HOUR_S


def retold(grid: GridSignals, offset_s: float) -> GridSignals:
    """The same grid with every instant moved by `offset_s` (the grid itself when 0)."""
    if offset_s == 0.0:
        return grid
    return GridSignals(
        now_s=grid.now_s + offset_s,
        zones={
            zone: dataclasses.replace(series, start_s=series.start_s + offset_s)
            for zone, series in grid.zones.items()
        },
    )
