"""Each kernel's seconds as it runs inside a compiled model: the VM's instrument hook around every call."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import tvm

# a kernel is never taken as free: what is left of a call once the hook's cost is taken away, at the least
LEAST_SHARE_LEFT = 0.1


def kernel_seconds(
    vm: Any, main: Callable, arguments: Sequence[Any], device: tvm.runtime.Device, runs: int = 10
) -> dict[str, float]:
    """Median seconds of each kernel of ``vm`` (summed over its calls in one inference) over ``runs``
    inferences of ``main`` on ``arguments``, after one untimed. A kernel can run slower here than it was
    tuned alone: its weights and inputs are not left in cache by the previous call of itself.

    The hook's own cost lies between its two timestamps: after a kernel the VM converts its arguments into
    Python objects to call the hook (and returns from the hook before it), 1-2.5 us a call on a 2-core Xeon
    VM: more than the whole of a RegNet squeeze-excite 1x1 convolution (0.4 us of a measured 2.0), and what
    had small products read at 1.6-3.7x their prediction there. So each call's time is less that cost as the
    same call pays it going in: the time from the hook's return after the call before it to its timestamp
    before this one (the same conversion of the same arguments), its median over the runs."""
    on_host = device.dlpack_device_type() == tvm.cpu(0).dlpack_device_type()
    per_run: dict[str, list[float]] = {}
    current: dict[str, float] = {}
    calls: dict[str, int] = {}
    hook_cost: dict[str, list[float]] = {}
    clock = {"started": 0.0, "left": None}

    def instrument(func: Any, symbol: str, before_run: bool, ret_value: Any, *args: Any) -> int:
        if not on_host:  # a GPU kernel is only queued by its call
            device.sync()
        now = time.perf_counter()
        if before_run:
            if clock["left"] is not None:
                hook_cost.setdefault(symbol, []).append(now - clock["left"])
            clock["started"] = time.perf_counter()
        else:
            current[symbol] = current.get(symbol, 0.0) + now - clock["started"]
            calls[symbol] = calls.get(symbol, 0) + 1
            clock["left"] = time.perf_counter()
        return 0

    main(*arguments)
    vm.set_instrument(instrument)
    try:
        for _ in range(runs):
            current.clear()
            calls.clear()
            clock["left"] = None  # the Python between two inferences is not the hook's
            main(*arguments)
            device.sync()
            for symbol, seconds in current.items():
                per_run.setdefault(symbol, []).append(seconds)
    finally:
        vm.set_instrument(None)
    kernels = {}
    for symbol, times in per_run.items():
        if symbol.startswith("vm."):
            continue
        measured = statistics.median(times)
        hook = calls[symbol] * statistics.median(hook_cost[symbol]) if symbol in hook_cost else 0.0
        kernels[symbol] = max(measured - hook, LEAST_SHARE_LEFT * measured)
    return kernels
