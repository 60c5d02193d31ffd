"""Single-operator workloads: the operator families of the DOPpler evaluation.

Each is at shapes taken from real models (the ``source`` of each says which model and layer). TVM's own operator
definitions (TOPI) describe the computation; ``reference`` recomputes it with NumPy.

fp32 everywhere; operators with a tensor-core path on CUDA (matmul, dense, batch_matmul,
conv2d) are also registered as ``NAME-fp16``: fp16 inputs, fp32 accumulation and output.

One module per family; importing this package registers every case (``workloads.catalog``
imports it).
"""

from __future__ import annotations

from functools import partial

from ..registry import register
from . import convolution, epilogues, gemm, normalization, pooling
from .case import ACCUMULATE, Compute, OperatorCase, prim_func_workload
from .convolution import conv2d_nchw, conv2d_transpose_compute, conv_compute
from .epilogues import bias_activation_compute, swiglu_compute
from .gemm import batch_matmul_compute, dense_compute, matmul, matmul_compute
from .normalization import layer_norm_compute, rms_norm_compute, softmax_compute
from .pooling import global_avg_pool_compute, pool_compute

__all__ = [
    "ACCUMULATE",
    "CASES",
    "Compute",
    "OperatorCase",
    "batch_matmul_compute",
    "bias_activation_compute",
    "conv2d_nchw",
    "conv2d_transpose_compute",
    "conv_compute",
    "dense_compute",
    "global_avg_pool_compute",
    "layer_norm_compute",
    "matmul",
    "matmul_compute",
    "pool_compute",
    "prim_func_workload",
    "rms_norm_compute",
    "softmax_compute",
    "swiglu_compute",
]

CASES: list[OperatorCase] = [
    *convolution.CASES,
    *gemm.CASES,
    *normalization.CASES,
    *pooling.CASES,
    *epilogues.CASES,
]


def _register(case: OperatorCase) -> None:
    register(case.name, "operator", case.source, family=case.family)(case.workload)
    if case.fp16:
        register(f"{case.name}-fp16", "operator", case.source + " (fp16)", family=case.family)(
            partial(case.workload, "float16")
        )


for _case in [*CASES, *gemm.SQUARE_MATMULS]:
    _register(_case)
