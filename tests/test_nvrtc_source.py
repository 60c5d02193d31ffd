"""NVRTC compiles TVM's CUDA sources without the libcu++ type traits they do not use: the same machine code,
and the build workers do it."""

import difflib

import pytest

from experiments.harness import sample_candidates
from measure import EngineConfig, MeasureEngine
from measure.cuda.artifact import elf_sections, elf_symbols, gpu_binaries
from measure.cuda.compile_env import COMPILE_MODE_ENV, NVRTC_INSTALL, nvrtc_env, nvrtc_missing
from measure.cuda.nvrtc_source import SPLIT_COMPILE, nvrtc_options, without_unused_type_traits
from tuner.targets import resolve_target

TARGET = "cuda -arch=sm_90"
WORKLOADS = ("matmul-128", "matmul-llama2-7b-qproj-fp16")  # fp32, and fp16 on tensor cores
TYPE_TRAITS = "#include <cuda/std/type_traits>"
TRAITS = ("is_same", "is_same_v", "is_integral", "is_signed", "is_unsigned", "is_floating_point", "enable_if")
ALIASES = [f"using cuda::std::{name};" for name in (*TRAITS, "conditional")]
LIBCUXX = "_ZN4cuda3std"  # the mangled prefix of libcu++'s names: its constants end up in the cubin

pytestmark = pytest.mark.skipif(nvrtc_missing() is not None, reason=f"{nvrtc_missing()} ({NVRTC_INSTALL})")


@pytest.fixture(scope="module")
def candidates(tmp_path_factory) -> dict[str, tuple]:
    """A searched candidate of each workload and the CUDA C TVM generates for it."""
    target = resolve_target(TARGET)
    with MeasureEngine(target, tmp_path_factory.mktemp("sources"), EngineConfig(build_workers=1)) as engine:
        picked = {name: sample_candidates(name, target, 1, seed=3)[0] for name in WORKLOADS}
        return {name: (candidate, engine.cuda_source(candidate.mod)) for name, candidate in picked.items()}


def nvrtc_cubin(code: str, monkeypatch, options: list[str] | None = None) -> bytes:
    for key, value in nvrtc_env().items():
        monkeypatch.setenv(key, value)
    from tvm.support import nvcc

    return bytes(nvcc.compile_cuda(code, target_format="cubin", arch="sm_90", compiler="nvrtc", options=options))


def machine_code(cubin: bytes) -> dict[str, bytes]:
    return {name: text for name, text in elf_sections(cubin).items() if name.startswith(".text.")}


def libcuxx_symbols(cubin: bytes) -> set[str]:
    return {symbol for symbol in elf_symbols(cubin) if symbol.startswith(LIBCUXX)}


def test_tvms_sources_lose_the_type_traits_include_and_nothing_else(candidates):
    for name, (_, source) in candidates.items():
        lean = without_unused_type_traits(source)
        changes = [op for op in difflib.SequenceMatcher(None, source.splitlines(), lean.splitlines()).get_opcodes()]
        removed = [source.splitlines()[i1:i2] for op, i1, i2, _, _ in changes if op != "equal"]
        assert [op for op, *_ in changes if op != "equal"] == ["delete"], name
        assert [line.strip() for line in removed[0]] == [TYPE_TRAITS, "namespace std {", *ALIASES, "}"], name


def test_a_source_naming_one_of_the_traits_keeps_them():
    block = f"{TYPE_TRAITS}\nnamespace std {{\n  using cuda::std::is_same;\n  using cuda::std::enable_if;\n}}\n"
    uses = "template <typename T> __device__ int f() { return std::is_same<T, float>::value; }\n"
    assert without_unused_type_traits(block + uses) == block + uses
    assert without_unused_type_traits(block + "int x;\n") == "int x;\n"
    assert without_unused_type_traits("int x;\n") == "int x;\n"


def test_nvrtc_makes_the_same_machine_code_from_the_lean_source(candidates, monkeypatch):
    for name, (_, source) in candidates.items():
        whole, lean = (nvrtc_cubin(code, monkeypatch) for code in (source, without_unused_type_traits(source)))
        assert machine_code(whole) and machine_code(whole) == machine_code(lean), name
        assert libcuxx_symbols(lean) < libcuxx_symbols(whole), name  # the traits' constants are gone


def test_build_workers_compile_with_nvrtc_from_the_lean_source(candidates, tmp_path, monkeypatch):
    candidate, source = candidates["matmul-128"]
    monkeypatch.setenv(COMPILE_MODE_ENV, "nvrtc")
    with MeasureEngine(resolve_target(TARGET), tmp_path, EngineConfig(build_workers=1)) as engine:
        (built,) = engine.build([candidate])
        assert built.ok, built.error
        (cubin,) = gpu_binaries(built.artifact)
    assert cubin.kernels == ("main_kernel",)
    assert libcuxx_symbols(cubin.image) == libcuxx_symbols(nvrtc_cubin(without_unused_type_traits(source), monkeypatch))
    assert libcuxx_symbols(cubin.image) != libcuxx_symbols(nvrtc_cubin(source, monkeypatch))


TWO_KERNELS = """
extern "C" __global__ void __launch_bounds__(64) scale(float* __restrict__ a) { a[threadIdx.x] *= 2.0f; }
extern "C" __global__ void __launch_bounds__(64, 2) shift(float* __restrict__ a, float b) {
  for (int i = 0; i < 16; ++i) a[threadIdx.x * 16 + i] += b * i;
}
"""


def test_a_module_of_several_kernels_is_optimised_on_every_core_into_the_same_machine_code(monkeypatch):
    assert nvrtc_options(TWO_KERNELS) == [SPLIT_COMPILE]
    assert nvrtc_options(TWO_KERNELS.split("\n")[1]) is None  # one kernel: nothing to split
    alone, split = (nvrtc_cubin(TWO_KERNELS, monkeypatch, options) for options in (None, [SPLIT_COMPILE]))
    assert sorted(machine_code(alone)) == [".text.scale", ".text.shift"]
    assert machine_code(alone) == machine_code(split)
