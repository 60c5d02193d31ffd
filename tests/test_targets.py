import pytest
import tvm

from tuner.errors import TargetError
from tuner.targets import describe_target, resolve_target, target_kind


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
