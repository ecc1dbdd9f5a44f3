"""Fleet files: which simulated nodes to run, where, and how many.

```toml
seed = 7                       # optional: same seed, same fleet
[[group]]
name = "orin-nano-toronto"     # node ids are "<name>-<n>", n from 1
profile = "jetson-orin-nano"   # a key of sim_devices.profiles.PROFILES
count = 4
site = "edge"                  # cloud | edge
zone = "CA-ON"                 # grid zone (carbon and price signals)
region = "northamerica-northeast2"  # network region (latency matrix)
labels = { city = "toronto" }
```
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Annotated

import msgspec

from shared.errors import FieldError, dotted_path
from shared.messages import NodeTaint, Site
from shared.placement_names import placement_error
from shared.settings import ConfigError, read_toml_file
from shared.taints import parse_taint
from shared.topics import is_valid_node_id
from sim_devices.profiles import PROFILES, DeviceProfile


class FleetGroup(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    name: str
    profile: str
    count: Annotated[int, msgspec.Meta(ge=0)]
    site: Site
    zone: str
    region: str
    labels: dict[str, str] = {}
    taints: tuple[str, ...] = ()  # `key=value:Effect` (shared/taints.py)

    def __post_init__(self) -> None:
        for taint in self.taints:
            parse_taint(taint)  # a ValueError names the taint and what is wrong
        if self.profile not in PROFILES:
            known = ", ".join(sorted(PROFILES))
            raise ValueError(f"profile: unknown device profile {self.profile!r}; known: {known}")
        if not is_valid_node_id(f"{self.name}-{max(self.count, 1)}"):
            raise ValueError(f"name: {self.name!r} cannot prefix a node id")
        # What enrolment and every birth would refuse (cloud/fleet/plausibility.py), as
        # the agent's own settings do: `greenfed up` would fail enrolling the node.
        invalid = placement_error(self.zone, self.region, self.labels, prefix="")
        if invalid is not None:
            raise FieldError(*invalid)


class Fleet(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    seed: int = 0
    group: tuple[FleetGroup, ...]

    def __post_init__(self) -> None:
        names = [group.name for group in self.group]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ValueError(f"group: names must be unique, repeated: {', '.join(duplicates)}")

    @property
    def node_count(self) -> int:
        return sum(group.count for group in self.group)


@dataclass(frozen=True, slots=True)
class SimNodeSpec:
    node_id: str
    profile: DeviceProfile
    site: Site
    zone: str
    region: str
    labels: dict[str, str]
    taints: tuple[NodeTaint, ...] = ()


def load_fleet(path: Path | None = None) -> Fleet:
    """Read a fleet file; None reads the default fleet shipped with greenfed."""
    if path is None:
        shipped = resources.files("sim_devices").joinpath("fleets/default.toml")
        raw = tomllib.loads(shipped.read_text("utf-8"))
    else:
        raw = read_toml_file(path, "fleet file")
    source = _source(path)
    try:
        return msgspec.convert(raw, Fleet)
    except msgspec.ValidationError as error:
        refused = FieldError.from_msgspec(error)
        field = dotted_path(refused.path)
        raise ConfigError(
            f"{source}: {field}: {refused.reason}" if field else f"{source}: {refused.reason}"
        ) from None


def load_sized_fleet(path: Path | None, node_count: int | None) -> Fleet:
    """`load_fleet(path)` scaled to `node_count` nodes (`--sim N`); None: as it is."""
    fleet = load_fleet(path)
    if node_count is None:
        return fleet
    if fleet.node_count == 0:
        if node_count == 0:
            return fleet
        raise ConfigError(
            f"{_source(path)}: cannot scale to {node_count} nodes (--sim): the fleet has no nodes"
        )
    return scale_fleet(fleet, node_count)


def _source(path: Path | None) -> str:
    return "default fleet" if path is None else str(path)


def scale_fleet(fleet: Fleet, node_count: int) -> Fleet:
    """Resize every group in proportion (largest remainder) to `node_count` nodes in all.

    Each group keeps at least one node while there are enough nodes to go round,
    so a scaled fleet stays as heterogeneous as the original.
    """
    if node_count < 0:
        raise ValueError("node_count must be >= 0")
    groups = [group for group in fleet.group if group.count > 0]
    total = sum(group.count for group in groups)
    if total == 0:
        raise ValueError("cannot scale an empty fleet")
    shares = [node_count * group.count / total for group in groups]
    counts = [int(share) for share in shares]
    leftover = node_count - sum(counts)
    by_remainder = sorted(range(len(groups)), key=lambda i: (-(shares[i] - int(shares[i])), i))
    for index in by_remainder[:leftover]:
        counts[index] += 1
    if node_count >= len(groups):
        for index in range(len(groups)):
            if counts[index] == 0:
                donor = max(range(len(groups)), key=lambda i: (counts[i], -i))
                counts[donor] -= 1
                counts[index] = 1
    return msgspec.structs.replace(
        fleet,
        group=tuple(
            msgspec.structs.replace(group, count=count)
            for group, count in zip(groups, counts, strict=True)
        ),
    )


def expand_fleet(fleet: Fleet) -> list[SimNodeSpec]:
    specs = [
        SimNodeSpec(
            node_id=f"{group.name}-{number}",
            profile=PROFILES[group.profile],
            site=group.site,
            zone=group.zone,
            region=group.region,
            labels={**group.labels, "profile": group.profile},
            taints=tuple(
                NodeTaint(key=key, value=value, effect=effect)
                for key, value, effect in map(parse_taint, group.taints)
            ),
        )
        for group in fleet.group
        for number in range(1, group.count + 1)
    ]
    # Scaling can lengthen the numbers past what a group name leaves room for.
    invalid = [spec.node_id for spec in specs if not is_valid_node_id(spec.node_id)]
    if invalid:
        raise ConfigError(f"fleet: node id {invalid[0]!r} is not valid; shorten the group name")
    return specs
