"""CUDA code builds into real sm_90 binaries on a machine without a GPU (nvcc or NVRTC, and a
stand-in driver): the right architecture, the kernels, a module TVM loads; tensor cores for
half-precision GEMMs."""

import re
import shutil
import subprocess

import pytest
import tvm
from cuda_compilers import COMPILE_MODES

from costmodel import CandidateFeatures, CostModel
from measure import DeviceUnavailable, EngineConfig, MeasureEngine, MeasureInput
from measure.cuda import compile_env
from measure.cuda.artifact import gpu_binaries
from measure.cuda.compile_env import (
    COMPILE_MODE_ENV,
    NVRTC_INSTALL,
    NVRTC_OPTIONS_ENV,
    WHEEL_CUDA_HEADERS,
    CudaBuildEnvError,
    choose_compile_mode,
    nvrtc_available,
    nvrtc_env,
    nvrtc_version,
)
from measure.cuda.runtime import nvidia_wheel_file
from tuner.search.task_search import TaskSearch
from tuner.spaces import metaschedule as msc
from tuner.targets import resolve_target
from workloads import get_workload
from workloads.operators import matmul

pytestmark = pytest.mark.skipif(
    shutil.which("nvcc") is None and not nvrtc_available() and not tvm.cuda(0).exist, reason="needs the CUDA toolkit"
)


def assert_loads_as_sm90(engine: MeasureEngine, artifact, kernels=("main_kernel",)) -> None:
    """The library holds an sm_90 cubin with ``kernels``, and TVM loads its CUDA module with them."""
    binaries = gpu_binaries(artifact)
    assert [(b.kind, b.arch) for b in binaries] == [("cubin", "sm_90")], binaries
    assert set(kernels) <= set(binaries[0].kernels)
    loaded = engine.load_cuda_artifact(artifact, list(binaries[0].kernels))
    assert loaded["format"] == "cubin" and sorted(loaded["kernels"]) == sorted(binaries[0].kernels)


def test_search_proposes_valid_gpu_schedules_and_they_build_to_cubins(tmp_path):
    target = resolve_target("cuda -arch=sm_90")
    mod = get_workload("matmul-128").mod
    search = TaskSearch(mod, target, seed=3, cost_model=CostModel(), features=CandidateFeatures(), group="mm")
    candidates = search.propose(3)
    assert len(candidates) == 3
    with MeasureEngine(target, tmp_path, EngineConfig(build_workers=2)) as engine:
        built = list(engine.build([MeasureInput(c.key, c.mod) for c in candidates]))
        assert all(b.ok for b in built), [b.error for b in built]
        for b in built:  # artifacts live as long as the engine
            assert_loads_as_sm90(engine, b.artifact)
            assert b.args == [["float32", [128, 128]]] * 3


@pytest.mark.parametrize(
    "name", ["matmul-llama2-7b-qproj-fp16", "conv2d-resnet50-l3", "softmax-bert-base-attn", "layernorm-bert-base"]
)
def test_operators_build_for_sm90_with_tvms_default_gpu_schedules(name, tmp_path):
    workload = get_workload(name)
    engine = MeasureEngine(resolve_target("cuda -arch=sm_90"), tmp_path, EngineConfig(build_workers=1))
    try:
        artifact = engine.compile_program(tmp_path / "op.so", mod=workload.mod, kind="tir", schedules=[])
        assert_loads_as_sm90(engine, artifact, kernels=())
        assert gpu_binaries(artifact)[0].kernels
    finally:
        engine.close()


@pytest.mark.parametrize("mode", COMPILE_MODES)
def test_each_compile_path_builds_sm90_kernels_and_the_run_log_says_which(mode, tmp_path, monkeypatch):
    monkeypatch.setenv(COMPILE_MODE_ENV, mode)
    import faulty

    with MeasureEngine(resolve_target("cuda -arch=sm_90"), tmp_path, EngineConfig(build_workers=1)) as engine:
        (built,) = engine.build([MeasureInput("copy", faulty.gpu_copy())])
        assert built.ok, built.error
        assert_loads_as_sm90(engine, built.artifact)
    assert f"CUDA compile: {mode} ({COMPILE_MODE_ENV}={mode}" in (tmp_path / "logs" / "engine.log").read_text()
    assert f"CUDA compile mode: {mode} " in (tmp_path / "logs" / "builder-0.log").read_text()


