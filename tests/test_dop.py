"""The DOP controller: slow start, multiplicative back-off on a loss, binary increase after it."""

import random

import pytest

from measure.dop import DopController, relative_error


def test_grows_from_one_while_accurate_and_stops_at_the_ceiling():
    controller = DopController(max_dop=8)
    assert controller.dop == 1 and controller.to_check(10, random.Random(0)) == []
    dops = []
    for _ in range(5):
        dops.append(controller.dop)
        controller.update(errors=[0.01] if controller.dop > 1 else [])
    assert dops == [1, 2, 4, 8, 8]
    assert controller.decisions[-1].reason.startswith("hold: at the ceiling")


def test_a_loss_halves_and_growth_then_searches_towards_where_it_happened():
    controller = DopController(max_dop=64, dop=16)
    decision = controller.update(errors=[0.02, 0.09])
    assert decision.next_dop == 8 and "9.0% > 5%" in decision.reason and controller.loss_dop == 16
    controller.update(errors=[0.01])
    assert controller.dop == 12  # half-way back to 16
    controller.update(errors=[0.01])
    assert controller.dop == 14
    controller.update(errors=[0.01])
    assert controller.dop == 15
    controller.update(errors=[0.01])
    assert controller.dop == 16  # probing past the last loss one at a time
    controller.update(errors=[0.01])
    assert controller.dop == 17


def test_failures_only_in_parallel_are_a_loss():
    controller = DopController(max_dop=8, dop=4)
    decision = controller.update(errors=[0.0], parallel_only_failures=1)
    assert decision.next_dop == 2 and "failed in parallel" in decision.reason


def test_persistent_errors_settle_at_one():
    controller = DopController(max_dop=16, dop=16)
    for _ in range(6):
        controller.update(errors=[0.2] if controller.dop > 1 else [])
        if controller.dop == 1:
            break
    assert controller.dop == 1
    assert [d.dop for d in controller.decisions] == [16, 8, 4, 2]


def test_a_sample_of_each_parallel_batch_is_checked():
    controller = DopController(max_dop=8, dop=4, check_fraction=0.2)
    checked = controller.to_check(12, random.Random(0))
    assert len(checked) == 3 and len(set(checked)) == 3 and all(0 <= i < 12 for i in checked)
    assert len(controller.to_check(2, random.Random(0))) == 1  # never none in a parallel batch


def test_every_decision_is_kept_for_plots():
    controller = DopController(max_dop=4)
    controller.update([])
    controller.update([0.5, 0.01])
    rows = [d.as_dict() for d in controller.decisions]
    assert [r["dop"] for r in rows] == [1, 2] and rows[1]["max_error"] == 0.5 and rows[1]["median_error"] == pytest.approx(0.255)


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="max_dop"):
        DopController(max_dop=0)
    with pytest.raises(ValueError, match="decrease"):
        DopController(max_dop=4, decrease=1.0)


def test_relative_error_is_against_the_serial_number():
    assert relative_error(1.1, 1.0) == pytest.approx(0.1)
    assert relative_error(0.9, 1.0) == pytest.approx(0.1)


def test_repeated_losses_when_probing_make_probes_rarer():
    controller = DopController(max_dop=2)
    probes = []
    for batch in range(40):
        if controller.dop == 2:
            probes.append(batch)
            controller.update(errors=[0.25])  # two candidates at once never measure right here
        else:
            controller.update(errors=[])
    gaps = [b - a for a, b in zip(probes, probes[1:])]
    assert gaps == sorted(gaps) and gaps[-1] > gaps[0] and len(probes) <= 6
    assert controller.decisions[-1].dop == 1 or controller.decisions[-1].reason.startswith("loss")
