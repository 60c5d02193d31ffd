"""``tuner doctor``: what a user runs first on a new machine. One line per component, each OK or
the fix, and whether each target can be tuned here.

The checks: TVM (and the tvm-ffi version it needs), TVM's CUDA runtime (and why it does not load),
the GPUs TVM sees, NVML and the counters it gives, the CUDA compiler (a kernel is compiled to
prove it), Ray and the cluster it would join, the CPU with the ``mcpu`` LLVM targets, and the machine's
facts and calibration that analytic schedules are derived from.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

from common.error_text import error_line

TARGETS = ("llvm", "cuda")
_BROKEN_FFI = "0.1.15"  # serializing TVM modules segfaults with it (see the install requirements)


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # "OK", "WARN" (works, with less) or "FAIL"
    text: str  # the finding, or what is wrong and the fix
    blocks: frozenset[str] = field(default_factory=frozenset)  # targets a FAIL keeps from being tuned

    def line(self, width: int) -> str:
        return f"{self.status:<4}  {self.name:<{width}}  {self.text}"


def _ok(name: str, text: str) -> Check:
    return Check(name, "OK", text)


def _warn(name: str, text: str) -> Check:
    return Check(name, "WARN", text)


def _fail(name: str, text: str, *targets: str) -> Check:
    return Check(name, "FAIL", text, frozenset(targets))


def check_tvm() -> list[Check]:
    import tvm

    ffi = _version("apache-tvm-ffi")
    if ffi.startswith(_BROKEN_FFI):
        return [
            _fail(
                "TVM",
                f"apache-tvm-ffi {ffi} crashes serializing TVM modules: pip install apache-tvm-ffi==0.1.14.post1",
                *TARGETS,
            )
        ]
    if getattr(tvm, "_RUNTIME_ONLY", False):
        return [
            _fail(
                "TVM",
                f"{tvm.__version__} runtime only (no compiler library, or TVM_USE_RUNTIME_LIB=1): this host can time "
                "built kernels but not tune",
                *TARGETS,
            )
        ]
    return [_ok("TVM", f"{tvm.__version__} with its compiler (tvm-ffi {ffi})")]


def check_cuda() -> tuple[list[Check], list[str]]:
    """TVM's CUDA runtime, then one line per GPU it sees (arch, L2, memory); and the GPUs' archs."""
    import tvm

    from measure.cuda.runtime import driver_cuda_version, no_gpu_reason, runtime_problem, visible_gpu_count

    problem = runtime_problem()
    if problem:
        return [_fail("CUDA runtime", problem, "cuda")], []
    version = driver_cuda_version()
    checks = [
        _ok(
            "CUDA runtime",
            f"TVM's CUDA runtime loads; the driver supports CUDA {version // 1000}.{version % 1000 // 10}"
            if version
            else "TVM's CUDA runtime loads",
        )
    ]
    gpus = [tvm.cuda(i) for i in range(visible_gpu_count())]
    gpus = [dev for dev in gpus if dev.exist]
    if not gpus:
        return checks + [_fail("GPU", no_gpu_reason(), "cuda")], []
    archs = ["sm_" + dev.compute_version.replace(".", "") for dev in gpus]
    for index, (dev, arch) in enumerate(zip(gpus, archs, strict=True)):
        l2 = (dev.l2_cache_size_bytes or 0) / 2**20
        memory = (dev.total_global_memory or 0) / 2**30
        checks.append(_ok(f"GPU {index}", f"{dev.device_name}, {arch}, L2 {l2:.0f} MiB, {memory:.0f} GiB"))
    return checks, archs


def check_nvml() -> list[Check]:
    from measure.nvml import NvmlMonitor

    monitor = NvmlMonitor()
    try:
        if not monitor.available:
            return [
                _warn(
                    "NVML",
                    f"not available ({monitor.unavailable}): GPU energy and health are not recorded, energy budgets "
                    "are refused",
                )
            ]
        if monitor.missing:
            return [_warn("NVML", monitor.describe().removeprefix("NVML: "))]
        return [_ok("NVML", monitor.describe().removeprefix("NVML: "))]
    finally:
        monitor.close()


def check_cuda_compiler(arch: str) -> list[Check]:
    """The compile path the build workers will use, proven by compiling a kernel for ``arch``."""
    from measure.cuda.compile_env import CudaBuildEnvError, choose_compile_mode

    try:
        mode = choose_compile_mode()
    except CudaBuildEnvError as err:
        return [_fail("CUDA compiler", str(err), "cuda")]
    try:
        _compile_probe(mode.mode, arch)
    except Exception as err:  # noqa: BLE001 - any compiler failure is the finding
        why = error_line(err, last=True)  # the compiler's output comes after the kernel's source
        return [_fail("CUDA compiler", f"{mode.describe()} cannot compile for {arch}: {why}", "cuda")]
    return [_ok("CUDA compiler", f"{mode.describe()}; compiles for {arch}")]


def _compile_probe(mode: str, arch: str) -> None:
    import tvm
    from tvm.support import nvcc

    from common.environment import environment
    from measure.cuda.compile_env import nvrtc_env

    # the headers a build worker points NVRTC at (measure.cuda.compile_env.prepare_cuda_build_env)
    with environment(nvrtc_env() if mode == "nvrtc" else {}):
        with tvm.target.Target({"kind": "cuda", "arch": arch}):
            nvcc.compile_cuda(
                'extern "C" __global__ void probe(float* x) { x[threadIdx.x] += 1.0f; }', "cubin", compiler=mode
            )


def check_ray(address: str | None) -> list[Check]:
    """Ray's version, and the cluster `--cluster` would join: the one named, $RAY_ADDRESS, or the
    last one started on this machine."""
    from measure.cluster.engine import ClusterUnavailable, check_reachable

    version = _version("ray")
    if not version:
        return (
            [_fail("Ray", "not installed: pip install 'ray[client]==2.60.0'", *TARGETS)]
            if address
            else [_warn("Ray", "not installed: only this machine's workers can be used")]
        )
    where, source = address, "--cluster"
    if where is None and os.environ.get("RAY_ADDRESS"):
        where, source = os.environ["RAY_ADDRESS"], "RAY_ADDRESS"
    if where is None:
        latest = Path(tempfile.gettempdir(), "ray", "ray_current_cluster")
        if latest.is_file() and latest.read_text().strip():
            where, source = latest.read_text().strip(), "the last cluster started on this machine"
    if where is None:
        return [
            _ok(
                "Ray",
                f"{version}; no cluster to join (no RAY_ADDRESS, none started here): tuning uses this machine, "
                "`--cluster local` starts a private cluster",
            )
        ]
    if where in ("auto", "local"):
        return [_ok("Ray", f"{version}; would use {where!r} (from {source})")]
    try:
        check_reachable(where)
    except ClusterUnavailable as err:
        fix = f"{err}: start it with `ray start --head`, or give another address"
        return (
            [_fail("Ray", f"{version}; cannot join {where} (from {source}): {fix}", *TARGETS)]
            if address
            else [_warn("Ray", f"{version}; {fix}")]
        )
    return [_ok("Ray", f"{version}; would join {where} (from {source}), which answers")]


def check_cpu() -> list[Check]:
    import tvm

    from common.host import cpu_model, physical_cores
    from tuner.targets import host_feature_corrections

    mcpu = tvm.target.codegen.llvm_get_system_cpu()
    corrections = host_feature_corrections(mcpu)
    added = [c for c in corrections if c.startswith("+")]
    removed = [c for c in corrections if c.startswith("-")]
    text = f"{cpu_model()}, {physical_cores()} physical cores, mcpu={mcpu}"
    if added:
        text += f" (with {','.join(added)}: this CPU has them, LLVM's name for it does not)"
    if removed:
        text += f" (with {','.join(removed)}: LLVM's name for this CPU has them, the CPU does not offer them)"
    if mcpu in ("", "generic"):
        return [
            _warn(
                "CPU",
                f"{text}: LLVM does not know this CPU, so kernels get no vector extensions; give one with --target "
                "'llvm -mcpu=NAME'",
            )
        ]
    return [_ok("CPU", text), check_machine(), check_bf16_cpu()]


def check_machine() -> Check:
    """What the analytic schedules are derived from (registers, caches, cores), what this machine's
    kernels were measured to reach (measured once, a few seconds, then kept), and how fast it runs now
    against that (a VM's speed drifts with its neighbours)."""
    from tuner.spaces.calibration import calibration, machine_speed
    from tuner.spaces.machine import MachineFacts
    from tuner.targets import resolve_target

    target = resolve_target("llvm")
    facts = MachineFacts.of(target)
    if facts is None:
        return _warn("machine", "no FMA on this CPU: kernels without a tuned schedule keep TVM's default ones")
    speed = machine_speed(target)
    now = f"; running now at {speed:.2f} of that speed" if speed else ""
    return _ok("machine", f"{facts.describe()}; {calibration(target).describe()}{now}")


def check_bf16_cpu() -> Check:
    """Whether ``dtype="bfloat16"`` runs fast here (the CPU's bf16 dot product, AVX512_BF16)."""
    from common.host import host_has_amx
    from tuner.lowering.bf16.precision import host_has_bf16, slow_bf16_products
    from tuner.targets import resolve_target

    has = host_has_bf16()
    if has is None:
        return _warn("bfloat16", "cannot read /proc/cpuinfo: whether this CPU has AVX512_BF16 is unknown")
    if has and host_has_amx():
        return _ok("bfloat16", "AMX: dtype bfloat16 computes its products on the CPU's tile unit (tdpbf16ps)")
    if has:
        slow = slow_bf16_products(resolve_target("llvm"))
        what = "AVX512_BF16: dtype bfloat16 computes with the CPU's bf16 dot product (vdpbf16ps)"
        return _warn("bfloat16", f"{what}, but {slow}") if slow else _ok("bfloat16", what)
    return _warn(
        "bfloat16",
        "no AVX512_BF16: dtype bfloat16 computes as float32 here (faster than fp32 arithmetic from bf16 storage)",
    )


def run_checks(targets: Sequence[str] = TARGETS, ray_address: str | None = None) -> list[Check]:
    checks = check_tvm()
    if "cuda" in targets:
        cuda, archs = check_cuda()
        checks += cuda + check_nvml() + check_cuda_compiler(archs[0] if archs else "sm_90")  # sm_90: an H100's
    checks += check_ray(ray_address)
    if "llvm" in targets:
        checks += check_cpu()
    return checks


def verdicts(checks: Sequence[Check], targets: Sequence[str]) -> dict[str, list[str]]:
    """For each target, the names of the failed checks that keep it from being tuned (none: it can be)."""
    return {target: [c.name for c in checks if c.status == "FAIL" and target in c.blocks] for target in targets}


def doctor(targets: Sequence[str] = TARGETS, ray_address: str | None = None, out: Callable[[str], None] = print) -> int:
    """Print the checks and a verdict per target; 0 if every target can be tuned here, else 1."""
    checks = run_checks(targets, ray_address)
    width = max(len(c.name) for c in checks)
    for check in checks:
        out(check.line(width))
    blocked = verdicts(checks, targets)
    for target, reasons in blocked.items():
        out(
            f"{target}: " + ("can be tuned here" if not reasons else f"cannot be tuned here (see {', '.join(reasons)})")
        )
    return 0 if not any(blocked.values()) else 1


def _version(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return ""
