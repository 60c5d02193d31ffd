"""Importers for user models: round trips with matching numbers, and one clear error per bad input."""

import subprocess
import sys

import numpy as np
import pytest
import tvm
from onnx_models import save_det_model
from tvm import relax

from workloads import WorkloadError, load_workload

torch = pytest.importorskip("torch")


class SmallNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.fc = torch.nn.Linear(8, 5)

    def forward(self, x):
        return self.fc(torch.relu(self.conv(x)).mean(dim=(2, 3)))


def _run(workload, *inputs):
    vm = relax.VirtualMachine(tvm.compile(workload.mod, target="llvm"), tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(x) for x in inputs])
    return out.numpy() if hasattr(out, "numpy") else out[0].numpy()


def test_torch_round_trip():
    torch.manual_seed(0)
    net = SmallNet().eval()
    workload = load_workload(net, example_inputs=[(2, 3, 16, 16)])
    x = np.random.rand(2, 3, 16, 16).astype("float32")
    np.testing.assert_allclose(_run(workload, x), net(torch.from_numpy(x)).detach().numpy(), rtol=1e-4, atol=1e-5)


def test_a_torch_module_in_half_precision_computes_its_convolutions_and_matmuls_in_fp16():
    torch.manual_seed(0)
    net = SmallNet().eval()
    workload = load_workload(net, example_inputs=[(2, 3, 16, 16)], dtype="float16")
    assert workload.name.endswith("-fp16") and [s.dtype for s in workload.inputs] == ["float32"]
    text = workload.mod.script()
    assert "R.nn.conv2d(" in text and 'dtype="float16"' in text  # operands cast to fp16, accumulated in fp32
    x = np.random.rand(2, 3, 16, 16).astype("float32")
    expected = net(torch.from_numpy(x)).detach().numpy()
    np.testing.assert_allclose(_run(workload, x), expected, rtol=2e-2, atol=2e-3)


class ConvNormReLU6(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.norm = torch.nn.BatchNorm2d(8)
        with torch.no_grad():  # an eval-mode norm that is not the identity
            self.norm.running_mean.uniform_(-1, 1)
            self.norm.running_var.uniform_(0.5, 2)

    def forward(self, x):
        return torch.nn.functional.relu6(self.norm(self.conv(x)))


def test_in_half_precision_batch_norms_fold_and_a_relu6_becomes_constant_bounds():
    """Folded before the mixed-precision pass, where the cast behind each convolution would hide
    the norm from folding; ReLU6's scalar bounds, which that pass cannot type, become constants."""
    torch.manual_seed(0)
    net = ConvNormReLU6().eval()
    text = load_workload(net, example_inputs=[(1, 3, 16, 16)], dtype="float16").mod.script()
    assert "batch_norm" not in text and "R.clip" not in text and "R.minimum" in text
    x = np.random.rand(1, 3, 16, 16).astype("float32")
    got = _run(load_workload(net, example_inputs=[(1, 3, 16, 16)], dtype="float16"), x)
    np.testing.assert_allclose(got, net(torch.from_numpy(x)).detach().numpy(), rtol=2e-2, atol=2e-2)


def test_a_precision_for_a_prim_func_or_an_unknown_one_is_refused():
    from workloads.operators import matmul

    with pytest.raises(WorkloadError, match="a PrimFunc computes in its buffers' dtypes"):
        load_workload(matmul(16, 16, 16), dtype="float16")
    with pytest.raises(WorkloadError, match="model dtype must be one of float32, float16, bfloat16, got 'int8'"):
        load_workload(SmallNet().eval(), example_inputs=[(1, 3, 8, 8)], dtype="int8")


def _export_onnx(net, path, dynamic_batch=False):
    pytest.importorskip("onnx")
    axes = {"x": {0: "batch"}} if dynamic_batch else None
    torch.onnx.export(net, (torch.randn(1, 3, 16, 16),), str(path), input_names=["x"], dynamic_axes=axes, dynamo=False)
    return path


def test_onnx_round_trip(tmp_path):
    torch.manual_seed(0)
    net = SmallNet().eval()
    workload = load_workload(str(_export_onnx(net, tmp_path / "net.onnx")))
    assert workload.kind == "relax" and workload.inputs[0].shape == (1, 3, 16, 16)
    x = np.random.rand(1, 3, 16, 16).astype("float32")
    np.testing.assert_allclose(_run(workload, x), net(torch.from_numpy(x)).detach().numpy(), rtol=1e-4, atol=1e-5)


def test_onnx_symbolic_dimensions_need_shapes(tmp_path):
    path = _export_onnx(SmallNet().eval(), tmp_path / "dyn.onnx", dynamic_batch=True)
    with pytest.raises(WorkloadError, match="dynamic dimension .*example_inputs"):
        load_workload(str(path))
    assert load_workload(str(path), example_inputs=[(4, 3, 16, 16)]).inputs[0].shape == (4, 3, 16, 16)
    with pytest.raises(WorkloadError, match="size 0"):
        load_workload(str(path), example_inputs=[(0, 3, 16, 16)])


def test_a_file_that_is_not_onnx(tmp_path):
    pytest.importorskip("onnx")
    bad = tmp_path / "broken.onnx"
    bad.write_bytes(b"\x08\x07garbage that is not a protobuf" * 10)
    with pytest.raises(WorkloadError, match="not a valid ONNX model"):
        load_workload(str(bad))
    with pytest.raises(WorkloadError, match="does not exist"):
        load_workload(str(tmp_path / "missing.onnx"))


def test_unsupported_onnx_operator_is_named(tmp_path):
    pytest.importorskip("onnx")
    with pytest.raises(WorkloadError, match="does not support: Det"):
        load_workload(str(save_det_model(tmp_path / "det.onnx")))


def test_unsupported_torch_operator_is_named():
    class InverseErf(torch.nn.Module):
        def forward(self, x):
            return torch.special.erfinv(x)

    with pytest.raises(WorkloadError, match="does not support: .*erfinv"):
        load_workload(InverseErf(), example_inputs=[(4, 4)])


def test_example_inputs_that_do_not_fit_the_module():
    with pytest.raises(WorkloadError, match=r"example inputs \[\(2, 7, 'float32'\)\] do not fit"):
        load_workload(SmallNet(), example_inputs=[(2, 7)])


def test_a_missing_extra_is_named():
    code = (
        "import sys; sys.modules['onnx'] = None\n"
        "from workloads import load_workload, WorkloadError\n"
        "try:\n    load_workload('x.onnx')\nexcept WorkloadError as e:\n    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout
    assert "pip install 'tensor-tuner[onnx]'" in out
