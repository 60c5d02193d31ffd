"""dtype bfloat16 where this CPU's bf16 products are calibrated slower than its float32 ones (an Emerald
Rapids VM with AMX off: ``vdpbf16ps`` products at 174 GFLOP/s, float32 ones at 313): each product in the
precision that runs it faster, the products bound by their arithmetic lowered as in float32."""

from __future__ import annotations

import json
from dataclasses import asdict

import numpy as np
import pytest
import torch
import tvm
from tvm import relax

from common.host import CACHE_DIR_ENV
from tuner.compile.check import precision_tolerance
from tuner.lowering.bf16.precision import ProductPrecision, host_has_bf16, product_precision
from tuner.lowering.bf16.products import Bfloat16Products
from tuner.lowering.options import LoweringOptions
from tuner.spaces import calibration as cal
from tuner.targets import bf16_unit, resolve_target
from tuner.tasks.extraction import computes_in_bf16, load_model, lower_workload

EMERALD_RAPIDS_VM = ProductPrecision(float32_gflops=313.0, bf16_gflops=174.0, bandwidth_gbs=54.0)
needs_bf16_host = pytest.mark.skipif(
    not host_has_bf16(), reason="the choice is made from this CPU's calibration, and this CPU has no bf16 unit"
)


class _ConvAndClassifier(torch.nn.Module):
    """A 3x3 convolution over 16 x 16 (bound by its arithmetic) and a classifier over one row (bound by
    its weights' bytes)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(32, 64, 3, padding=1)
        self.classifier = torch.nn.Linear(64, 1000)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.relu(self.conv(x)).mean(dim=(2, 3)))


class _Conv(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(32, 64, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.conv(x))


def _example() -> list[torch.Tensor]:
    return [torch.randn(1, 32, 16, 16)]


def _bf16_functions(mod: tvm.IRModule) -> set[str]:
    """The kernels of ``mod`` that compute a bf16 product (``bf16_dense``, ``bf16_conv2d``, ``bf16_patches``...)."""
    return {gv.name_hint for gv in mod.functions if "bf16_" in gv.name_hint}


@pytest.fixture
def slow_bf16_machine(tmp_path, monkeypatch) -> tvm.target.Target:
    """This machine's target, with a calibration (in a cache of the test's own) whose bf16 products run at
    0.56 of its float32 ones: the Emerald Rapids VM's figures."""
    target = resolve_target("llvm")
    kept = cal.Calibration(
        313.0, 54.0, 1e-6, 360.0, 348.0, load_per_core=0.0, bf16_product_gflops=174.0, amx_product_gflops=174.0
    )
    (tmp_path / cal.CALIBRATION_FILE).write_text(json.dumps({cal._key(target): asdict(kept)}))
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path))
    return target


def test_a_product_takes_the_precision_that_runs_it_faster() -> None:
    attention_projection = (2 * 128 * 768 * 768, 128 * 768 + 768 * 768)
    classifier_over_one_token = (2 * 768 * 1000, 768 + 768 * 1000)
    assert not EMERALD_RAPIDS_VM.in_bf16(*attention_projection)  # 4.8 us in float32, 8.7 in bf16
    assert EMERALD_RAPIDS_VM.in_bf16(*classifier_over_one_token)  # its weights: 57 us in float32, 28 in bf16
    twice_as_fast = ProductPrecision(float32_gflops=313.0, bf16_gflops=626.0, bandwidth_gbs=54.0)
    assert twice_as_fast.in_bf16(*attention_projection) and twice_as_fast.in_bf16(*classifier_over_one_token)


