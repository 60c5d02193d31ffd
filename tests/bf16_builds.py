"""What the bf16 tests share: which units this CPU has, TE products built and run."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import tvm
from tvm import te

from codegen.bf16_dot import AMX, AVX512
from common.host import host_has_amx
from tuner.lowering.bf16.precision import host_has_bf16
from tuner.lowering.options import LoweringOptions
from tuner.spaces.bf16_product import packed_product
from tuner.spaces.bf16_rule import _tile
from tuner.targets import resolve_target

needs_bf16 = pytest.mark.skipif(not host_has_bf16(), reason="this CPU has no AVX512_BF16 (vdpbf16ps)")
needs_amx = pytest.mark.skipif(not host_has_amx(), reason="this CPU has no AMX (tdpbf16ps)")
# each bf16 unit, run where this CPU has it
EACH_UNIT = [pytest.param(AVX512, marks=needs_bf16), pytest.param(AMX, marks=needs_amx)]
# every product a bf16 one, as on a CPU whose bf16 products are the faster: on one whose calibration says they are
# the slower, the products bound by their arithmetic would be lowered in fp32 (``tuner.lowering.bf16.precision``)
BF16_THROUGHOUT = LoweringOptions(bfloat16=True, bf16_where_faster=False)


def tuned_in_bf16(model, x, trials_per_task: int, work_dir):
    """``tune()`` of ``model`` on this CPU in bf16, every product a bf16 one (``BF16_THROUGHOUT``)."""
    import tuner

    return tuner.tune(
        model,
        example_inputs=[x],
        target="llvm",
        dtype="bfloat16",
        trials_per_task=trials_per_task,
        work_dir=work_dir,
        lowering=BF16_THROUGHOUT,
    )


def te_module(tensors: list[te.Tensor]) -> tvm.IRModule:
    return tvm.IRModule({"main": te.create_prim_func(tensors).with_attr("global_symbol", "main")})


def dense_module(m: int, n: int, k: int) -> tvm.IRModule:
    data = te.placeholder((m, k), "bfloat16", name="data")
    packed = te.placeholder((n // 16, k // 2, 16, 2), "bfloat16", name="packed")
    return te_module([data, packed, packed_product(data, packed, name="gemm")])


def bf16_array(shape: tuple[int, ...], seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(ml_dtypes.bfloat16)


def built_tiled(mod: tvm.IRModule, block: str, rows: int, vectors: int, unit: str = AVX512) -> tvm.runtime.Module:
    """``mod`` with its product ``block`` tiled ``rows`` x ``vectors`` on ``unit``, built for this CPU."""
    sch = tvm.s_tir.Schedule(mod, seed=1)
    _tile(sch, sch.get_sblock(block), rows, vectors, unit)
    return tvm.compile(sch.mod, target=resolve_target("llvm"))


def torch_conv_nhwc(image: np.ndarray, weight: np.ndarray, stride: int = 1, padding: int = 0) -> np.ndarray:
    """PyTorch's fp32 convolution of an NHWC image by an HWIO weight (their values as float32), NHWC."""
    import torch

    return (
        torch.nn.functional.conv2d(
            torch.from_numpy(image.astype(np.float32)).permute(0, 3, 1, 2),
            torch.from_numpy(weight.astype(np.float32)).permute(3, 2, 0, 1),
            stride=stride,
            padding=padding,
        )
        .permute(0, 2, 3, 1)
        .numpy()
    )


def run_built(built: tvm.runtime.Module, arrays: list[np.ndarray], out_shape: tuple[int, ...]) -> np.ndarray:
    dev = tvm.cpu()
    out = tvm.runtime.tensor(np.zeros(out_shape, np.float32), dev)
    built["main"](*(tvm.runtime.tensor(a, dev) for a in arrays), out)
    return out.numpy()
