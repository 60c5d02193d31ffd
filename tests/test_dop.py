"""The DOP controller: slow start, multiplicative back-off on a loss, binary increase after it."""

import itertools
import random

import pytest

from measure.dop.controller import DopController, DopState, relative_error


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
    assert (
        [r["dop"] for r in rows] == [1, 2]
        and rows[1]["max_error"] == 0.5
        and rows[1]["median_error"] == pytest.approx(0.255)
    )


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
    gaps = [b - a for a, b in itertools.pairwise(probes)]
    assert gaps == sorted(gaps) and gaps[-1] > gaps[0] and len(probes) <= 6
    assert controller.decisions[-1].dop == 1 or controller.decisions[-1].reason.startswith("loss")


def test_a_resumed_dop_that_now_loses_backs_off_as_usual():
    controller = DopController(max_dop=8)
    controller.resume(DopState(dop=4, loss_dop=6, cooldown=2, loss_streak=1), since="2024-05-01 10:00 UTC")
    assert (
        controller.dop == 4
        and controller.start == "start: remembered DOP 4 (loss at 6, probe cooldown 2) from 2024-05-01 10:00 UTC"
    )
    decision = controller.update(errors=[0.12, 0.01])  # the machine changed: 4 no longer holds
    assert decision.loss and controller.dop == 2 and controller.loss_dop == 4
    assert decision.start == controller.start and "12.0% > 5%" in decision.reason


def test_the_first_window_at_a_resumed_dop_is_checked_more_closely():
    controller = DopController(max_dop=8, check_fraction=0.2)
    controller.resume(DopState(dop=4, loss_dop=None, cooldown=0, loss_streak=0), since="earlier")
    assert len(controller.to_check(20, random.Random(0))) == 8  # twice the usual 20% of 20
    controller.update(errors=[0.01] * 8)
    assert controller.dop == 8 and len(controller.to_check(40, random.Random(0))) == 8  # back to 20%


def test_resuming_at_1_keeps_the_usual_share_and_a_ceiling_caps_the_remembered_dop():
    at_one = DopController(max_dop=8)
    at_one.resume(DopState(dop=1, loss_dop=2, cooldown=32, loss_streak=5), since="earlier")
    at_one.update(errors=[])
    assert at_one.dop == 1 and at_one.cooldown == 31  # holds: the cooldown goes on counting down
    capped = DopController(max_dop=4, max_cooldown=32)
    capped.resume(DopState(dop=16, loss_dop=None, cooldown=100, loss_streak=10**9), since="earlier")
    assert capped.dop == 4 and capped.cooldown == 32 and "capped at 4" in capped.start
    capped.update(errors=[0.5])
    assert capped.dop == 2
    with pytest.raises(RuntimeError, match="before its first decision"):
        capped.resume(DopState(1, None, 0, 0), since="earlier")
