"""A time budget is the call's wall clock: what a run keeps back for after its search, estimated from the costs
it measured (tuner.search.reserve), and how the budget's objectives read it."""

import dataclasses

import pytest

from measure import TimingConfig
from tuner.compile.check import checks_against_default_schedules
from tuner.compile.compile import IN_MODEL_RUNS
from tuner.compile.estimate import (
    AGAINST_UNTUNED,
    NO_CHECK,
    WEIGHT_BYTES_PER_SECOND,
    CompileEstimate,
    timing_seconds,
    untuned_calls,
)
from tuner.compile.in_model_choice import PASSES
from tuner.search.final_choice import UNSCHEDULED_FLOPS_PER_SECOND, check_seconds, task_seconds
from tuner.search.kernel_costs import KernelCosts
from tuner.search.objectives import Objectives, Spending, met, short_of_time, time_left, time_limit
from tuner.search.reserve import MARGIN, reserve, reserve_parts
from tuner.tasks.extraction import Task, load_model


def _costs() -> KernelCosts:
    costs = KernelCosts()
    for build, run in ((1.0, 0.1), (3.0, 0.3), (2.0, 0.2)):
        costs.observe("conv", build, run)
    costs.observe("add", 0.2, 0.04)
    costs.observe("add", 0.0, 0.0)  # a failed build: no cost to learn from
    return costs


def test_a_kernel_costs_its_median_and_one_not_measured_the_mean_over_kernels():
    costs = _costs()
    assert (costs.build("conv"), costs.run("conv"), costs.build("add")) == (2.0, 0.2, 0.2)
    assert costs.build("pool") == costs.build() == pytest.approx((2.0 + 0.2) / 2)  # over kernels, not builds
    assert costs.run() == pytest.approx((0.2 + 0.04) / 2)
    assert not KernelCosts().known and KernelCosts().build("conv") == 0.0


def test_a_tasks_final_choice_re_times_its_top_and_checks_its_best():
    costs, timing = _costs(), TimingConfig(budget_seconds=0.25)
    conv = Task("conv", None, 1, 0.0)
    check = check_seconds(costs, "conv", 0.0)
    assert check == pytest.approx(2.0 + 2 * 0.2)  # the candidate built and run, the unscheduled kernel run
    # not measured yet: its re-timing's whole budget
    assert task_seconds(costs, conv, None, 1, timing, rebuilt=False, verified=True) == pytest.approx(0.2 + 0.25)
    # resumed: the top five's libraries are an earlier process's, so built again; its best not checked yet
    resumed = task_seconds(costs, conv, None, 5, timing, rebuilt=True, verified=False)
    assert resumed == pytest.approx(5 * (0.2 + 0.25 + 2.0) + check)


def test_a_small_kernels_re_timing_ends_at_its_most_samples_not_at_the_budget():
    costs = _costs()
    timing = TimingConfig(min_repeats=5, max_repeats=50, budget_seconds=0.25, warmup_seconds=0.01)
    conv = Task("conv", None, 1, 0.0)
    small = task_seconds(costs, conv, 20e-6, 1, timing, rebuilt=False, verified=True)
    assert small == pytest.approx(0.2 + 0.01 + 20e-6 + 50 * 1e-3)  # 50 samples of 1 ms at least
    large = task_seconds(costs, conv, 0.1, 1, timing, rebuilt=False, verified=True)
    assert large == pytest.approx(0.2 + 0.01 + 0.1 + 5 * 0.1)  # a slow one: its 5 samples outlast the budget
    assert timing.seconds_for(2e-3) == pytest.approx(0.01 + 2e-3 + 0.1)  # 50 samples of 2 ms, under the budget


def test_a_check_counts_the_unscheduled_kernels_plain_loops_by_its_flops():
    # DeBERTa-v2's FFN product (2.4 GFLOP): its unscheduled loops ran 7.3 s, its candidates built in 0.1 s
    costs = _costs()
    product = check_seconds(costs, "conv", 2.4e9)
    assert product - check_seconds(costs, "conv", 0.0) == pytest.approx(2.4e9 / UNSCHEDULED_FLOPS_PER_SECOND)
    assert product > 5.0
    slow = Task("conv", None, 1, 2.4e9)
    timing = TimingConfig(budget_seconds=0.25)
    assert task_seconds(costs, slow, None, 1, timing, rebuilt=False, verified=False) == pytest.approx(0.45 + product)


