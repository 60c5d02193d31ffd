"""Single-operator workloads, defined with TVM's tensor expressions at shapes from real models."""

from __future__ import annotations

import tvm
from tvm import te, topi

from .registry import register
from .workload import Workload, prim_func_inputs


def prim_func_workload(name: str, func: tvm.tirx.PrimFunc, description: str) -> Workload:
    """Wrap a PrimFunc as a workload whose inputs are the function's buffer arguments."""
    func = func.with_attr("global_symbol", "main")
    return Workload(name=name, kind="tir", mod=tvm.IRModule({"main": func}), inputs=prim_func_inputs(func), description=description)


def matmul(m: int, n: int, k: int, dtype: str = "float32") -> tvm.tirx.PrimFunc:
    """C[m, n] = A[m, k] @ B[k, n]."""
    a = te.placeholder((m, k), dtype, name="A")
    b = te.placeholder((k, n), dtype, name="B")
    r = te.reduce_axis((0, k), name="k")
    c = te.compute((m, n), lambda i, j: te.sum(a[i, r] * b[r, j], axis=r), name="C")
    return te.create_prim_func([a, b, c])


def conv2d_nchw(
    n: int, c: int, h: int, w: int, k: int, kernel: int, stride: int, pad: int, dtype: str = "float32"
) -> tvm.tirx.PrimFunc:
    """A 2-D convolution in NCHW layout with a KCRS weight."""
    data = te.placeholder((n, c, h, w), dtype, name="data")
    weight = te.placeholder((k, c, kernel, kernel), dtype, name="weight")
    out = topi.nn.conv2d_nchw(data, weight, stride, pad, dilation=1, out_dtype=dtype)
    return te.create_prim_func([data, weight, out])


def _square_matmul(size: int, use: str):
    def build() -> Workload:
        return prim_func_workload(f"matmul-{size}", matmul(size, size, size), f"{size}x{size}x{size} fp32 matmul ({use})")

    return build


for _size, _use in ((128, "small: quick checks"), (512, "the standard CPU benchmark GEMM"), (1024, "the standard GPU benchmark GEMM")):
    register(f"matmul-{_size}", "operator", "square GEMM benchmark shape")(_square_matmul(_size, _use))


@register("conv2d-resnet18-l2", "operator", "ResNet-18 layer2, 3x3 conv 128->128 at 28x28")
def _conv2d_resnet18_l2() -> Workload:
    return prim_func_workload(
        "conv2d-resnet18-l2",
        conv2d_nchw(1, 128, 28, 28, 128, kernel=3, stride=1, pad=1),
        "ResNet-18 layer2 3x3 convolution, batch 1, 128->128 channels, 28x28, fp32",
    )
