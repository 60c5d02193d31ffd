"""Runs inside a measuring worker: load built artifacts, time them, compare outputs.

Needs only the TVM runtime (``TVM_USE_RUNTIME_LIB=1`` works), so measuring can happen on a host
that cannot compile.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import ml_dtypes
import numpy as np
import tvm

from common.model_weights import load_weights, weights_path
from measure.cuda.runtime import no_gpu_reason, runtime_problem
from measure.timing.cpu_slots import pin_from_env
from measure.timing.in_model import kernel_seconds
from measure.timing.sampling import Evaluator, TimingConfig, time_with_evaluator

ArgSpec = Sequence  # [dtype, shape]


class NoDevice(RuntimeError):
    pass


def device(kind: str) -> tvm.runtime.Device:
    if kind == "cpu":
        return tvm.cpu(0)
    if kind == "cuda":
        problem = runtime_problem()  # the runtime-only TVM does not load its CUDA backend by itself
        if problem:
            raise NoDevice(problem)
        dev = tvm.cuda(0)
        if not dev.exist:
            raise NoDevice(no_gpu_reason())
        return dev
    raise ValueError(f"unknown device kind {kind!r}")


def warm_up(kind: str) -> None:
    """Create the device's context now, at start-up (1-2 s on a GPU), rather than in the first
    candidate's timed request. Without a device, the first request says so."""
    if kind != "cuda":
        return
    try:
        dev = device(kind)
    except NoDevice:
        return
    tvm.runtime.empty((1,), "float32", dev)
    dev.sync()


