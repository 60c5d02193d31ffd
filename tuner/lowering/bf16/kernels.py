"""The TE compute of bfloat16 products by packed weights (``tuner.lowering.bf16.products`` puts them in a
model): a dense layer and a channels-last convolution, from bf16 operands into fp32, annotated for
the design spaces of ``tuner.spaces.bf16_rule``; the weights' packing.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import tvm
from tvm import te

from codegen.bf16_dot import AVX512, LANES, PAIR
from tuner.spaces.bf16_product import gemm_attrs, packed_product, product_flops

BF16 = "bfloat16"
F32 = "float32"


def to_bf16(array: np.ndarray) -> np.ndarray:
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


def pack_conv_weight(weight: np.ndarray, channel_multiple: int = PAIR) -> np.ndarray:
    """HWIO [KH, KW, C, N] -> [KH, KW, N/16, C/2, 16, 2] (C padded with zero channels to a multiple of
    ``channel_multiple``, an even count at least; N with zero outputs to a multiple of 16)."""
    weight = _padded(_padded(weight, 2, channel_multiple), 3, LANES)
    kh, kw, c, n = weight.shape
    return np.ascontiguousarray(weight.reshape(kh, kw, c // PAIR, PAIR, n // LANES, LANES).transpose(0, 1, 4, 2, 5, 3))


def _rows_padded(data: te.Tensor, rows: int) -> te.Tensor:
    """``data`` [..., R, K] with zero rows up to ``rows``."""
    given = int(data.shape[-2])
    return te.compute(
        (*data.shape[:-2], rows, data.shape[-1]),
        lambda *i: tvm.tirx.if_then_else(i[-2] < given, data[i], tvm.tirx.const(0, BF16)),
        name="bf16_pad",
    )


def bf16_dense(
    data: te.Tensor, packed: te.Tensor, rows: int | None = None, unit: str = AVX512, flops: float | None = None
) -> te.Tensor:
    """data [..., R, K] (bf16) times the packed weight [N/16, K/2, 16, 2]: [..., R, N] in fp32, or
    [..., ``rows``, N] with zero rows added (``padded_rows``); computed on ``unit``."""
    if flops is None:
        flops = product_flops(data, packed)  # of the rows given, before any zero rows are added
    if rows is not None and rows != int(data.shape[-2]):
        data = _rows_padded(data, rows)
    return packed_product(data, packed, unit, flops)


def out_extent(size: int, before: int, after: int, kernel: int, stride: int) -> int:
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
    out_h = out_extent(height, top, bottom, kernel_h, stride)
    out_w = out_extent(width, left, right, kernel_w, stride)
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
            activation(n, y, x).astype(F32) * packed[ry, rx, o // LANES, rc // PAIR, o % LANES, rc % PAIR].astype(F32),
            axis=[ry, rx, rc],
        ),
        name="bf16_conv2d",
        attrs=gemm_attrs(flops, unit),
    )


def bf16_batch_matmul(a: te.Tensor, b: te.Tensor, rows: int, unit: str) -> te.Tensor:
    """a [..., M, K] times b [..., K, N], two bf16 activations (attention's products), into fp32: ``a``
    over ``rows`` rows (zero rows past M, a zero column where K is odd), ``b`` packed
    [..., N/16, K/2, 16, 2] as a weight is, both in the kernel; the result gathered back to [..., M, N].
    The operands come cast (by the kernels that produce them): a cast inside would round in a built
    candidate and not in the unscheduled reference it is checked against, whose bf16 buffers inside
    a kernel TVM keeps in fp32."""
    *lead, m, k = (int(d) for d in a.shape)
    n = int(b.shape[-1])
    reduction, blocks = k + k % PAIR, -(-n // LANES)

    def cast(*i):
        inside = tvm.tirx.all(i[-2] < m, i[-1] < k)
        return tvm.tirx.if_then_else(inside, a[i], tvm.tirx.const(0, BF16))

    def pack(*i):
        *batch, block, pair, lane, half = i
        row, column = pair * PAIR + half, block * LANES + lane
        inside = tvm.tirx.all(row < k, column < n)
        return tvm.tirx.if_then_else(inside, b[(*batch, row, column)], tvm.tirx.const(0, BF16))

    rows_cast = te.compute((*lead, rows, reduction), cast, name="bf16_pad")
    packed = te.compute((*lead, blocks, reduction // PAIR, LANES, PAIR), pack, name="bf16_pack")
    r = te.reduce_axis((0, reduction), "r")
    gemm = te.compute(
        (*lead, rows, blocks * LANES),
        lambda *i: te.sum(
            rows_cast[(*i[:-1], r)].astype(F32)
            * packed[(*i[:-2], i[-1] // LANES, r // PAIR, i[-1] % LANES, r % PAIR)].astype(F32),
            axis=r,
        ),
        name="bf16_dense",
        attrs=gemm_attrs(2.0 * float(np.prod(lead, dtype=np.float64)) * m * n * k, unit),
    )
    return te.compute((*lead, m, n), lambda *i: gemm[i], name="bf16_rows")
