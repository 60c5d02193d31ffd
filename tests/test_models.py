"""Built-in models: built from their PyTorch definitions with random weights, split into tasks, and
(outside CI for the big ones) compiled and checked against PyTorch."""

import numpy as np
import pytest
import tvm
from tvm import relax

from tuner.tasks.extraction import extract_tasks, lower_workload
from workloads import WorkloadError, get_workload, list_workloads

torch = pytest.importorskip("torch")

MODELS = [e.name for e in list_workloads() if e.category == "model"]
EXPECTED = {
    "resnet18",
    "resnet50",
    "mobilenetv2",
    "vgg16",
    "squeezenet1.1",
    "bert-base",
    "llama3-8b-layer",
    "convnext-t",
}


def kernel_launches(mod: tvm.IRModule) -> int:
    """call_tir calls in the fused model's main function: the kernels one run launches."""
    count = 0

    @relax.expr_functor.visitor
    class Counter(relax.PyExprVisitor):
        def visit_call_(self, call):
            nonlocal count
            if isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.call_tir":
                count += 1
            super().visit_call_(call)

    Counter().visit_expr(mod["main"])
    return count


def test_every_required_model_is_registered():
    assert EXPECTED <= set(MODELS)


# The largest three take half the time of all; their structure (bottlenecks, depthwise convolutions, layer norms,
# matmuls, rotary embeddings) is in the others and in test_hf_decoders' Llama too. They still run with -m slow.
_SLOW_MODELS = {"resnet50", "convnext-t", "llama3-8b-layer", "mobilenetv2", "vgg16", "squeezenet1.1"}


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in _SLOW_MODELS else n for n in MODELS])
def test_model_builds_and_its_tasks_add_up_to_its_kernel_launches(name, llvm_target):
    workload = get_workload(name)
    assert workload.kind == "relax" and workload.reference is not None
    lowered = lower_workload(workload, llvm_target)
    tasks = extract_tasks(workload, llvm_target, lowered)
    assert len({t.name for t in tasks}) == len(tasks) >= 1
    assert sum(t.weight for t in tasks) == kernel_launches(lowered)
    assert sum(t.weight * t.flops for t in tasks) > 0


def _check_against_torch(workload, llvm_target, tolerance):
    rng = np.random.default_rng(0)
    spec = workload.inputs[0]
    x = (
        rng.integers(0, 1000, size=spec.shape)
        if spec.dtype.startswith("int")
        else rng.standard_normal(spec.shape).astype(spec.dtype)
    )
    vm = relax.VirtualMachine(tvm.compile(workload.mod, target=llvm_target), tvm.cpu())
    got = vm["main"](tvm.runtime.tensor(x)).numpy().astype(np.float64)
    expected = workload.reference(x).astype(np.float64)
    assert got.shape == expected.shape
    assert np.max(np.abs(got - expected)) / np.max(np.abs(expected)) <= tolerance


def test_tiny_resnet_matches_pytorch(llvm_target):
    _check_against_torch(get_workload("tiny-resnet"), llvm_target, 1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_model_compiles_and_matches_pytorch(name, llvm_target):
    _check_against_torch(get_workload(name), llvm_target, 1e-4)


@pytest.mark.slow
def test_fp16_model_matches_pytorch_within_fp16_precision(llvm_target):
    _check_against_torch(get_workload("resnet18", dtype="float16"), llvm_target, 1e-2)


def test_batch_and_dtype_are_parameters(llvm_target):
    workload = get_workload("tiny-resnet", batch=4, dtype="float16")
    assert workload.name == "tiny-resnet-b4-fp16"
    assert workload.inputs[0].shape == (4, 3, 32, 32)
    conv_tasks = [t for t in extract_tasks(workload, llvm_target) if "conv2d" in t.name]
    assert conv_tasks and all("float16" in t.mod.script() for t in conv_tasks)
    with pytest.raises(WorkloadError, match="positive integer"):
        get_workload("tiny-resnet", batch=0)
    with pytest.raises(WorkloadError, match="float32, float16"):
        get_workload("tiny-resnet", dtype="int8")
    with pytest.raises(WorkloadError, match="fixed shapes"):
        get_workload("matmul-512", batch=2)
