"""A model's convolutions and matmuls by constant weights computed from bfloat16 operands into
float32 accumulators; everything else stays float32, and so do the model's inputs and outputs.

Each such operator reads its activation cast to bf16 (the cast fuses into the kernel that produces
the activation, so activations travel between kernels in bf16 where a product reads them) and its
weight converted once, here. On a CPU with AVX512_BF16 the weight is packed [N/16, K/2, 16, 2]
(convolutions [KH, KW, N/16, C/2, 16, 2]) and the product is a kernel of ours whose schedule uses
the micro-kernels of ``vdpbf16ps``, or of AMX's ``tdpbf16ps`` where the CPU has it (``tuner.bf16_rule``;
an odd channel count gets a zero channel, the outputs zero ones up to a multiple of 16, sliced off
after). Elsewhere, and for the products those
kernels do not take (grouped and dilated convolutions, an odd reduction in a matmul), Relax's own
operator with bf16 operands and a float32 result: bf16 storage, fp32 arithmetic, as PyTorch computes
bf16 on such CPUs. Matmuls of two activations (attention's) stay float32.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import tvm
from tvm import relax, te
from tvm.ir.expr import Constant
from tvm.ir.module import IRModule
from tvm.relax import Call, Expr, PyExprMutator, expr_functor

from measure.amx_dot import TILE_PAIRS
from measure.bf16_dot import AMX, AVX512, LANES, PAIR
from workloads.relax_functions import rewrite_functions

from ..bf16_rule import BF16_GEMM_RULE, UNIT_ANNOTATION, padded_rows
from ..metaschedule import FLOPS_ANNOTATION
from .rewrites import conv2d_like, op_name, static_shape

BF16 = "bfloat16"
_F32 = "float32"
AMX_MIN_REDUCTION = PAIR * TILE_PAIRS  # one whole step of AMX's micro-kernel


def _bf16(array: np.ndarray) -> np.ndarray:
    return array.astype(np.float32).astype(ml_dtypes.bfloat16)


def _padded(weight: np.ndarray, axis: int, multiple: int) -> np.ndarray:
    """``weight`` with zeros appended along ``axis`` up to a multiple of ``multiple``."""
    missing = -weight.shape[axis] % multiple
    if not missing:
        return weight
    widths = [(0, 0)] * weight.ndim
    widths[axis] = (0, missing)
    return np.pad(weight, widths)


def pack_dense_weight(weight: np.ndarray) -> np.ndarray:
    """[K, N] -> [N/16, K/2, 16, 2] (N padded with zero outputs to a multiple of 16)."""
    weight = _padded(weight, 1, LANES)
    k, n = weight.shape
    return np.ascontiguousarray(weight.reshape(k // PAIR, PAIR, n // LANES, LANES).transpose(2, 0, 3, 1))


def pack_conv_weight(weight: np.ndarray) -> np.ndarray:
    """HWIO [KH, KW, C, N] -> [KH, KW, N/16, C/2, 16, 2] (C padded with a zero channel to an even count,
    N with zero outputs to a multiple of 16)."""
    weight = _padded(_padded(weight, 2, PAIR), 3, LANES)
    kh, kw, c, n = weight.shape
    return np.ascontiguousarray(weight.reshape(kh, kw, c // PAIR, PAIR, n // LANES, LANES).transpose(0, 1, 4, 2, 5, 3))


def _gemm_attrs(flops: float, unit: str) -> dict:
    return {"schedule_rule": BF16_GEMM_RULE, UNIT_ANNOTATION: unit, FLOPS_ANNOTATION: flops}


def _rows_padded(data: te.Tensor, rows: int) -> te.Tensor:
    """``data`` [..., R, K] with zero rows up to ``rows``."""
    given = int(data.shape[-2])
    return te.compute(
        (*data.shape[:-2], rows, data.shape[-1]),
        lambda *i: tvm.tirx.if_then_else(i[-2] < given, data[i], tvm.tirx.const(0, BF16)),
        name="bf16_pad",
    )


def bf16_dense(data: te.Tensor, packed: te.Tensor, rows: int | None = None, unit: str = AVX512) -> te.Tensor:
    """data [..., R, K] (bf16) times the packed weight [N/16, K/2, 16, 2]: [..., R, N] in fp32, or
    [..., ``rows``, N] with zero rows added (``padded_rows``); computed on ``unit``."""
    *lead, k_extent = (int(d) for d in data.shape)
    n_extent = int(packed.shape[0]) * LANES
    k = te.reduce_axis((0, k_extent), "k")
    flops = 2.0 * float(np.prod(lead, dtype=np.float64)) * n_extent * k_extent
    if rows is not None and rows != lead[-1]:
        data, lead[-1] = _rows_padded(data, rows), rows
    return te.compute(
        (*lead, n_extent),
        lambda *i: te.sum(
            data[(*i[:-1], k)].astype(_F32) * packed[i[-1] // LANES, k // PAIR, i[-1] % LANES, k % PAIR].astype(_F32),
            axis=k,
        ),
        name="bf16_dense",
        attrs=_gemm_attrs(flops, unit),
    )


def _out_extent(size: int, before: int, after: int, kernel: int, stride: int) -> int:
    return (size + before + after - kernel) // stride + 1


def _phases(data: te.Tensor, channels: int, stride: int, padding: tuple[int, int, int, int]) -> te.Tensor:
    """The activation padded (``channels``: with zero channels up to that count) [N, H', W', C'] as
    [N, H', stride, W'/stride, C']: column x*stride + r at
    [.., r, x, ..]. A strided convolution's output columns then read consecutive columns of one phase,
    so that a register tile's rows are evenly spaced in memory, as the micro-kernel reads them."""
    batch, height, width, given = (int(d) for d in data.shape)
    top, left, bottom, right = padding
    columns = -(-(width + left + right) // stride)
    return te.compute(
        (batch, height + top + bottom, stride, columns, channels),
        lambda n, y, phase, x, c: tvm.tirx.if_then_else(
            tvm.tirx.all(
                y >= top, y < top + height, x * stride + phase >= left, x * stride + phase < left + width, c < given
            ),
            data[n, y - top, x * stride + phase - left, c],
            tvm.tirx.const(0, BF16),
        ),
        name="bf16_pad",
    )


def bf16_conv2d_nhwc(
    data: te.Tensor,
    packed: te.Tensor,
    stride: int,
    padding: tuple[int, int, int, int],
    columns: int | None = None,
    unit: str = AVX512,
) -> te.Tensor:
    """NHWC data (bf16) convolved with the packed HWIO weight: NHWC fp32; ``columns``: output columns
    computed, past the image's (zero columns added on the right, ``padded_rows``); computed on ``unit``."""
    batch, height, width, channels = (int(d) for d in data.shape)
    kernel_h, kernel_w = int(packed.shape[0]), int(packed.shape[1])
    out_channels = int(packed.shape[2]) * LANES
    packed_channels = int(packed.shape[3]) * PAIR  # an odd channel count gets a zero channel
    top, left, bottom, right = padding
    out_h = _out_extent(height, top, bottom, kernel_h, stride)
    out_w = _out_extent(width, left, right, kernel_w, stride)
    flops = 2.0 * batch * out_h * out_w * out_channels * kernel_h * kernel_w * channels
    if columns is not None and columns != out_w:
        right += (columns - out_w) * stride
        padding, out_w = (top, left, bottom, right), columns
    ry = te.reduce_axis((0, kernel_h), "ry")
    rx = te.reduce_axis((0, kernel_w), "rx")
    rc = te.reduce_axis((0, packed_channels), "rc")
    if stride > 1 or any(padding) or packed_channels != channels:
        phases = _phases(data, packed_channels, stride, padding)

        def activation(n, y, x):
            return phases[n, y * stride + ry, rx % stride, x + rx // stride, rc]
    else:

        def activation(n, y, x):
            return data[n, y + ry, x + rx, rc]

    return te.compute(
        (batch, out_h, out_w, out_channels),
        lambda n, y, x, o: te.sum(
            activation(n, y, x).astype(_F32)
            * packed[ry, rx, o // LANES, rc // PAIR, o % LANES, rc % PAIR].astype(_F32),
            axis=[ry, rx, rc],
        ),
        name="bf16_conv2d",
        attrs=_gemm_attrs(flops, unit),
    )


def _is_fp32(expr: Expr) -> bool:
    return isinstance(expr.ty, relax.TensorType) and str(expr.ty.dtype) == _F32


@expr_functor.mutator
class _Bfloat16Products(PyExprMutator):
    def __init__(self, mod: IRModule, unit: str | None) -> None:
        super().__init__(mod)
        self.unit = unit  # the CPU's bf16 dot product (AVX512_BF16, AMX): our kernels, packed weights

    def _cast(self, expr: Expr) -> Expr:
        return self.builder_.emit(relax.op.astype(expr, BF16))

    def visit_call_(self, call: Call) -> Expr:
        call = super().visit_call_(call)
        name = op_name(call)
        if name not in ("relax.matmul", "relax.nn.conv2d") or not _is_fp32(call.args[0]):
            return call
        if not isinstance(call.args[1], Constant):  # a product of two activations stays fp32
            return call
        return self._matmul(call) if name == "relax.matmul" else self._conv2d(call)

    def _unit_for(self, reduction: int) -> str:
        """The unit of a product over ``reduction`` input channels: AMX's tiles pay for their set-up
        (a tile configuration, the accumulators loaded and stored) over a reduction of a few steps,
        not over a network's first convolution's 3 channels."""
        return self.unit if self.unit != AMX or reduction >= AMX_MIN_REDUCTION else AVX512

    def _computed(self, out: Expr, rows: int | None, outputs: int) -> Expr:
        """``out`` without the zero rows (its second to last axis: a matmul's rows, a convolution's
        columns) and zero outputs (up to a multiple of 16) it was computed with."""
        out = self.builder_.normalize(out)
        ndim = out.ty.ndim
        kept = [(ndim - 1, outputs)] if outputs % LANES else []
        if rows is not None and static_shape(out)[ndim - 2] != rows:
            kept.insert(0, (ndim - 2, rows))
        if not kept:
            return out
        out = self.builder_.emit(out)
        return relax.op.strided_slice(
            out, axes=[axis for axis, _ in kept], begin=[0] * len(kept), end=[count for _, count in kept]
        )

    def _matmul(self, call: Call) -> Expr:
        data, weight = call.args[0], call.args[1].value.numpy()
        if self.unit and weight.ndim == 2 and weight.shape[0] % PAIR == 0:
            packed = pack_dense_weight(weight)  # [N/16, K/2, 16, 2]
            shape = static_shape(data)
            rows = shape[-2] if shape and len(shape) >= 2 else None  # none to pad, or known only at run time
            unit = self._unit_for(weight.shape[0])
            padded = padded_rows(rows, packed.shape[0], unit) if rows else None
            out = self.builder_.call_te(
                bf16_dense,
                self._cast(data),
                relax.const(_bf16(packed)),
                padded,
                unit,
                primfunc_name_hint="bf16_dense",
            )
            return self._computed(out, rows, weight.shape[1])
        return relax.op.matmul(self._cast(data), relax.const(_bf16(weight)), out_dtype=_F32)

    def _conv2d(self, call: Call) -> Expr:
        attrs = call.attrs
        data, weight = call.args[0], call.args[1].value.numpy()
        layouts = (attrs.data_layout, attrs.kernel_layout, attrs.out_layout)
        strides = [int(s) for s in attrs.strides]
        ours = (
            self.unit is not None
            and layouts == ("NHWC", "HWIO", "NHWC")
            and int(attrs.groups) == 1
            and [int(d) for d in attrs.dilation] == [1, 1]
            and strides[0] == strides[1]
            and static_shape(data) is not None
        )
        if ours:
            top, left, bottom, right = (int(p) for p in attrs.padding)
            packed = pack_conv_weight(weight)  # [KH, KW, N/16, C/2, 16, 2]
            unit = self._unit_for(packed.shape[3] * PAIR)
            out_w = _out_extent(static_shape(data)[2], left, right, weight.shape[1], strides[0])
            out = self.builder_.call_te(
                bf16_conv2d_nhwc,
                self._cast(data),
                relax.const(_bf16(packed)),
                strides[0],
                (top, left, bottom, right),
                padded_rows(out_w, packed.shape[2], unit),
                unit,
                primfunc_name_hint="bf16_conv2d",
            )
            return self._computed(out, out_w, weight.shape[3])
        return conv2d_like(call, self._cast(data), relax.const(_bf16(weight)), out_dtype=_F32)


@tvm.transform.module_pass(opt_level=0, name="Bfloat16Products")
class Bfloat16Products:
    """Convolutions and matmuls by constant weights from bf16 operands into fp32 (module docstring);
    ``unit``: the target CPU's bf16 dot product (``tuner.precision.bf16_unit``), None where it has none."""

    def __init__(self, unit: str | None) -> None:
        self.unit = unit

    def transform_module(self, mod: IRModule, ctx: tvm.transform.PassContext) -> IRModule:
        return rewrite_functions(_Bfloat16Products(mod, self.unit), mod)
