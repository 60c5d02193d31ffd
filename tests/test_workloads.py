import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tvm
from tvm import relax, te

from workloads import WorkloadError, get_workload, list_workloads, load_workload


def test_registry_lists_operators_and_models():
    names = {e.name for e in list_workloads()}
    assert {"matmul-512", "conv2d-resnet18-l2", "tiny-resnet"} <= names
    assert all(e.source for e in list_workloads())


def test_load_workload_alone_sees_every_builtin_in_a_fresh_process():
    """The package's lookups come from workloads.catalog, which imports every module that registers a
    built-in workload: load_workload, imported by itself, finds operators and models by name."""
    probe = (
        "from workloads import load_workload; from workloads.registry import list_workloads; "
        "print(load_workload('matmul-128').name, sorted({e.category for e in list_workloads()}))"
    )
    root = Path(__file__).resolve().parent.parent
    run = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=root)
    assert run.stdout.split(maxsplit=1) == ["matmul-128", "['model', 'operator']\n"], run.stderr


def test_unknown_name_suggests_the_closest():
    with pytest.raises(WorkloadError, match="did you mean 'matmul-512'|Did you mean 'matmul-512'"):
        get_workload("matmul-51")


def test_matmul_workload_matches_numpy(llvm_target):
    workload = get_workload("matmul-128")
    assert [s.shape for s in workload.inputs] == [(128, 128)] * 3
    lib = tvm.compile(workload.mod, target=llvm_target)
    a, b = np.random.rand(128, 128).astype("float32"), np.random.rand(128, 128).astype("float32")
    c = tvm.runtime.tensor(np.zeros((128, 128), "float32"))
    lib["main"](tvm.runtime.tensor(a), tvm.runtime.tensor(b), c)
    np.testing.assert_allclose(c.numpy(), a @ b, rtol=1e-4)


def _elementwise(shape):
    a = te.placeholder(shape, name="a")
    b = te.compute(shape, lambda *i: a(*i) * 2.0, name="b")
    return te.create_prim_func([a, b])


def test_prim_func_and_ir_module_import():
    func = _elementwise((4, 8))
    assert load_workload(func, name="double").kind == "tir"
    assert load_workload(tvm.IRModule({"main": func})).inputs[0].shape == (4, 8)


def test_dynamic_shapes_are_refused_with_the_fix():
    with pytest.raises(WorkloadError, match="dynamic dimension .*static shapes"):
        load_workload(_elementwise((te.var("n"), 8)))


def test_zero_sized_dimensions_are_refused():
    with pytest.raises(WorkloadError, match="size 0"):
        load_workload(_elementwise((0, 8)))


def test_unsupported_objects_name_what_is_accepted():
    with pytest.raises(WorkloadError, match="PrimFunc"):
        load_workload(3.14)


def test_torch_module_needs_example_inputs_and_imports_with_them():
    torch = pytest.importorskip("torch")

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(16, 4)

        def forward(self, x):
            return torch.relu(self.fc(x))

    net = Net()
    with pytest.raises(WorkloadError, match="example_inputs"):
        load_workload(net)
    workload = load_workload(net, example_inputs=[(2, 16)])
    assert workload.kind == "relax" and workload.inputs[0].shape == (2, 16)
    x = np.random.rand(2, 16).astype("float32")
    vm = relax.VirtualMachine(tvm.compile(workload.mod, target="llvm"), tvm.cpu())
    out = vm["main"](tvm.runtime.tensor(x))
    out = out.numpy() if hasattr(out, "numpy") else out[0].numpy()
    np.testing.assert_allclose(out, net(torch.from_numpy(x)).detach().numpy(), rtol=1e-4, atol=1e-5)