def test_the_compile_path_is_chosen_on_purpose(monkeypatch):
    monkeypatch.delenv(COMPILE_MODE_ENV, raising=False)
    chosen = choose_compile_mode()
    assert chosen.mode == ("nvrtc" if nvrtc_available() else "nvcc")  # NVRTC where installed, whatever else is
    monkeypatch.setenv(COMPILE_MODE_ENV, "ptxas")
    with pytest.raises(CudaBuildEnvError, match="set it to nvcc or nvrtc"):
        choose_compile_mode()
    if not nvrtc_available():
        monkeypatch.setenv(COMPILE_MODE_ENV, "nvrtc")
        with pytest.raises(CudaBuildEnvError, match=re.escape(NVRTC_INSTALL)):
            choose_compile_mode()


@pytest.mark.skipif(shutil.which("nvcc") is None or not nvrtc_available(), reason="needs nvcc and NVRTC")
def test_nvrtc_newer_than_the_gpu_driver_is_passed_over_for_nvcc(monkeypatch):
    monkeypatch.delenv(COMPILE_MODE_ENV, raising=False)
    major, minor = (int(part) for part in nvrtc_version().split(".")[:2])
    monkeypatch.setattr(compile_env, "driver_cuda_version", lambda: major * 1000 + minor * 10)
    assert choose_compile_mode().mode == "nvrtc"
    older = major * 1000 + (minor - 1) * 10 if minor else (major - 1) * 1000 + 90
    monkeypatch.setattr(compile_env, "driver_cuda_version", lambda: older)
    chosen = choose_compile_mode()
    assert chosen.mode == "nvcc" and f"NVRTC {nvrtc_version()} is newer than the CUDA" in chosen.why


needs_wheel_headers = pytest.mark.skipif(
    nvrtc_version() is None or nvidia_wheel_file(f"{WHEEL_CUDA_HEADERS}/cuda_runtime.h") is None,
    reason=f"needs NVRTC and the CUDA headers' wheels ({NVRTC_INSTALL})",
)


@needs_wheel_headers
def test_without_a_toolkit_nvrtc_is_chosen_and_pointed_at_the_wheels_headers(monkeypatch):
    """TVM looks for libcu++ only in a toolkit's layout: the wheels' CCCL folder is handed over as a flag."""
    monkeypatch.setattr(compile_env, "cuda_home", lambda: None)
    monkeypatch.setattr(compile_env, "nvcc_path", lambda: None)
    monkeypatch.delenv(COMPILE_MODE_ENV, raising=False)
    monkeypatch.setenv(NVRTC_OPTIONS_ENV, "--ftz=false")
    assert choose_compile_mode().mode == "nvrtc"
    root = nvidia_wheel_file(f"{WHEEL_CUDA_HEADERS}/cuda_runtime.h").parents[1]
    assert nvrtc_env() == {"CUDA_PATH": str(root), NVRTC_OPTIONS_ENV: f"--ftz=false -I{root / 'include' / 'cccl'}"}


@needs_wheel_headers
def test_nvrtc_builds_against_the_wheels_headers_alone(tmp_path, monkeypatch):
    """With $CUDA_PATH at the wheels' headers (as where no toolkit is installed), half-precision code builds."""
    import faulty

    root = nvidia_wheel_file(f"{WHEEL_CUDA_HEADERS}/cuda_runtime.h").parents[1]
    monkeypatch.setenv("CUDA_PATH", str(root))
    monkeypatch.setenv(COMPILE_MODE_ENV, "nvrtc")
    with MeasureEngine(resolve_target("cuda -arch=sm_90"), tmp_path, EngineConfig(build_workers=1)) as engine:
        (built,) = engine.build([MeasureInput("copy", faulty.gpu_copy(dtype="float16"))])
        assert built.ok, built.error
        assert_loads_as_sm90(engine, built.artifact)
    assert f"headers of {root}" in (tmp_path / "logs" / "builder-0.log").read_text()


