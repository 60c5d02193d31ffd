"""Float32 products by constant weights on FMA micro-kernels of ours (measure/fma_dot.py,
tuner/lowering/fma_products.py): what a tile computes, the weight's packing, the weight prefetches of a
tile that re-reads its slice, a model's linear layers lowered and tuned end to end, and where the
lowering is off."""

from __future__ import annotations

import re

import numpy as np
import pytest
import tvm
from bf16_builds import run_built, te_module
from lowered_models import error_against_torch
from tvm import te
from tvm.s_tir import TensorIntrin

import tuner
from measure import fma_dot
from measure.host import cpu_flags
from measure.tensor_cores import ensure_intrinsics_of
from measure.weight_prefetch import DISABLE_ENV, tir_pipeline
from tuner.bf16_rule import _tile
from tuner.lowering import LoweringOptions, inference_passes
from tuner.lowering.fma_products import FmaProducts, fma_dense, pack_fma_weight, takes_fma_products
from tuner.targets import resolve_target
from tuner.tasks import lower_workload
from workloads import load_workload

torch = pytest.importorskip("torch")
needs_avx512 = pytest.mark.skipif(
    "avx512f" not in (cpu_flags() or set()), reason="this CPU has no AVX-512 (16-lane FMAs)"
)


def _built(m: int, k: int, n: int, rows: int, vectors: int, seed: int = 1) -> tvm.runtime.Executable:
    data = te.placeholder((m, k), "float32", name="data")
    packed = te.placeholder((-(-n // 16), k, 16), "float32", name="packed")
    sch = tvm.s_tir.Schedule(te_module([data, packed, fma_dense(data, packed)]), seed=seed)
    _tile(sch, sch.get_sblock("fma_dense"), rows, vectors, fma_dot.FMA)
    target = resolve_target("llvm")
    with target:
        return tvm.compile(sch.mod, target=target, tir_pipeline=tir_pipeline(target))


def _arrays(m: int, k: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)


@needs_avx512
@pytest.mark.parametrize(("rows", "vectors"), [(1, 1), (1, 3), (3, 2), (4, 4)])
def test_micro_kernels_compute_the_product_numpy_computes(rows: int, vectors: int) -> None:
    m, k, n = 12, 37, 192
    built = _built(m, k, n, rows, vectors)
    assert re.search(r"vfmadd\d+ps", built.mod.inspect_source("asm"))
    data, weight = _arrays(m, k, n)
    out = run_built(built, [data, pack_fma_weight(weight)], (m, n))
    np.testing.assert_allclose(out, data.astype(np.float64) @ weight, rtol=1e-5, atol=1e-4)


def test_the_weight_is_packed_sixteen_outputs_together_and_padded_with_zero_outputs() -> None:
    weight = np.arange(5 * 40, dtype=np.float32).reshape(5, 40)
    packed = pack_fma_weight(weight)
    assert packed.shape == (3, 5, 16)
    assert packed[2, 4, 7] == weight[4, 39] and packed[1, 3, 0] == weight[3, 16]
    assert not packed[2, :, 8:].any()


@needs_avx512
def test_a_tile_re_reading_its_weight_slice_asks_for_the_next_tasks_slice_and_computes_the_same(monkeypatch):
    data, weight = _arrays(128, 256, 256)
    expected = data.astype(np.float64) @ weight
    for prefetching, setting in ((True, "1"), (False, "0")):
        monkeypatch.setenv(DISABLE_ENV, setting)
        built = _built(128, 256, 256, 4, 4, seed=2)
        assert (built.mod.inspect_source("asm").count("prefetch") > 0) == prefetching
        np.testing.assert_allclose(
            run_built(built, [data, pack_fma_weight(weight)], (128, 256)), expected, rtol=1e-5, atol=1e-4
        )


def test_a_stored_trace_naming_a_tile_registers_it_in_a_new_process() -> None:
    name = fma_dot.intrinsic_name(5, 2, 48)
    assert TensorIntrin.get(name, allow_missing=True) is None
    ensure_intrinsics_of(f'[["Tensorize", [0], ["{name}", 1]]]')
    assert TensorIntrin.get(name, allow_missing=True) is not None
    assert not fma_dot.register_if_ours("tensor_tuner_bf16_r5_v2_p48")


class _Block(torch.nn.Module):
    def __init__(self, width: int = 64, hidden: int = 40):
        super().__init__()
        self.up, self.down = torch.nn.Linear(width, hidden), torch.nn.Linear(hidden, width)

    def forward(self, x):
        return x + self.down(torch.nn.functional.gelu(self.up(x)))


def _kernels(lowered: tvm.IRModule) -> list[str]:
    return [gv.name_hint for gv, f in lowered.functions.items() if isinstance(f, tvm.tirx.PrimFunc)]


@needs_avx512
def test_linear_layers_over_197_tokens_are_fma_products_over_padded_rows_and_compute_what_pytorch_computes():
    torch.manual_seed(0)
    model = _Block().eval()
    lowered = lower_workload(load_workload(model, [(1, 197, 64)]), resolve_target("llvm"))
    products = [name for name in _kernels(lowered) if "fma_dense" in name]
    assert len(products) == 2 and not [name for name in _kernels(lowered) if "matmul" in name], _kernels(lowered)
    script = "".join(lowered[name].script() for name in products)
    assert "T.int64(198)" in script and "T.int64(48)" in script  # rows padded, 40 outputs computed over 48
    x = np.random.default_rng(1).standard_normal((1, 197, 64)).astype("float32")
    assert error_against_torch(model, lowered, resolve_target("llvm"), x) < 1e-5


def test_products_stay_metaschedule_s_without_avx512_in_bf16_off_and_for_work_dirs_that_predate_them():
    def fma(options: LoweringOptions, target: str = "llvm") -> bool:
        return any(isinstance(p, FmaProducts) for p in inference_passes(options, resolve_target(target)))

    assert takes_fma_products(resolve_target("llvm -mcpu=skylake-avx512"))
    assert not takes_fma_products(resolve_target("llvm -mcpu=haswell"))
    assert not fma(LoweringOptions(), "llvm -mcpu=haswell")
    assert not fma(LoweringOptions(), "cuda -arch=sm_90")
    assert not fma(LoweringOptions(bfloat16=True), "llvm -mcpu=skylake-avx512")  # bf16 products are bf16 ones
    assert not fma(LoweringOptions(fma_products=False), "llvm -mcpu=skylake-avx512")
    assert fma(LoweringOptions(), "llvm -mcpu=skylake-avx512")
    before = {k: v for k, v in LoweringOptions().as_dict().items() if k != "fma_products"}
    assert LoweringOptions.from_record(before).fma_products is False


@needs_avx512
def test_a_model_tuned_in_fp32_computes_its_linear_layers_on_the_micro_kernel_and_matches_pytorch(tmp_path):
    torch.manual_seed(0)
    model, x = _Block().eval(), torch.randn(1, 24, 64)
    result = tuner.tune(model, example_inputs=[x], target="llvm", trials_per_task=3, work_dir=tmp_path / "wd")
    products = [task for task in result.tasks if "fma_dense" in task.name]
    assert len(products) == 2, result.summary()
    assert all(task.verified and not task.fell_back for task in products if task.trials), result.summary()
    assert result.check.ok and result.check.error < 1e-5, result.summary()
    with torch.no_grad():
        expected = model(x).numpy()
    got = np.asarray(result.run(x.numpy()))
    assert np.max(np.abs(got - expected)) <= 1e-5 * np.max(np.abs(expected))
