"""Each kernel's seconds as it runs inside a compiled model: the VM's instrument hook around every call."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import tvm


def kernel_seconds(
    vm: Any, main: Callable, arguments: Sequence[Any], device: tvm.runtime.Device, runs: int = 10
) -> dict[str, float]:
    """Median seconds of each kernel of ``vm`` (summed over its calls in one inference) over ``runs``
    inferences of ``main`` on ``arguments``, after one untimed. A kernel can run slower here than it was
    tuned alone: its weights and inputs are not left in cache by the previous call of itself. Python runs
    between the kernels while they are timed, which slows short ones: SqueezeNet's kernels added up to
    4.5 ms here in a model that ran in 3.9."""
    on_host = device.dlpack_device_type() == tvm.cpu(0).dlpack_device_type()
    per_run: dict[str, list[float]] = {}
    current: dict[str, float] = {}
    started = [0.0]

    def instrument(func: Any, symbol: str, before_run: bool, ret_value: Any, *args: Any) -> int:
        if not on_host:  # a GPU kernel is only queued by its call
            device.sync()
        if before_run:
            started[0] = time.perf_counter()
        else:
            current[symbol] = current.get(symbol, 0.0) + time.perf_counter() - started[0]
        return 0

    main(*arguments)
    vm.set_instrument(instrument)
    try:
        for _ in range(runs):
            current.clear()
            main(*arguments)
            device.sync()
            for symbol, seconds in current.items():
                per_run.setdefault(symbol, []).append(seconds)
    finally:
        vm.set_instrument(None)
    return {symbol: statistics.median(times) for symbol, times in per_run.items() if not symbol.startswith("vm.")}
