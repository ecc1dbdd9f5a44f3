"""Fleet files: the shipped default fleet, validation, scaling and expansion to nodes."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.settings import ConfigError
from shared.topics import is_valid_node_id
from sim_devices.fleet import (
    Fleet,
    FleetGroup,
    expand_fleet,
    load_fleet,
    load_sized_fleet,
    scale_fleet,
)

DEFAULT_FLEET = load_fleet()

GROUP_TOML = """
[[group]]
name = "{name}"
profile = "{profile}"
count = {count}
site = "edge"
zone = "DE"
region = "europe-west3"
"""


def write_fleet(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "fleet.toml"
    path.write_text(text, encoding="utf-8")
    return path


def group(name: str, count: int, profile: str = "raspberry-pi-5") -> FleetGroup:
    return FleetGroup(
        name=name, profile=profile, count=count, site="edge", zone="DE", region="europe-west3"
    )


def counts(fleet: Fleet) -> list[int]:
    return [fleet_group.count for fleet_group in fleet.group]


def test_the_default_fleet_has_40_nodes() -> None:
    assert DEFAULT_FLEET.node_count == 40
    assert len(expand_fleet(DEFAULT_FLEET)) == 40


def test_the_default_fleet_spans_the_four_grid_zones_with_shipped_signals() -> None:
    zones = {node.zone for node in expand_fleet(DEFAULT_FLEET)}
    assert zones == {"CA-ON", "US-CAL-CISO", "DE", "ZA"}


def test_the_default_fleet_has_both_cloud_and_edge_nodes() -> None:
    sites = Counter(node.site for node in expand_fleet(DEFAULT_FLEET))
    assert set(sites) == {"cloud", "edge"}


def test_the_default_fleet_has_gpu_npu_and_cpu_only_nodes() -> None:
    nodes = expand_fleet(DEFAULT_FLEET)
    kinds = {accelerator.kind for node in nodes for accelerator in node.profile.accelerators}
    assert {"gpu", "npu"} <= kinds
    assert any(not node.profile.accelerators for node in nodes), "no CPU-only node"


def test_the_default_fleet_trains_in_the_cloud_on_gpus() -> None:
    for node in expand_fleet(DEFAULT_FLEET):
        if node.site == "cloud":
            assert {a.kind for a in node.profile.accelerators} == {"gpu"}, node.node_id


def test_a_fleet_file_is_read(tmp_path: Path) -> None:
    path = write_fleet(
        tmp_path,
        "seed = 7\n"
        + GROUP_TOML.format(name="pi", profile="raspberry-pi-5", count=2)
        + 'labels = { city = "frankfurt" }\n'
        + GROUP_TOML.format(name="t4", profile="t4-inference-server", count=1),
    )

    fleet = load_fleet(path)

    assert fleet.seed == 7
    assert [(g.name, g.profile, g.count) for g in fleet.group] == [
        ("pi", "raspberry-pi-5", 2),
        ("t4", "t4-inference-server", 1),
    ]
    assert fleet.group[0].labels == {"city": "frankfurt"}
    assert fleet.node_count == 3


def test_an_unknown_key_in_a_fleet_file_is_an_error_naming_it(tmp_path: Path) -> None:
    path = write_fleet(
        tmp_path, GROUP_TOML.format(name="pi", profile="raspberry-pi-5", count=2) + "cout = 3\n"
    )
    with pytest.raises(ConfigError, match="cout") as caught:
        load_fleet(path)
    assert str(path) in str(caught.value)


def test_an_unknown_profile_is_an_error_naming_it(tmp_path: Path) -> None:
    path = write_fleet(tmp_path, GROUP_TOML.format(name="pi", profile="jetson-nano-9000", count=1))
    with pytest.raises(ConfigError, match="jetson-nano-9000"):
        load_fleet(path)


def test_duplicate_group_names_are_an_error_naming_the_duplicate(tmp_path: Path) -> None:
    path = write_fleet(
        tmp_path,
        GROUP_TOML.format(name="pi", profile="raspberry-pi-5", count=1)
        + GROUP_TOML.format(name="pi", profile="raspberry-pi-5", count=2)
        + GROUP_TOML.format(name="t4", profile="t4-inference-server", count=1),
    )
    with pytest.raises(ConfigError, match=r"repeated: pi$"):
        load_fleet(path)


def test_a_group_name_that_cannot_prefix_a_node_id_is_an_error(tmp_path: Path) -> None:
    path = write_fleet(
        tmp_path, GROUP_TOML.format(name="pi/frankfurt", profile="raspberry-pi-5", count=1)
    )
    with pytest.raises(ConfigError, match="pi/frankfurt"):
        load_fleet(path)


def test_a_negative_count_is_an_error(tmp_path: Path) -> None:
    path = write_fleet(tmp_path, GROUP_TOML.format(name="pi", profile="raspberry-pi-5", count=-1))
    with pytest.raises(ConfigError, match="count"):
        load_fleet(path)


def test_a_missing_fleet_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_fleet(tmp_path / "nope.toml")


def test_a_fleet_file_that_is_not_toml_is_a_clear_error(tmp_path: Path) -> None:
    path = write_fleet(tmp_path, "[[group]\nname =")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_fleet(path)


def test_a_fleet_file_that_is_not_utf8_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "fleet.toml"
    path.write_bytes(b"\xff\xfe[[group]]\n")  # UTF-16, as some editors save
    with pytest.raises(ConfigError) as caught:
        load_fleet(path)
    assert (
        str(caught.value) == f"fleet file {path} is not UTF-8 text (line 1): TOML files are UTF-8"
    )


def test_a_directory_as_the_fleet_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        load_fleet(tmp_path)
    assert str(caught.value) == f"fleet file {tmp_path} cannot be read: Is a directory"


@pytest.mark.parametrize(
    ("placement", "field"),
    [
        ('labels = { "bad key!" = "x" }', "group[0].labels"),
        ('labels = { city = "=1+1" }', "group[0].labels.city"),
    ],
)
def test_labels_the_control_plane_would_refuse_are_an_error_naming_the_file_and_field(
    tmp_path: Path, placement: str, field: str
) -> None:
    # Enrolment and births refuse them (shared/placement_names.py): `greenfed up` used to
    # fail enrolling the node with a traceback.
    path = write_fleet(
        tmp_path, GROUP_TOML.format(name="pi", profile="raspberry-pi-5", count=1) + placement
    )
    with pytest.raises(ConfigError) as caught:
        load_fleet(path)
    assert str(caught.value).startswith(f"{path}: {field}: label ")


@pytest.mark.parametrize("field", ["zone", "region"])
def test_a_zone_or_region_the_control_plane_would_refuse_is_an_error_naming_it(
    tmp_path: Path, field: str
) -> None:
    text = GROUP_TOML.format(name="pi", profile="raspberry-pi-5", count=1)
    text = text.replace(f'{field} = "', f'{field} = "-')  # must start with a letter or digit
    path = write_fleet(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        load_fleet(path)
    assert str(caught.value).startswith(f"{path}: group[0].{field}: ")


@pytest.mark.parametrize(
    "text", ["group = []\n", GROUP_TOML.format(name="pi", profile="raspberry-pi-5", count=0)]
)
def test_scaling_a_fleet_file_without_nodes_is_an_error_naming_the_file(
    tmp_path: Path, text: str
) -> None:
    path = write_fleet(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        load_sized_fleet(path, 3)
    assert str(caught.value) == f"{path}: cannot scale to 3 nodes (--sim): the fleet has no nodes"


def test_a_sized_fleet_is_the_file_scaled_or_as_it_is() -> None:
    assert load_sized_fleet(None, None) == DEFAULT_FLEET
    assert load_sized_fleet(None, 7) == scale_fleet(DEFAULT_FLEET, 7)


@given(node_count=st.integers(min_value=0, max_value=2000))
def test_scaling_the_default_fleet_gives_exactly_the_requested_total(node_count: int) -> None:
    scaled = scale_fleet(DEFAULT_FLEET, node_count)
    assert scaled.node_count == node_count
    assert len(expand_fleet(scaled)) == node_count
    assert all(fleet_group.count >= 0 for fleet_group in scaled.group)


FLEET_COUNTS = st.lists(st.integers(min_value=0, max_value=50), min_size=1, max_size=12).filter(
    lambda group_counts: sum(group_counts) > 0
)


@given(group_counts=FLEET_COUNTS, node_count=st.integers(min_value=0, max_value=500))
def test_scaling_any_fleet_gives_exactly_the_requested_total(
    group_counts: list[int], node_count: int
) -> None:
    fleet = Fleet(group=tuple(group(f"g{i}", count) for i, count in enumerate(group_counts)))
    assert scale_fleet(fleet, node_count).node_count == node_count


@given(group_counts=FLEET_COUNTS, extra=st.integers(min_value=0, max_value=500))
def test_every_group_keeps_a_node_while_there_are_enough_to_go_round(
    group_counts: list[int], extra: int
) -> None:
    fleet = Fleet(group=tuple(group(f"g{i}", count) for i, count in enumerate(group_counts)))
    populated = sum(1 for count in group_counts if count > 0)
    scaled = scale_fleet(fleet, populated + extra)
    assert len(scaled.group) == populated
    assert all(fleet_group.count >= 1 for fleet_group in scaled.group)


@given(group_counts=FLEET_COUNTS, factor=st.integers(min_value=1, max_value=20))
def test_scaling_by_a_whole_factor_multiplies_every_group(
    group_counts: list[int], factor: int
) -> None:
    fleet = Fleet(group=tuple(group(f"g{i}", count) for i, count in enumerate(group_counts)))
    scaled = scale_fleet(fleet, factor * fleet.node_count)
    assert counts(scaled) == [factor * count for count in group_counts if count > 0]


@given(node_count=st.integers(min_value=40, max_value=5000))
def test_scaling_keeps_each_groups_share_to_within_one_node(node_count: int) -> None:
    # The default fleet's smallest group has 1 of 40 nodes, so from 40 nodes up
    # no group needs topping up and each count is its share rounded up or down.
    scaled = scale_fleet(DEFAULT_FLEET, node_count)
    for original, resized in zip(DEFAULT_FLEET.group, scaled.group, strict=True):
        share = node_count * original.count / DEFAULT_FLEET.node_count
        assert abs(resized.count - share) < 1, original.name


def test_scaling_to_the_original_total_returns_the_original_counts() -> None:
    assert counts(scale_fleet(DEFAULT_FLEET, DEFAULT_FLEET.node_count)) == counts(DEFAULT_FLEET)


def test_scaling_keeps_every_groups_profile_zone_and_labels() -> None:
    scaled = scale_fleet(DEFAULT_FLEET, 400)
    for original, resized in zip(DEFAULT_FLEET.group, scaled.group, strict=True):
        assert (resized.name, resized.profile, resized.site, resized.zone, resized.region) == (
            original.name,
            original.profile,
            original.site,
            original.zone,
            original.region,
        )
        assert resized.labels == original.labels
    assert scaled.seed == DEFAULT_FLEET.seed


def test_scaling_below_the_number_of_groups_still_gives_the_total() -> None:
    scaled = scale_fleet(DEFAULT_FLEET, 3)
    assert scaled.node_count == 3
    assert sum(1 for fleet_group in scaled.group if fleet_group.count) == 3


def test_scaling_to_a_negative_total_or_an_empty_fleet_is_refused() -> None:
    with pytest.raises(ValueError, match="node_count"):
        scale_fleet(DEFAULT_FLEET, -1)
    with pytest.raises(ValueError, match="empty"):
        scale_fleet(Fleet(group=(group("g", 0),)), 10)


def test_expanded_nodes_have_unique_valid_ids_numbered_from_one() -> None:
    nodes = expand_fleet(DEFAULT_FLEET)
    ids = [node.node_id for node in nodes]
    assert len(set(ids)) == len(ids)
    assert all(is_valid_node_id(node_id) for node_id in ids)
    first = DEFAULT_FLEET.group[0]
    assert ids[: first.count] == [f"{first.name}-{n}" for n in range(1, first.count + 1)]


@given(node_count=st.integers(min_value=0, max_value=1500))
def test_a_scaled_fleet_expands_to_unique_valid_ids(node_count: int) -> None:
    ids = [node.node_id for node in expand_fleet(scale_fleet(DEFAULT_FLEET, node_count))]
    assert len(set(ids)) == len(ids) == node_count
    assert all(is_valid_node_id(node_id) for node_id in ids)


def test_groups_whose_names_share_a_prefix_still_get_unique_ids() -> None:
    fleet = Fleet(group=(group("pi", 12), group("pi-1", 3)))
    ids = [node.node_id for node in expand_fleet(fleet)]
    assert len(set(ids)) == len(ids) == 15


def test_expanded_nodes_carry_their_groups_placement_and_profile_label() -> None:
    (node,) = expand_fleet(Fleet(group=(group("pi", 1),)))
    assert (node.site, node.zone, node.region) == ("edge", "DE", "europe-west3")
    assert node.profile.name == "raspberry-pi-5"
    assert node.labels == {"profile": "raspberry-pi-5"}


def test_a_group_whose_node_ids_would_be_too_long_is_refused_or_expands_to_valid_ids() -> None:
    long_name = "n" * 126
    try:
        fleet = Fleet(group=(group(long_name, 10),))
    except (ValueError, ConfigError):
        return  # refused up front: fine
    assert all(is_valid_node_id(node.node_id) for node in expand_fleet(fleet))
