"""Each kernel's time inside a compiled model, without the instrument hook's own cost (``measure.timing.in_model``)."""

import statistics
import time

import numpy as np
import tvm
from tvm import relax, te, topi
from tvm.runtime.vm import VirtualMachine

from measure.timing.in_model import kernel_seconds


def _one_element_model():
    """A model of one kernel that adds 1 to one number: its work is a few nanoseconds, the hook's is microseconds."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1,), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(
                bb.emit_te(lambda a: topi.add(a, te.const(1.0, "float32")), x, primfunc_name_hint="plus_one")
            )
        bb.emit_func_output(out)
    return VirtualMachine(tvm.compile(bb.get(), target="llvm"), tvm.cpu())


def _span_between_hooks(vm, symbol: str, argument, runs: int) -> float:
    """The kernel's median time between the hook's two timestamps: as it read before the hook's cost was taken off."""
    spans, started = [], [0.0]

    def instrument(func, name, before_run, ret_value, *args):
        if name == symbol:
            if before_run:
                started[0] = time.perf_counter()
            else:
                spans.append(time.perf_counter() - started[0])
        return 0

    vm.set_instrument(instrument)
    try:
        for _ in range(runs):
            vm["main"](argument)
    finally:
        vm.set_instrument(None)
    return statistics.median(spans)


def test_a_kernel_inside_the_model_is_timed_without_the_hooks_cost_around_it():
    vm = _one_element_model()
    argument = tvm.runtime.tensor(np.zeros(1, "float32"))
    times = kernel_seconds(vm, vm["main"], [argument], tvm.cpu(), runs=30)
    (symbol,) = times
    assert "plus_one" in symbol and times[symbol] > 0
    span = _span_between_hooks(vm, symbol, argument, runs=30)
    # most of a one-element kernel's span is the hook's (1-2.5 us on a 2-core VM, the kernel a few ns)
    assert times[symbol] < 0.5 * span
    np.testing.assert_array_equal(vm["main"](argument).numpy(), [1.0])  # the hook is removed