def test_a_product_bound_by_its_arithmetic_stays_in_float32_and_one_bound_by_its_weights_goes_bf16() -> None:
    builder = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 16, 16, 32), "float32"))
    with builder.function("main", [x]):
        with builder.dataflow():
            conv = relax.op.nn.conv2d(
                x, relax.const(np.ones((3, 3, 32, 64), np.float32)), data_layout="NHWC", kernel_layout="HWIO"
            )
            pooled = builder.emit(relax.op.mean(builder.emit(conv), axis=[1, 2]))
            out = builder.emit_output(relax.op.matmul(pooled, relax.const(np.ones((64, 1000), np.float32))))
        builder.emit_func_output(out)
    mod = builder.get()
    unit = bf16_unit(tvm.target.Target({"kind": "llvm", "mcpu": "emeraldrapids"}))
    chosen = Bfloat16Products(unit, precision=EMERALD_RAPIDS_VM)(mod).script()
    assert "relax.nn.conv2d(x, metadata" in chosen.replace("R.", "relax.")  # the float32 convolution as it was
    assert "bf16_dense" in chosen and "bf16_conv2d" not in chosen
    everywhere = Bfloat16Products(unit)(mod).script()
    assert "bf16_dense" in everywhere and "bf16_conv2d" in everywhere


@needs_bf16_host
def test_where_bf16_products_are_calibrated_slower_the_arithmetic_bound_ones_lower_as_in_float32(
    slow_bf16_machine,
) -> None:
    assert product_precision(slow_bf16_machine) == ProductPrecision(313.0, 174.0, 54.0)
    workload = load_model(_ConvAndClassifier(), _example(), dtype="bfloat16")
    chosen = _bf16_functions(lower_workload(workload, slow_bf16_machine, LoweringOptions(bfloat16=True)))
    assert chosen and all("dense" in name for name in chosen), chosen  # the classifier alone
    as_before = LoweringOptions(bfloat16=True, bf16_where_faster=False)
    everywhere = _bf16_functions(lower_workload(workload, slow_bf16_machine, as_before))
    assert any("dense" not in name for name in everywhere), everywhere


@needs_bf16_host
def test_a_model_of_both_precisions_is_checked_end_to_end_and_right(slow_bf16_machine, tmp_path) -> None:
    import tuner

    model = _ConvAndClassifier().eval()
    x = _example()
    result = tuner.tune(model, example_inputs=x, target="llvm", dtype="bfloat16", trials=0, work_dir=tmp_path / "wd")
    assert result.check.ok, result.summary()
    assert any("bf16_dense" in task.name for task in result.tasks), result.summary()
    assert not any("bf16_conv2d" in task.name for task in result.tasks), result.summary()
    got = result.run(x[0].numpy())
    got = np.asarray(got[0] if isinstance(got, list | tuple) else got)
    with torch.no_grad():
        expected = model(*x).numpy()
    assert np.abs(got - expected).max() < 3e-2 * np.abs(expected).max()


@needs_bf16_host
def test_a_bf16_model_with_every_product_faster_in_float32_is_checked_as_a_float32_one(slow_bf16_machine, tmp_path):
    import tuner

    model, x = _Conv().eval(), _example()
    workload = load_model(model, x, dtype="bfloat16")
    assert not computes_in_bf16(lower_workload(workload, slow_bf16_machine, LoweringOptions(bfloat16=True)))
    assert workload.precision == "float32"
    result = tuner.tune(model, example_inputs=x, target="llvm", dtype="bfloat16", trials=0, work_dir=tmp_path / "wd")
    assert result.check.ok and result.check.tolerance == precision_tolerance("float32"), result.summary()
    assert result.check.error < 1e-5, result.summary()  # against PyTorch, in fp32


def test_a_bf16_model_for_a_cpu_with_no_bf16_unit_computes_as_a_float32_one() -> None:
    haswell = resolve_target("llvm -mcpu=haswell")
    workload = load_model(_ConvAndClassifier(), _example(), dtype="bfloat16")
    assert not computes_in_bf16(lower_workload(workload, haswell, LoweringOptions(bfloat16=True)))
    assert workload.precision == "float32"
    storage = load_model(_ConvAndClassifier(), _example(), dtype="bfloat16")  # fp32 arithmetic from bf16 storage
    assert computes_in_bf16(lower_workload(storage, haswell, LoweringOptions(bfloat16=True, bf16_where_faster=False)))
