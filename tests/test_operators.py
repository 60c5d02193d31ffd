"""Every built-in operator, built with TVM's default schedule, computes what its NumPy reference does."""

import numpy as np
import pytest
import tvm
from tvm.s_tir.analysis import estimate_tir_flops

from workloads import get_workload, list_workloads

OPERATORS = [e.name for e in list_workloads() if e.category == "operator"]
# Unscheduled kernels run at about 1 GFLOP/s here: the big ones are checked outside CI.
_SLOW = {name for name in OPERATORS if estimate_tir_flops(get_workload(name).mod) > 0.5e9}


def random_inputs(workload, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.uniform(-1, 1, size=spec.shape).astype(spec.dtype) for spec in workload.inputs]


def relative_error(got: np.ndarray, expected: np.ndarray) -> float:
    expected = np.asarray(expected, dtype=np.float64)
    return float(np.max(np.abs(got.astype(np.float64) - expected)) / max(1e-30, np.max(np.abs(expected))))


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in _SLOW else n for n in OPERATORS])
def test_operator_matches_its_reference(name, llvm_target):
    workload = get_workload(name)
    arrays = random_inputs(workload)
    lib = tvm.compile(workload.mod, target=llvm_target)
    tensors = [tvm.runtime.tensor(a) for a in arrays]
    lib["main"](*tensors)
    expected = workload.reference(*arrays[:-1])
    assert expected.shape == arrays[-1].shape
    tolerance = 1e-2 if "float16" in {s.dtype for s in workload.inputs} else 1e-4
    assert relative_error(tensors[-1].numpy(), expected) <= tolerance


def test_each_family_has_three_real_shapes_with_sources():
    families = {}
    for entry in list_workloads():
        if entry.category == "operator" and not entry.name.endswith("-fp16") and entry.family != "matmul":
            families.setdefault(entry.family, []).append(entry)
    expected = {
        "conv1d", "conv2d", "conv3d", "depthwise conv2d", "grouped conv2d", "conv2d_transpose", "dense (small batch)",
        "dense (large batch)", "batch_matmul", "matmul (LLM)", "softmax", "pooling", "epilogue",
    }  # fmt: skip
    assert expected <= set(families)
    for family, entries in families.items():
        if family in ("layer_norm", "rms_norm"):
            continue
        assert len(entries) >= 3, family
        assert all(len(e.source) > 20 for e in entries)
    assert len(families["layer_norm"]) + len(families["rms_norm"]) >= 3
    groups = {get_workload(e.name).mod["main"].params[1].shape[1] for e in families["grouped conv2d"]}
    assert len(groups) >= 3  # several group counts


def test_tensor_core_operators_come_in_fp16():
    fp16 = [e.name for e in list_workloads() if e.name.endswith("-fp16")]
    for family in ("matmul-llama2", "dense-", "batch-matmul-", "conv2d-"):
        assert any(name.startswith(family) for name in fp16), family
    workload = get_workload("matmul-llama2-7b-qproj-fp16")
    assert [s.dtype for s in workload.inputs] == ["float16", "float16", "float32"]