def random_arrays(args: Sequence[ArgSpec], seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    arrays = []
    # Integer arguments are mostly indices, into an axis of one of the other arguments that cannot be
    # told apart: below the smallest such axis, they stay in bounds (an attention mask's gather has an
    # axis of 1, and indices up to 7 made its unscheduled and tuned kernels read different garbage).
    others = [int(d) for dtype, shape in args if dtype.startswith(("float", "bfloat", "bool")) for d in shape]
    index_bound = max(1, min([8, *others]))
    for dtype, shape in args:
        if dtype.startswith(("float", "bfloat")):
            arrays.append(rng.uniform(-1.0, 1.0, size=shape).astype(dtype))
        elif dtype == "bool":
            arrays.append(rng.integers(0, 2, size=shape).astype(dtype))
        else:
            arrays.append(rng.integers(0, index_bound, size=shape).astype(dtype))
    return arrays


def to_device(arrays: Sequence[np.ndarray], dev: tvm.runtime.Device) -> list:
    return [tvm.runtime.tensor(a, dev) for a in arrays]


def _with_tvm_evaluator(make_evaluator, tensors: list) -> Evaluator:
    """An evaluator running TVM's time evaluator (``make_evaluator(number, repeat, min_repeat_ms)``) on ``tensors``."""

    def evaluator(number: int, repeat: int, min_repeat_ms: int) -> list[float]:
        return list(make_evaluator(number, repeat, min_repeat_ms)(*tensors).results)

    return evaluator


def _time(evaluator: Evaluator, config: TimingConfig) -> dict:
    start = time.perf_counter()
    samples, number = time_with_evaluator(evaluator, config)
    return {"samples": samples, "number": number, "seconds": time.perf_counter() - start}


# Set only when faults are injected on purpose (measure.workers.faults): spoils a kernel's outputs after it ran.
corrupt_outputs: Callable[[str, list], None] | None = None


def time_loaded(mod: Any, dev: tvm.runtime.Device, kind: str, tensors: list, timing: dict, artifact: str) -> dict:
    """The timed region of a loaded kernel on its filled arguments on ``dev`` (``device(kind)``), then a
    check that its outputs are finite: {"samples", "number", "seconds", "nonfinite"}."""
    config = TimingConfig(**timing).for_device(kind)
    if kind == "cuda" and config.flush_cache:
        outcome = _time_cold_on_gpu(mod, dev, tensors, config)
    else:
        # On a CPU, TVM flushes the arguments' cache lines (all but the first, in TVM's convention;
        # the first is usually the output). On a GPU without flushing, ``number`` calls per sample
        # run back to back, which spreads each launch's host-side delay over them.
        flush = {"f_preproc": "cache_flush_cpu_non_first_arg"} if config.flush_cache else {}

        def make_evaluator(number: int, repeat: int, min_repeat_ms: int):
            return mod.time_evaluator(
                mod.entry_name, dev, number=number, repeat=repeat, min_repeat_ms=min_repeat_ms, **flush
            )

        outcome = _time(_with_tvm_evaluator(make_evaluator, tensors), config)
    if corrupt_outputs is not None:
        corrupt_outputs(artifact, tensors)
    outcome["nonfinite"] = [i for i, t in enumerate(tensors) if not np.all(np.isfinite(t.numpy().astype(np.float64)))]
    return outcome


def time_kernel(artifact: str, args: Sequence[ArgSpec], device_kind: str, timing: dict) -> dict:
    """Time the entry function of a kernel library on random inputs."""
    dev = device(device_kind)
    mod = tvm.runtime.load_module(artifact)
    tensors = to_device(random_arrays(args), dev)
    return time_loaded(mod, dev, device_kind, tensors, timing, artifact)


def _time_cold_on_gpu(mod: Any, dev: tvm.runtime.Device, tensors: list, config: TimingConfig) -> dict:
    """One cold call per sample: the L2 is flushed by copying a buffer twice its size, and the
    kernel is queued behind the copy so that its events span the kernel alone (``measure.timing.cuda_cold``)."""
    with _queued_cold_timer(mod, dev, tensors) as timer:
        outcome = _time(timer, config)
        outcome["late_samples"] = timer.late
    return outcome


@contextmanager
def _queued_cold_timer(mod: Any, dev: tvm.runtime.Device, tensors: list) -> Iterator:
    from measure.timing.cuda_cold import QueuedColdTimer

    source, scratch = _flush_buffers(dev)
    timer = QueuedColdTimer(mod[mod.entry_name], tensors, lambda: scratch.copyfrom(source))
    try:
        yield timer
    finally:
        timer.close()


_flush_buffers_of: dict[str, tuple] = {}


def _flush_buffers(dev: tvm.runtime.Device) -> tuple:
    """The two buffers a cold sample copies between to evict the L2, allocated once per process."""
    if str(dev) not in _flush_buffers_of:
        _flush_buffers_of[str(dev)] = tuple(tvm.runtime.empty((_flush_words(dev),), "int32", dev) for _ in range(2))
    return _flush_buffers_of[str(dev)]


def _flush_words(dev: tvm.runtime.Device) -> int:
    """int32 words of a buffer twice the L2's size: copying it evicts whatever the L2 held."""
    return (2 * (dev.l2_cache_size_bytes or (64 << 20))) // 4


def cold_timings(artifact: str, args: Sequence[ArgSpec], repeat: int = 30) -> dict:
    """A GPU kernel timed cold two ways, to see the launch's host-side delay: queued behind the L2
    flush (the tuner's way), and as TVM's time evaluator does it (flush, wait for it, record the
    start event, then launch), whose events also span that delay. Medians, seconds per call."""
    dev = device("cuda")
    mod = tvm.runtime.load_module(artifact)
    tensors = to_device(random_arrays(args), dev)
    with _queued_cold_timer(mod, dev, tensors) as timer:
        timer(1, 3, 0)  # loads the kernel
        queued = timer(1, repeat, 0)
        late = timer.late
    evaluator = mod.time_evaluator(
        mod.entry_name, dev, number=1, repeat=repeat, cache_flush_bytes=4 * _flush_words(dev)
    )
    evaluated = list(evaluator(*tensors).results)
    return {"queued": statistics.median(queued), "tvm_evaluator": statistics.median(evaluated), "late_samples": late}


def run_kernel(artifact: str, arrays: Sequence[np.ndarray], device_kind: str) -> list[np.ndarray]:
    """Run a kernel library's entry function once on ``arrays``; every argument afterwards."""
    dev = device(device_kind)
    mod = tvm.runtime.load_module(artifact)
    tensors = to_device(arrays, dev)
    mod[mod.entry_name](*tensors)
    dev.sync()
    if corrupt_outputs is not None:
        corrupt_outputs(artifact, tensors)
    return [t.numpy() for t in tensors]


_last_model: dict[tuple, tuple[Any, list]] = {}


def _loaded_model(artifact: str, dev: tvm.runtime.Device) -> tuple[Any, list]:
    """A compiled model's library and its weights on ``dev`` (``common.model_weights``), loaded once for
    the calls that time it one after the other."""
    key = (artifact, str(dev), *(_stamp(path) for path in (artifact, weights_path(artifact))))
    if key not in _last_model:
        _last_model.clear()
        _last_model[key] = (tvm.runtime.load_module(artifact), load_weights(artifact, dev))
    return _last_model[key]


def _stamp(path: str | os.PathLike) -> tuple[int, int] | None:
    try:
        stat = os.stat(path)
    except FileNotFoundError:
        return None
    return stat.st_mtime_ns, stat.st_size


def time_model(artifact: str, args: Sequence[ArgSpec], device_kind: str, timing: dict) -> dict:
    """Time ``main`` of a compiled Relax model (a VM executable) on random inputs."""
    from tvm.runtime.vm import VirtualMachine

    dev = device(device_kind)
    library, weights = _loaded_model(artifact, dev)
    vm = VirtualMachine(library, dev)
    tensors = to_device(random_arrays(args), dev) + weights

    def make_evaluator(number: int, repeat: int, min_repeat_ms: int):
        return vm.time_evaluator("main", dev, number=number, repeat=repeat, min_repeat_ms=min_repeat_ms)

    # A whole model runs as in production: one kernel's output is the next one's input, in cache.
    return _time(_with_tvm_evaluator(make_evaluator, tensors), replace(TimingConfig(**timing), flush_cache=False))


def kernel_times(artifact: str, args: Sequence[ArgSpec], device_kind: str, runs: int) -> dict:
    """Each kernel's median seconds inside a compiled Relax model on random inputs (``in_model``)."""
    from tvm.runtime.vm import VirtualMachine

    dev = device(device_kind)
    library, weights = _loaded_model(artifact, dev)
    vm = VirtualMachine(library, dev)
    return {"kernels": kernel_seconds(vm, vm["main"], to_device(random_arrays(args), dev) + weights, dev, runs)}


REFERENCE_SEED = 1  # the random arguments a task's candidates are checked on


def reference_outputs(reference: str, reference_device: str, args: Sequence[ArgSpec], path: str) -> dict:
    """Run the unscheduled kernel once and save to ``path`` the arguments it wrote, for every
    candidate of its task to be compared with (``compare_outputs``). The unscheduled kernel can
    take minutes on a large task, so it runs once per task, not once per candidate."""
    arrays = random_arrays(args, seed=REFERENCE_SEED)
    start = time.perf_counter()
    after = run_kernel(reference, arrays, reference_device)
    seconds = time.perf_counter() - start
    written = {
        f"arg{i}": _savable(result)
        for i, (before, result) in enumerate(zip(arrays, after, strict=True))
        if before.tobytes() != result.tobytes()
    }
    partial = f"{path}.partial.npz"
    np.savez(partial, **written)
    os.replace(partial, path)
    return {"seconds": seconds}


def _savable(array: np.ndarray) -> np.ndarray:
    """bf16 as float32 (exactly): np.savez keeps ml_dtypes' bfloat16 as raw bytes it cannot read back as numbers."""
    return array.astype(np.float32) if array.dtype == ml_dtypes.bfloat16 else array


def compare_outputs(
    candidate: str, candidate_device: str, reference_outputs: str, args: Sequence[ArgSpec], rtol: float
) -> dict:
    """Run the candidate on the reference's random arguments and compare every argument afterwards
    with what the reference left in them (``reference_outputs``' file).

    Comparing all arguments (not only those known to be outputs) also catches a kernel that
    writes where it should only read.
    """
    arrays = random_arrays(args, seed=REFERENCE_SEED)
    with np.load(reference_outputs) as saved:
        expected_all = [saved[f"arg{i}"] if f"arg{i}" in saved.files else a for i, a in enumerate(arrays)]
    got_all = run_kernel(candidate, arrays, candidate_device)
    worst, where = 0.0, ""
    for index, (expected, got) in enumerate(zip(expected_all, got_all, strict=True)):
        expected64 = expected.astype(np.float64)
        got64 = got.astype(np.float64)
        if not np.all(np.isfinite(got64) | ~np.isfinite(expected64)):
            return {"ok": False, "detail": f"argument {index} holds NaN or Inf where the reference is finite"}
        scale = max(1.0, float(np.max(np.abs(expected64), initial=0.0)))
        error = float(np.max(np.abs(got64 - expected64), initial=0.0)) / scale
        if error > worst:
            worst, where = error, f"argument {index}"
    ok = worst <= rtol
    detail = f"max relative error {worst:.2e} ({where or 'all arguments equal'}); tolerance {rtol:.0e}"
    return {"ok": ok, "max_error": worst, "detail": detail}


HANDLERS = {
    "time_kernel": time_kernel,
    "time_model": time_model,
    "kernel_times": kernel_times,
    "reference_outputs": reference_outputs,
    "compare_outputs": compare_outputs,
    "run_kernel": run_kernel,
    "cold_timings": cold_timings,
}

# Keep the worker's thread pool at the size the target was compiled for, on the cores it was given.
pin_from_env()
if os.environ.get("TVM_NUM_THREADS"):
    os.environ.setdefault("OMP_NUM_THREADS", os.environ["TVM_NUM_THREADS"])
