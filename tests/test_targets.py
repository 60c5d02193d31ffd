import pytest
import tvm

from codegen.bf16_dot import AMX, AVX512
from tuner.errors import NoDeviceError, TargetError
from tuner.targets import (
    bf16_unit,
    describe_target,
    features_not_offered,
    host_feature_corrections,
    require_device,
    resolve_target,
    target_kind,
)


def test_plain_llvm_means_the_host_cpu_with_its_vector_units():
    target = resolve_target("llvm")
    assert target.kind.name == "llvm"
    assert target.attrs["mcpu"] == tvm.target.codegen.llvm_get_system_cpu()
    assert int(target.attrs["num-cores"]) >= 1


@pytest.mark.parametrize(
    "spec, expected",
    [
        ("llvm -num-cores 4", {"num-cores": 4}),
        ("llvm -mcpu=skylake-avx512 -num-cores=3", {"mcpu": "skylake-avx512", "num-cores": 3}),
        ({"kind": "llvm", "num-cores": 2}, {"num-cores": 2}),
        ("cuda -arch=sm_90", {"arch": "sm_90"}),
        ("cuda -arch sm_80 -max_threads_per_block=512", {"arch": "sm_80", "max_threads_per_block": 512}),
    ],
)
def test_old_style_strings_and_dicts_are_translated(spec, expected):
    target = resolve_target(spec)
    for key, value in expected.items():
        assert target.attrs[key] == value


def test_cuda_targets_get_the_limits_the_gpu_verifier_needs():
    target = resolve_target("cuda -arch=sm_90")
    for key in ("max_shared_memory_per_block", "max_threads_per_block", "thread_warp_size"):
        assert int(target.attrs[key]) > 0
    assert target.host is not None and target.host.kind.name == "llvm"


def test_tags_are_accepted():
    assert resolve_target("nvidia/nvidia-h100").attrs["arch"] == "sm_90a"


@pytest.mark.parametrize("spec", ["", "opencl", "llvm -bogus=3", "foo/bar", 42, "llvm num-cores", '{"kind": "llvm"}'])
def test_invalid_targets_say_what_to_write_instead(spec):
    with pytest.raises(TargetError) as err:
        resolve_target(spec)
    assert "'llvm'" in str(err.value) or "-key=value" in str(err.value) or "dict" in str(err.value)


@pytest.mark.skipif(tvm.cuda(0).exist, reason="a GPU answers for the architecture")
def test_bare_cuda_without_a_gpu_asks_for_an_architecture():
    with pytest.raises(TargetError, match="-arch=sm_90"):
        resolve_target("cuda")


def test_kind_and_description():
    assert target_kind("cuda -arch=sm_90") == "cuda"
    assert target_kind({"kind": "llvm"}) == "llvm"
    assert target_kind(str(resolve_target("cuda -arch=sm_90"))) == "cuda"  # the JSON form records store
    assert describe_target(resolve_target("cuda -arch=sm_90")) == "cuda -arch=sm_90"
    assert describe_target(resolve_target("llvm -mcpu=znver4 -num-cores=2")) == "llvm -mcpu=znver4 -num-cores=2"


# /proc/cpuinfo's vector flags of a 2-core Emerald Rapids VM with AMX off (2026-12-06)
EMERALD_RAPIDS_FLAGS = set(
    "avx2 fma f16c avx512f avx512dq avx512cd avx512bw avx512vl avx512ifma avx512vbmi avx512_vbmi2 avx512_vnni "
    "avx512_bitalg avx512_vpopcntdq avx512_fp16 avx512_bf16 avx_vnni".split()
)
AMX_FLAGS = {"amx_tile", "amx_bf16", "amx_int8"}


def test_the_host_target_adds_the_features_its_cpu_has_and_llvm_s_name_for_it_lacks() -> None:
    # a hypervisor that reports a Sapphire Rapids as model 167 makes LLVM call it a Rocket Lake
    flags = EMERALD_RAPIDS_FLAGS | AMX_FLAGS
    assert host_feature_corrections("rocketlake", flags) == [
        "+avx512fp16",
        "+avx512bf16",
        "+amx-tile",
        "+amx-bf16",
        "+amx-int8",
        "+avxvnni",
    ]
    assert host_feature_corrections("sapphirerapids", flags) == []
    target = tvm.target.Target(
        {"kind": "llvm", "mcpu": "rocketlake", "mattr": ["+avx512bf16", "+amx-tile", "+amx-bf16"]}
    )
    assert bf16_unit(target) == AMX
    assert bf16_unit(tvm.target.Target({"kind": "llvm", "mcpu": "znver4"})) == AVX512
    assert bf16_unit(tvm.target.Target({"kind": "llvm", "mcpu": "rocketlake"})) is None


def test_the_host_target_removes_what_llvm_s_name_has_and_the_cpu_does_not_offer() -> None:
    # an Emerald Rapids VM with AMX off: LLVM names it by its model, AMX included, and a tile instruction
    # stopped `tuner doctor` with SIGILL
    corrections = host_feature_corrections("emeraldrapids", EMERALD_RAPIDS_FLAGS)
    assert corrections == ["-amx-tile", "-amx-bf16", "-amx-int8"]
    target = tvm.target.Target({"kind": "llvm", "mcpu": "emeraldrapids", "mattr": corrections})
    assert bf16_unit(target) == AVX512
    assert host_feature_corrections("emeraldrapids", set()) == []  # flags unknown: LLVM's name stands
    # a hypervisor that hides AVX-512: removing AVX-512F takes every AVX-512 feature with it
    avx2_only = host_feature_corrections("skylake-avx512", {"avx2", "fma", "f16c"})
    assert avx2_only[0] == "-avx512f"
    hidden = tvm.target.Target({"kind": "llvm", "mcpu": "skylake-avx512", "mattr": avx2_only})
    assert not tvm.target.codegen.target_has_features("avx512bw", hidden)
    assert tvm.target.codegen.target_has_features("avx2", hidden)


def test_the_host_s_own_cpu_name_means_this_cpu_and_a_cpu_it_cannot_run_is_refused() -> None:
    host = tvm.target.codegen.llvm_get_system_cpu()
    assert describe_target(resolve_target(f"llvm -mcpu={host}")) == describe_target(resolve_target("llvm"))
    kept = resolve_target(f"llvm -mcpu={host} -mattr=+amx-tile")  # a feature the user names stays as named
    assert "+amx-tile" in kept.attrs["mattr"] and "-amx-tile" not in kept.attrs["mattr"]

    sapphire = tvm.target.Target({"kind": "llvm", "mcpu": "sapphirerapids"})
    assert features_not_offered(sapphire, EMERALD_RAPIDS_FLAGS) == ["amx-tile", "amx-bf16", "amx-int8"]
    assert features_not_offered(sapphire, EMERALD_RAPIDS_FLAGS | AMX_FLAGS) == []
    assert features_not_offered(tvm.target.Target({"kind": "llvm", "mcpu": "haswell"}), EMERALD_RAPIDS_FLAGS) == []
    aarch64 = tvm.target.Target({"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mcpu": "cortex-a72"})
    assert features_not_offered(aarch64, EMERALD_RAPIDS_FLAGS) == []  # another architecture's: not ours to judge

    beyond = next(
        (name for name in ("sapphirerapids", "znver5") if features_not_offered(resolve_target(f"llvm -mcpu={name}"))),
        None,
    )
    if beyond is not None:  # this CPU lacks something of it: one line before anything is built
        with pytest.raises(NoDeviceError, match="illegal instruction"):
            require_device(f"llvm -mcpu={beyond}")
    require_device("llvm")
