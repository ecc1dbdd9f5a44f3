"""`greenfed load`: the rate curves and the requests' inputs."""

from __future__ import annotations

import pytest

from cloud.models.views import TensorView
from greenfed.load_commands import parse_curve, sample_inputs


def test_constant_ramp_and_diurnal_rates() -> None:
    assert parse_curve("200", 60)(30) == 200
    ramp = parse_curve("ramp:50-400", 70)
    assert [ramp(0), ramp(35), ramp(70), ramp(90)] == [50, 225, 400, 400]
    day = parse_curve("diurnal:500-2000", 120, period_s=24)
    assert day(0) == pytest.approx(500)
    assert day(12) == pytest.approx(2000)  # midday
    assert day(24) == pytest.approx(500)  # the next night
    assert 500 < day(6) < 2000


@pytest.mark.parametrize("text", ["fast", "ramp:50", "200-300", "sine:1-2", "-5"])
def test_a_bad_curve_says_which_forms_are_known(text: str) -> None:
    with pytest.raises(ValueError, match=r"ramp:50-400|needs two rates|one number"):
        parse_curve(text, 60)


def test_inputs_are_zeros_of_the_models_shape_with_symbolic_sizes_as_one() -> None:
    inputs = sample_inputs((TensorView(name="x", dtype="float32", shape=("batch", 4)),))
    assert inputs == {"x": [[0, 0, 0, 0]]}
