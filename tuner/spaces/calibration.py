"""What this machine's kernels reach, measured once and kept (AutoConfig's "dynamic overhead
measurement"): the rate of an analytically configured product running from the caches, memory bandwidth,
the cost of a parallel launch, and the peaks a kernel's fraction of peak is judged against (fp32 FMA and
the bf16 unit, ``common.peaks``). The analytic model's predictions are made of these and the kernels'
FLOPs and bytes; ``tuner doctor`` prints them. ``machine_speed`` times the calibration's product again,
beside a model's timing: a VM runs at other speeds than the one it was calibrated at.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import tvm
from tvm import te
from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

from codegen.bf16_dot import AMX, AVX512, LANES, PAIR
from common.environment import environment
from common.host import cpu_model, user_cache_dir, write_atomically
from common.peaks import bf16_peak, fma_gflops
from tuner.targets import bf16_unit

from . import metaschedule as msc
from .analytic import configure_kernel
from .bf16_product import packed_product
from .machine import MachineFacts

CALIBRATION_FILE = "machine.json"
# BERT-base's attention output projection (128 tokens, 768 -> 768), its weights in the layout its schedule
# chooses, as a model's are (they are constants): what a model's products reach. A 512^3 product with its
# weights as given, calibrated before, ran at 69% of a Zen 3's FMA peak while the models' products ran at
# up to 93% (docs/analytic.md).
_PRODUCT = (128, 768, 768)  # rows, columns, reduction
# In bf16, two products say what a reduction step and what an output cost on the unit: an AMX tile's accumulators go
# through memory once per output (stored, then converted by vector code), as long as a 64-deep reduction takes. The
# deep one is ResNet-18's 3x3 convolution of 128 channels on 28x28 as a product (most of a CNN's bf16 FLOPs): on a
# 2-core Xeon it read 2,531-2,681 GFLOP/s in eight readings, where the product above, on 128 rows, read 1,959-2,577
# in bf16; the shallow one ResNet-50's first 1x1 expansion (56x56 positions, 64 -> 256 channels), 1,009-1,093
_BF16_PRODUCT = (784, 128, 1152)
_SHALLOW_PRODUCT = (3136, 256, 64)
_COPY_FLOATS = 16 << 20  # 64 MB each way: past the private caches, within a VM's reported L3 (the operands' rate)
_MAX_STREAM_BYTES = 1 << 30  # the copy from memory, each way, at most (twice the last-level cache, where smaller)


def _flops(shape: tuple[int, int, int]) -> int:
    """Of a product of ``shape`` (rows, columns, reduction): a multiply and an add each."""
    rows, columns, depth = shape
    return 2 * rows * columns * depth


_PRODUCT_FLOPS = _flops(_PRODUCT)
# in the key: a change remeasures
_METHOD = (
    "a model's product (128x768x768, layout-free weights; in bf16 784x128x1152 and 3136x256x64 on each unit), "
    "host-wide peaks (FMA operands in registers), fastest of repeats; its block: row tiles per column tile; AMX "
    "tiles from zero tiles store no zeros first; weights from memory: a copy twice the last-level cache"
)
BUSY_LOAD_PER_CORE = 0.5  # runnable processes per core (the 1-minute load average) above which a machine is busy


@dataclass(frozen=True)
class Calibration:
    """Measured on this machine (AutoConfig's "dynamic overhead measurement"): the rate of an analytically
    configured product running from the caches, bandwidth from the caches and from memory, and the cost of
    a parallel launch."""

    product_gflops: float  # all cores
    bandwidth_gbs: float  # bytes read and written per second
    launch_seconds: float  # a parallel kernel that does nothing to speak of
    fma_peak_gflops: float | None = None  # independent FMA chains on every core; None: no C compiler
    bf16_peak_gflops: float | None = None  # the bf16 unit's (AMX or vdpbf16ps); None where the CPU has none
    load_per_core: float | None = None  # the machine's load when measured; None: not recorded (an older cache)
    # a product in bf16 (``_BF16_PRODUCT``), in our rule's tiles (``bf16_rule``) on each unit the CPU has: what a
    # model's bf16 products reach, which the AMX peak does not say (ResNet-18's kernels at 13-35% of its peak)
    bf16_product_gflops: float | None = None  # vdpbf16ps
    amx_product_gflops: float | None = None
    # the shallow product (``_SHALLOW_PRODUCT``) on each unit: with the one above, the cost of an output
    bf16_shallow_gflops: float | None = None
    amx_shallow_gflops: float | None = None
    # a copy twice the last-level cache: what a model's weights stream at, read once an inference
    memory_bandwidth_gbs: float | None = None

    @property
    def taken_busy(self) -> bool:
        return self.load_per_core is not None and self.load_per_core > BUSY_LOAD_PER_CORE

    @property
    def taken_quiet(self) -> bool:
        """Known to be measured on a quiet machine (an older cache did not record the load: not known)."""
        return self.load_per_core is not None and not self.taken_busy

    def describe(self) -> str:
        peaks = f", FMA peak {self.fma_peak_gflops:.0f} GFLOP/s" if self.fma_peak_gflops else ""
        if self.bf16_peak_gflops:
            peaks += f", bf16 peak {self.bf16_peak_gflops:.0f}"
        for name, unit, rate in (
            ("vdpbf16ps", AVX512, self.bf16_product_gflops),
            ("AMX", AMX, self.amx_product_gflops),
        ):
            peaks += f", bf16 products on {name} {rate:.0f}" if rate else ""
            per_output = (self.bf16_costs(unit) or (0.0, 0.0))[1]
            peaks += f" (an output {per_output * 1e12:.0f} ps)" if per_output else ""
        memory = f"memory {self.bandwidth_gbs:.1f} GB/s"
        if self.memory_bandwidth_gbs:
            memory = f"{self.bandwidth_gbs:.1f} GB/s from the caches and {self.memory_bandwidth_gbs:.1f} from memory"
        busy = (
            f" (taken while the machine was busy, {self.load_per_core:.1f} runnable per core: measured again on the "
            "first run that finds it quiet)"
            if self.taken_busy
            else ""
        )
        return (
            f"products {self.product_gflops:.0f} GFLOP/s from the caches, {memory}, "
            f"a parallel launch {self.launch_seconds * 1e6:.1f} us{peaks}{busy}"
        )

    def best_with(self, other: Calibration) -> Calibration:
        """The better of two calibrations' figures (a busy machine reads low, never high), at ``other``'s
        load."""

        def most(a: float | None, b: float | None) -> float | None:
            return max((v for v in (a, b) if v is not None), default=None)

        return Calibration(
            product_gflops=max(self.product_gflops, other.product_gflops),
            bandwidth_gbs=max(self.bandwidth_gbs, other.bandwidth_gbs),
            launch_seconds=min(self.launch_seconds, other.launch_seconds),
            fma_peak_gflops=most(self.fma_peak_gflops, other.fma_peak_gflops),
            bf16_peak_gflops=most(self.bf16_peak_gflops, other.bf16_peak_gflops),
            load_per_core=other.load_per_core,
            bf16_product_gflops=most(self.bf16_product_gflops, other.bf16_product_gflops),
            amx_product_gflops=most(self.amx_product_gflops, other.amx_product_gflops),
            bf16_shallow_gflops=most(self.bf16_shallow_gflops, other.bf16_shallow_gflops),
            amx_shallow_gflops=most(self.amx_shallow_gflops, other.amx_shallow_gflops),
            memory_bandwidth_gbs=most(self.memory_bandwidth_gbs, other.memory_bandwidth_gbs),
        )

    def bf16_product_rate(self, unit: str) -> float | None:
        """What our bf16 rule's products reach on ``unit`` (``AVX512``, ``AMX``); None where not measured."""
        return self.amx_product_gflops if unit == AMX else self.bf16_product_gflops

    def bf16_costs(self, unit: str) -> tuple[float, float] | None:
        """(seconds per FLOP, seconds per output) of our bf16 rule's products on ``unit``, from the calibration's
        two products (``_SHALLOW_PRODUCT``); an output costs nothing of its own where the two say none (the
        accumulators stay in registers) or the shallow one was not measured. None where neither was."""
        deep = self.bf16_product_rate(unit)
        if not deep:
            return None
        shallow = self.amx_shallow_gflops if unit == AMX else self.bf16_shallow_gflops
        if shallow:
            costs = _per_flop_and_output(deep, shallow)
            if costs is not None:
                return costs
        return 1 / (deep * 1e9), 0.0

    def peak_gflops(self, dtype: str) -> float | None:
        """The compute peak a kernel of ``dtype`` (its products' inputs) is judged against."""
        return self.bf16_peak_gflops if dtype == "bfloat16" else self.fma_peak_gflops


def calibration(target: tvm.target.Target, cache: Path | None = None) -> Calibration:
    """This machine's calibration for ``target`` (an llvm target whose CPU is this host's): read from the
    user cache, or measured (a few seconds) and kept there. One taken while the machine was busy reads low:
    the first call that finds the machine quiet measures again and keeps the better of each figure; so does
    one whose load was not recorded (an older cache: one kept for an AVX2 target read the FMA peak at half
    of what the same micro-kernel measures quiet, and its products ran at "100%" of it)."""
    cache = cache or user_cache_dir() / CALIBRATION_FILE
    key = _key(target)
    try:
        kept = json.loads(cache.read_text())
    except (OSError, ValueError):
        kept = {}
    load = os.getloadavg()[0] / (os.cpu_count() or 1)
    earlier = Calibration(**kept[key]) if key in kept else None
    if earlier is not None and (earlier.taken_quiet or load > BUSY_LOAD_PER_CORE):
        return earlier
    measured = replace(_measure(target), load_per_core=load)
    if earlier is not None:
        measured = earlier.best_with(measured)
    kept[key] = asdict(measured)
    with contextlib.suppress(OSError):  # a read-only cache costs a measurement next time, nothing else
        write_atomically(cache, json.dumps(kept, indent=1))
    return measured


def _per_flop_and_output(deep_gflops: float, shallow_gflops: float) -> tuple[float, float] | None:
    """(seconds per FLOP, seconds per output) that take the calibration's two bf16 products (``_BF16_PRODUCT``,
    ``_SHALLOW_PRODUCT``) at the rates they were timed at; None where no positive pair does."""
    (deep_flops, deep_outputs), (shallow_flops, shallow_outputs) = (
        (_flops(shape), shape[0] * shape[1]) for shape in (_BF16_PRODUCT, _SHALLOW_PRODUCT)
    )
    deep_seconds, shallow_seconds = deep_flops / (deep_gflops * 1e9), shallow_flops / (shallow_gflops * 1e9)
    determinant = deep_flops * shallow_outputs - shallow_flops * deep_outputs
    per_flop = (deep_seconds * shallow_outputs - shallow_seconds * deep_outputs) / determinant
    per_output = (deep_flops * shallow_seconds - shallow_flops * deep_seconds) / determinant
    return (per_flop, per_output) if per_flop > 0 and per_output > 0 else None


@dataclass(frozen=True)
class SpeedProbe:
    """The calibration's product, built once and kept beside the calibration, to be timed again where a
    model's kernels are timed (the measuring worker; ``machine_speed`` here): its rate over the calibrated
    one is the machine's speed against its calibration. A VM whose neighbours take a core, or whose clock
    drops, reads below 1: 0.50-0.83 within minutes on a 2-core Zen 3 VM (2026-12-03). The summary and the
    report give the predictions divided by it: at the speed the machine ran the model's kernels at."""

    library: Path
    args: list  # [dtype, shape] per argument, as the measuring worker takes them
    calibrated_gflops: float

    def speed(self, seconds: float) -> float:
        """The machine's speed against its calibration, from the probe's ``seconds`` per call."""
        return _PRODUCT_FLOPS / seconds / 1e9 / self.calibrated_gflops


def speed_probe(target: tvm.target.Target, cache: Path | None = None) -> SpeedProbe | None:
    """This machine's ``SpeedProbe`` for ``target``, its library built the first time; None off a CPU."""
    if target.kind.name != "llvm":
        return None
    cache = cache or user_cache_dir() / CALIBRATION_FILE
    calibrated = calibration(target, cache).product_gflops
    library = cache.parent / f"speed-probe-{hashlib.sha256(_key(target).encode()).hexdigest()[:16]}.so"
    product = _configured_product(target)
    if not library.exists():
        building = library.with_suffix(f".{os.getpid()}.so")  # renamed into place: no reader sees half of it
        _export(product, target, building)
        os.replace(building, library)
    return SpeedProbe(library, _argument_specs(product), calibrated)


def machine_speed(target: tvm.target.Target, cache: Path | None = None) -> float | None:
    """The machine's speed against its calibration, the probe timed in this process (as the calibration
    was: the fastest of its repeats); None off a CPU. A model's kernels are timed in the measuring worker,
    whose probe the compile phase times there, beside them."""
    probe = speed_probe(target, cache)
    if probe is None:
        return None
    with _threads_of(target):
        module = tvm.runtime.load_module(str(probe.library))
        return probe.speed(_fastest(module, _zeros(probe.args)))


def _key(target: tvm.target.Target) -> str:
    return f"{cpu_model()} | {target} | TVM {tvm.__version__} | {_threads(target)} threads | {_METHOD}"


def _threads(target: tvm.target.Target) -> int:
    return int(os.environ.get("TVM_NUM_THREADS") or target.attrs.get("num-cores", 1) or 1)


@contextlib.contextmanager
def _threads_of(target: tvm.target.Target) -> Iterator[None]:
    """TVM's thread pool as wide as the target's cores while the calibration runs: left alone it takes
    half the logical cores on x86 (one thread on a 2-core VM: half the rate). The pool reads the variable
    each time it launches work."""
    with environment({"TVM_NUM_THREADS": str(_threads(target))}):
        yield


def _measure(target: tvm.target.Target) -> Calibration:
    with _threads_of(target):
        return _measure_with_threads(target)


def _calibration_product() -> tvm.IRModule:
    rows, columns, depth = _PRODUCT
    a = te.placeholder((rows, depth), "float32", name="a")
    w = te.placeholder((depth, columns), "float32", name="w")
    k = te.reduce_axis((0, depth), "k")
    c = te.compute((rows, columns), lambda i, j: te.sum(a[i, k] * w[k, j], axis=k), name="c")
    func = te.create_prim_func([a, w, c]).with_attr(msc.LAYOUT_FREE_ATTR, [1])
    return tvm.IRModule({"main": func})


def _bf16_calibration_product(unit: str, shape: tuple[int, int, int] = _BF16_PRODUCT) -> tvm.IRModule:
    """The calibration's product (of ``shape``: rows, columns, reduction) as bf16 lowering makes a model's
    (``bf16_product``): bf16 activations times the weight packed [N/16, K/2, 16, 2], summed in fp32 by our bf16
    rule on ``unit``."""
    rows, columns, depth = shape
    a = te.placeholder((rows, depth), "bfloat16", name="a")
    w = te.placeholder((columns // LANES, depth // PAIR, LANES, PAIR), "bfloat16", name="w")
    c = packed_product(a, w, unit, name="gemm")
    func = te.create_prim_func([a, w, c]).with_attr(msc.LAYOUT_FREE_ATTR, [1])
    return tvm.IRModule({"main": func})


def _configured_product(
    target: tvm.target.Target, unit: str | None = None, shape: tuple[int, int, int] = _BF16_PRODUCT
) -> tvm.IRModule:
    """The calibration's product with its analytic schedule, its weights taken in the layout the schedule
    chose (a compiled model rewrites them once, ahead of time), as the engine builds a candidate; with a bf16
    ``unit``, the product in bf16 on it (of ``shape``)."""
    product = _calibration_product() if unit is None else _bf16_calibration_product(unit, shape)
    configured = configure_kernel(product, target)
    if configured is None:
        return product
    return RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(configured.sch.mod)


def _measure_with_threads(target: tvm.target.Target) -> Calibration:
    gemm_seconds = _seconds(_configured_product(target), target)

    tiny = te.placeholder((1024,), "float32", name="t")
    launch_seconds = _seconds(_parallel_vectorized(te.compute((1024,), lambda i: tiny[i] + 1.0), tiny, target), target)
    units = {None: (), AVX512: (AVX512,), AMX: (AVX512, AMX)}[bf16_unit(target)]
    bf16_rates, shallow_rates = (
        {unit: _bf16_rate(target, unit, shape) for unit in units} for shape in (_BF16_PRODUCT, _SHALLOW_PRODUCT)
    )
    threads = _threads(target)
    try:
        fma_peak = fma_gflops(threads)
    except (RuntimeError, OSError):  # no gcc, or one without OpenMP: no fraction of peak, nothing else lost
        fma_peak = None
    return Calibration(
        product_gflops=_PRODUCT_FLOPS / gemm_seconds / 1e9,
        bandwidth_gbs=_copy_gbs(_COPY_FLOATS, target),
        launch_seconds=launch_seconds,
        fma_peak_gflops=fma_peak,
        bf16_peak_gflops=bf16_peak(threads)[0],
        bf16_product_gflops=bf16_rates.get(AVX512),
        amx_product_gflops=bf16_rates.get(AMX),
        bf16_shallow_gflops=shallow_rates.get(AVX512),
        amx_shallow_gflops=shallow_rates.get(AMX),
        memory_bandwidth_gbs=_copy_gbs(_streamed_floats(target), target),
    )


def _copy_gbs(floats: int, target: tvm.target.Target) -> float:
    """Bytes read and written per second by a copy of ``floats`` fp32 numbers on every core."""
    x = te.placeholder((floats,), "float32", name="x")
    copy = _parallel_vectorized(te.compute((floats,), lambda i: x[i], name="y"), x, target)
    return 2 * 4 * floats / _seconds(copy, target) / 1e9


def _streamed_floats(target: tvm.target.Target) -> int:
    """Floats each way of the copy from memory: twice the last-level cache (as much as the 64 MB copy where the
    caches are not known), at most ``_MAX_STREAM_BYTES``."""
    facts = MachineFacts.of(target)
    last_level = facts.l3_bytes * facts.cores if facts is not None else 4 * _COPY_FLOATS
    return min(2 * last_level, _MAX_STREAM_BYTES) // 4


def _bf16_rate(target: tvm.target.Target, unit: str, shape: tuple[int, int, int]) -> float:
    """GFLOP/s of the calibration's bf16 product of ``shape`` on ``unit``."""
    return _flops(shape) / _seconds(_configured_product(target, unit, shape), target) / 1e9


def _parallel_vectorized(out: te.Tensor, source: te.Tensor, target: tvm.target.Target) -> tvm.IRModule:
    """An element-wise kernel split into one parallel task per core, each vectorised."""
    sch = tvm.s_tir.Schedule(tvm.IRModule({"main": te.create_prim_func([source, out])}))
    (loop,) = sch.get_loops(sch.get_sblock(out.op.name))
    cores = int(target.attrs.get("num-cores", 1)) or 1
    outer, inner = sch.split(loop, [cores, None])
    sch.parallel(outer)
    _, lanes = sch.split(inner, [None, 16])
    sch.vectorize(lanes)
    return sch.mod


def _seconds(mod: tvm.IRModule, target: tvm.target.Target) -> float:
    """Seconds per call of a kernel, built for ``target`` and timed here: the fastest of its repeats, as
    what is kept for good must be what the machine can do, not what a passing load let it do."""
    with tempfile.TemporaryDirectory(prefix="tuner-calibration-") as scratch:
        library = Path(scratch) / "kernel.so"
        _export(mod, target, library)
        return _fastest(tvm.runtime.load_module(str(library)), _zeros(_argument_specs(mod)))


def _export(mod: tvm.IRModule, target: tvm.target.Target, library: Path) -> None:
    library.parent.mkdir(parents=True, exist_ok=True)
    tvm.compile(mod, target=target).export_library(str(library))


def _argument_specs(mod: tvm.IRModule) -> list:
    """``mod``'s kernel's arguments as [dtype, shape] each, as the measuring worker takes them."""
    return [[str(p.dtype), [int(d) for d in p.shape]] for p in mod["main"].params]


def _zeros(specs: list) -> list[tvm.runtime.Tensor]:
    """Zeroed arguments of these [dtype, shape] ``specs``, on this CPU."""
    return [tvm.runtime.tensor(np.zeros(shape, dtype), tvm.cpu()) for dtype, shape in specs]


def _fastest(module: tvm.runtime.Module, arrays: list[tvm.runtime.Tensor]) -> float:
    """Seconds per call of ``module``'s kernel on ``arrays``: the fastest of its repeats."""
    device = tvm.cpu()
    timer = module.time_evaluator(module.entry_name, device, number=5, repeat=7, min_repeat_ms=20)
    return min(timer(*arrays).results)
