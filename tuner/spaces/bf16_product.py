"""The TE compute of a bfloat16 product by a packed weight, annotated for the design spaces of ``bf16_rule``:
what the bf16 lowering puts in a model (``tuner.lowering.bf16.kernels``), what the calibration measures on
each bf16 unit (``calibration``), what the bf16 tests build.
"""

from __future__ import annotations

import math

from tvm import te

from codegen.bf16_dot import AVX512, LANES, PAIR

from .bf16_rule import BF16_GEMM_RULE, UNIT_ANNOTATION
from .metaschedule import FLOPS_ANNOTATION


def gemm_attrs(flops: float, unit: str) -> dict:
    """A bf16 product's block annotations: ``bf16_rule``'s design spaces, on ``unit``, of ``flops`` a launch."""
    return {"schedule_rule": BF16_GEMM_RULE, UNIT_ANNOTATION: unit, FLOPS_ANNOTATION: flops}


def product_flops(data: te.Tensor, packed: te.Tensor) -> float:
    """The multiply-adds of ``data`` [..., R, K] times the weight packed [N/16, K/2, 16, 2], twice."""
    *lead, k_extent = (int(d) for d in data.shape)
    return 2.0 * math.prod(lead) * int(packed.shape[0]) * LANES * k_extent


def packed_product(
    data: te.Tensor, packed: te.Tensor, unit: str = AVX512, flops: float | None = None, name: str = "bf16_dense"
) -> te.Tensor:
    """``data`` [..., R, K] (bf16) times the weight packed [N/16, K/2, 16, 2] (bf16): [..., R, N] in fp32,
    computed on ``unit`` (``flops``: what the product counts for, by default its own multiply-adds)."""
    *lead, k_extent = (int(d) for d in data.shape)
    n_extent = int(packed.shape[0]) * LANES
    k = te.reduce_axis((0, k_extent), "k")
    if flops is None:
        flops = product_flops(data, packed)
    return te.compute(
        (*lead, n_extent),
        lambda *i: te.sum(
            data[(*i[:-1], k)].astype("float32")
            * packed[i[-1] // LANES, k // PAIR, i[-1] % LANES, k % PAIR].astype("float32"),
            axis=k,
        ),
        name=name,
        attrs=gemm_attrs(flops, unit),
    )