@pytest.mark.slow  # over a minute and a half on 2 cores: out of CI (`pytest -m slow`)
def test_fp16_matmuls_for_sm90_are_tensorized_into_mma_instructions(tmp_path):
    """MetaSchedule's tensor-core rules (ours: tuner.spaces.metaschedule.tensor_core_rules) for a
    half-precision GEMM: every candidate builds, its CUDA code calls WMMA, and nvcc turns that
    into PTX mma instructions. Its trace replays in a build worker, as the final compile does."""
    target = resolve_target("cuda -arch=sm_90")
    mod = msc.normalize_prim_func_module(matmul(512, 512, 512, "float16"))
    assert (
        msc.rules_kind(target, mod) == "cuda-tensorcore"
        and msc.rules_kind(resolve_target("cuda -arch=sm_75"), mod) == "cuda"
    )
    search = TaskSearch(mod, target, seed=2, cost_model=CostModel(), features=CandidateFeatures(), group="mm16")
    candidates = search.propose(3)
    assert len(candidates) == 3 and all('"Tensorize"' in c.trace_json for c in candidates)
    with MeasureEngine(target, tmp_path, EngineConfig(build_workers=1)) as engine:
        built = list(engine.build([MeasureInput(c.key, c.mod) for c in candidates]))
        assert all(b.ok for b in built), [b.error for b in built]
        assert_loads_as_sm90(engine, built[0].artifact)
        source = engine.cuda_source(candidates[0].mod)
        assert "wmma::mma_sync" in source
        if shutil.which("nvcc"):
            (tmp_path / "kernel.cu").write_text(source)
            subprocess.run(
                ["nvcc", "--ptx", "-arch=sm_90", "-o", str(tmp_path / "kernel.ptx"), str(tmp_path / "kernel.cu")],
                check=True,
            )
            assert re.search(
                r"\bwmma\.mma\.sync\.aligned\.\w+\.\w+\.m16n16k16\.f32\.f32", (tmp_path / "kernel.ptx").read_text()
            )
        replayed = engine.compile_program(
            tmp_path / "tuned.so", mod=mod, kind="tir", schedules=[(mod, candidates[0].trace_json)]
        )
        assert_loads_as_sm90(engine, replayed)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="counts registers with nvcc")
def test_the_out_of_resources_kernel_needs_more_registers_than_a_1024_thread_block_has(tmp_path):
    """What makes its launch fail on a GPU: no launch bound caps its registers, and it uses more
    than 65536 / 1024 = 64 per thread."""
    import faulty

    with MeasureEngine(resolve_target("cuda -arch=sm_90"), tmp_path, EngineConfig(build_workers=1)) as engine:
        source = engine.cuda_source(faulty.gpu_out_of_resources())
    assert "__maxnreg__(255)" in source and "__launch_bounds__" not in source
    (tmp_path / "oor.cu").write_text(source)
    out = subprocess.run(
        [
            "nvcc",
            "-cubin",
            "-arch=sm_90",
            "--resource-usage",
            "-o",
            str(tmp_path / "oor.cubin"),
            str(tmp_path / "oor.cu"),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    registers = int(re.search(r"Used (\d+) registers", out.stdout + out.stderr).group(1))
    assert registers * 1024 > 65536


@pytest.mark.skipif(tvm.cuda(0).exist, reason="a GPU is present")
def test_a_measuring_worker_without_a_gpu_starts_and_says_what_is_missing(tmp_path):
    """Its start-up tries to create the CUDA context; without a device the first request says why."""
    import faulty

    with MeasureEngine(resolve_target("cuda -arch=sm_90"), tmp_path, EngineConfig(build_workers=1)) as engine:
        builds = list(engine.build([MeasureInput("copy", faulty.gpu_copy())]))
        with pytest.raises(DeviceUnavailable, match="no NVIDIA driver|no CUDA GPU|libcudart"):
            list(engine.measure_built(builds))


def test_an_illegal_memory_access_is_recorded_and_the_next_candidate_measures(tmp_path):
    """Builds here; measures where a GPU is present (the CUDA context of the measuring worker is
    lost after the fault, so the worker must be replaced)."""
    import faulty

    from measure import Status

    target = resolve_target("cuda -arch=sm_90" if not tvm.cuda(0).exist else "cuda")
    inputs = [MeasureInput("illegal", faulty.gpu_out_of_bounds()), MeasureInput("good", faulty.gpu_copy())]
    with MeasureEngine(target, tmp_path, EngineConfig(build_workers=1)) as engine:
        built = list(engine.build(inputs))
        assert all(b.ok for b in built), [b.error for b in built]
        if not tvm.cuda(0).exist:
            pytest.skip("built; measuring needs a GPU")
        results = {r.key: r for r in engine.measure_built(built)}
    assert (
        results["illegal"].status in (Status.RUN_ERROR, Status.RUN_CRASH)
        and "illegal" in results["illegal"].error.lower()
    )
    assert results["good"].ok