def test_the_compile_phase_is_its_kernels_builds_a_fresh_process_and_the_timing_windows():
    costs = _costs()  # builds: conv 2.0 s, add 0.2 s
    load = costs.run()
    timing = timing_seconds(0.01, load)
    assert timing == pytest.approx(3 * (load + 0.1 + 0.01 + 30 * 0.01))  # 30 calls of 10 ms end a window first
    assert timing_seconds(1e-4, 0.0) == pytest.approx(3 * (0.1 + 1e-4 + 30 * 1e-3))  # samples of 1 ms at least
    assert timing_seconds(1.0, 0.0) == pytest.approx(3 * (0.1 + 1.0 + 5 * 1.0))  # a slow model: 5 calls a window
    model = CompileEstimate(["conv", "add"], lambda: 4.0)
    against_framework = model(costs, 0.01)
    in_model = (IN_MODEL_RUNS + 1) * 0.01  # each kernel timed inside the model, for the report
    assert against_framework == pytest.approx(2.2 + timing + in_model + 4.0 + 0.01)
    untuned = CompileEstimate(["conv", "add"], lambda: 4.0, check=AGAINST_UNTUNED, untuned_runs=1.0)(costs, 0.01)
    # the untuned build compiled too, and run (``untuned_runs``) in a process of its own
    assert untuned == pytest.approx(against_framework + 2.2 + 4.0 + 1.0)
    unchecked = CompileEstimate(["conv", "add"], lambda: None, check=NO_CHECK)(costs, 0.01)
    assert unchecked == pytest.approx(2.2 + timing + in_model)
    assert CompileEstimate(["conv", "add"], lambda: None)(costs, 0.01) == pytest.approx(2.2 + timing + in_model + 0.01)
    kernel = CompileEstimate(["conv"], lambda: 4.0, model=False, kernel_flops=1e9)(costs, 0.01)
    assert kernel == pytest.approx(2.0 + timing + check_seconds(costs, "conv", 1e9))  # checked alone, no process


def test_a_models_weights_cost_each_write_read_and_load():
    costs, gigabyte = _costs(), 10**9
    pass_seconds = gigabyte / WEIGHT_BYTES_PER_SECOND

    def extra(**fields) -> float:
        """What a model of a gigabyte of weights adds to the same model without weights."""
        with_weights = CompileEstimate(["conv", "add"], lambda: 4.0, weight_bytes=gigabyte, **fields)(costs, 0.01)
        return with_weights - CompileEstimate(["conv", "add"], lambda: 4.0, **fields)(costs, 0.01)

    # written for the build workers, read and written by the compile, loaded to time it and to check it
    assert extra() == pytest.approx((1 + 2 + 2) * pass_seconds)
    # judged: two models compiled (the tuned one kept), each loaded PASSES times, in alternation
    assert extra(judged=True) == pytest.approx((1 + 2 * 2 + 1 + 2 * PASSES + 1) * pass_seconds)
    # no framework to check against: the untuned build compiled, and loaded beside the tuned one to compare
    assert extra(check=AGAINST_UNTUNED) == pytest.approx((1 + 2 * 2 + 1 + 2) * pass_seconds)
    assert extra(check=NO_CHECK) == pytest.approx((1 + 2 + 1) * pass_seconds)


def test_the_budget_counts_the_reserve_and_says_so():
    assert reserve(10.0, 20.0) == pytest.approx(MARGIN * 30.0)
    assert reserve_parts(10.0, 20.0) == pytest.approx((MARGIN * 30.0, MARGIN * 10.0))
    budget = Objectives(seconds=180)
    spent = Spending(seconds=150.0, reserved=25.0, reserved_for_choice=10.0)
    assert met(budget, spent) is None and time_left(budget, spent) == pytest.approx(5.0)
    kept = "25 s kept for the final choice (10 s) and the compile, check and in-model choice (15 s)"
    assert short_of_time(budget, spent) == f"time budget: 150 s of 180 s, {kept}, too little left for another batch"
    spent.seconds = 160.0
    assert met(budget, spent) == f"time budget: 160 s of 180 s, {kept}"
    money = Objectives(money=0.05, price_per_hour=1.0)  # 180 s of device time
    assert time_limit(money) == pytest.approx(180.0) and met(money, spent).startswith("money budget")
    assert time_limit(Objectives(seconds=180, money=0.05, price_per_hour=2.0)) == pytest.approx(90.0)
    assert time_limit(Objectives(trials=10)) is None and time_left(Objectives(trials=10), spent) is None


def test_a_models_weight_bytes_are_its_distinct_tensor_constants():
    import numpy as np
    from tvm import relax

    from codegen.weights import weight_bytes

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, 8), "float32"))
    bias = relax.const(np.ones((16,), "float16"))
    with bb.function("main", [x]):
        y = bb.emit(relax.op.matmul(x, relax.const(np.ones((8, 16), "float32"))))
        y = bb.emit(relax.op.add(y, relax.op.astype(bias, "float32")))
        y = bb.emit(relax.op.add(y, relax.op.astype(bias, "float32")))  # the same bias again: one weight
        bb.emit_func_output(relax.op.multiply(y, relax.const(2.0, "float32")))  # a scalar: no weight
    assert weight_bytes(bb.get()) == 8 * 16 * 4 + 16 * 2


def test_a_check_against_default_schedules_counts_the_calls_it_makes_of_them():
    # a bf16 model's framework answers whether its output depends on the input: its default-schedule build is
    # called on the check's inputs only; the same model imported with no framework calls it on other inputs too
    torch = pytest.importorskip("torch")
    module = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU()).eval()
    bf16 = load_model(module, [torch.randn(8, 64)], dtype="bfloat16")
    assert checks_against_default_schedules(bf16) and untuned_calls(bf16) == 1
    imported = dataclasses.replace(bf16, reference=None)
    assert checks_against_default_schedules(imported) and untuned_calls(imported) == 2
