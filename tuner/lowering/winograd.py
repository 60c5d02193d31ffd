"""3x3 convolutions of stride 1 computed by Winograd's minimal filtering, F(m x m, 3 x 3).

A direct 3x3 convolution does 9 multiply-adds per output and input channel; Winograd's form
transforms each (m+2) x (m+2) input tile and the weights into a domain where the convolution is an
element-wise product, so that the channel reduction becomes (m+2)^2 batched GEMMs doing
(m+2)^2 / m^2 multiply-adds per output and input channel: 4 for m = 2, 2.25 for m = 4, against 9.
The input and output transforms are additions and a few multiplications by constants per tile.
Measured here (64 trials each, alone): ResNet's 64-channel 56x56 convolution in 417 us against
1033 us direct.

The weights are transformed once, when the model is lowered (they are constants). They become
(m+2)^2 / 9 times larger (4x for m = 4): a convolution whose weights already stream from memory
(many channels, a small image) would only get slower, so the rewrite is kept for convolutions that
use each weight value at least ``MIN_USES_PER_WEIGHT`` times.

The kernel keeps the block structure MetaSchedule's Winograd schedule rules for CPUs expect
(``conv2d_nhwc_winograd_data_pack``, ``conv2d_nhwc_winograd_inverse``): a padded input, its tiles,
their transform, the batched GEMM, the inverse transform and the output gathered from its tiles.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import tvm
from tvm import relax, te
from tvm.ir.module import IRModule
from tvm.relax import Call, Expr, PyExprMutator, expr_functor

from common.relax_functions import rewrite_functions
from tuner.spaces.metaschedule import FLOPS_ANNOTATION

from .graph import static_shape

# m = 4 (4x fewer multiply-adds than direct) where its tiles cover the output with at most this
# fraction of wasted area, else m = 2 (2.25x fewer): a 14x14 output in 4x4 tiles computes 16x16.
MAX_TILE_WASTE = 0.125
# Each weight value is used once per output position: 3136 times in a 3x3 convolution over 56x56,
# 49 times over 7x7, where the larger transformed weights dominate the time.
MIN_USES_PER_WEIGHT = 150
# The transforms cost about as much per tile as the GEMM does per input and output channel, so a
# convolution with few channels (an RGB stem's 3) gains nothing. At 16: SqueezeNet 1.1's 16 -> 64
# convolutions over 55x55 ran at 16% of the FMA peak in Winograd form (0.32 ms a launch, the model's
# largest kernel); direct, the analytic model ran 0.85-0.89x as long (three readings, Zen 5, 2026-12-04).
MIN_CHANNELS = 32


def tile_size(out_height: int, out_width: int) -> int:
    covered = -(-out_height // 4) * 4 * -(-out_width // 4) * 4
    return 4 if covered <= (1 + MAX_TILE_WASTE) * out_height * out_width else 2


@dataclass(frozen=True)
class Transforms:
    """Toom-Cook matrices of F(m x m, r x r): output ``A^T [(G g G^T) * (B^T d B)] A`` per tile."""

    output: np.ndarray  # A^T, m x alpha
    weight: np.ndarray  # G, alpha x r
    data: np.ndarray  # B^T, alpha x alpha


# Finite interpolation points (infinity is the last) with the smallest float32 error found by
# Barabasz et al., "Error analysis and improving the accuracy of Winograd convolution for deep
# neural networks" (2020); F(4, 3) at 0, +-1, +-1/2 instead errs about 3x more here.
POINTS = {2: (0, -1, 1), 4: (0, -1, 1, Fraction(1, 2), -2)}


@functools.cache
def transforms(tile: int, kernel: int = 3) -> Transforms:
    """A^T and G follow from the interpolation points; B^T is the unique matrix that makes the
    identity hold, solved for and checked here."""
    alpha = tile + kernel - 1
    points = [Fraction(p) for p in POINTS[tile]]
    output = np.zeros((tile, alpha))
    weight = np.zeros((alpha, kernel))
    for j, p in enumerate(points):
        norm = math.prod(p - q for q in points if q != p)
        output[:, j] = [float(p**i) for i in range(tile)]
        weight[j] = [float(p**k / norm) for k in range(kernel)]
    output[tile - 1, alpha - 1] = weight[alpha - 1, kernel - 1] = 1.0
    # sum_j A^T[i,j] G[j,k] B^T[j,l] = [l == i + k]: one linear system per column l of B^T
    system = np.einsum("ij,jk->ikj", output, weight).reshape(tile * kernel, alpha)
    wanted = np.zeros((tile, kernel, alpha))
    for i in range(tile):
        for k in range(kernel):
            wanted[i, k, i + k] = 1.0
    data = np.linalg.lstsq(system, wanted.reshape(tile * kernel, alpha), rcond=None)[0]
    data = np.vectorize(lambda x: float(Fraction(x).limit_denominator(64)))(data)
    # Row j of B^T may be scaled if row j of G is scaled inversely: B^T is applied to the data at run
    # time, in float32, so its rows are made small integers; G is applied once, in float64.
    scale = np.array([np.min(np.abs(row[row != 0])) for row in data])
    data, weight = data / scale[:, None], weight * scale[:, None]
    if not np.allclose(np.einsum("ij,jk,jl->ikl", output, weight, data), wanted, atol=1e-12):
        raise ValueError(f"no Winograd transform F({tile}, {kernel}) at {points}")
    return Transforms(output, weight, data)


def _constant(matrix: np.ndarray, name: str, dtype: str) -> te.Tensor:
    """A matrix as a computation on its indices, nested by row and then column with its zeros left
    out, so that unrolled uses simplify to constants quickly."""

    def entry(i, j):
        value = tvm.tirx.const(0, dtype)
        for r, row in enumerate(matrix):
            row_value = tvm.tirx.const(0, dtype)
            for c, x in enumerate(row):
                if x != 0:
                    row_value = tvm.tirx.Select(j == c, tvm.tirx.const(x, dtype), row_value)
            value = tvm.tirx.Select(i == r, row_value, value)
        return value

    return te.compute(matrix.shape, entry, name=name, attrs={"const_matrix": True, "schedule_rule": "None"})


def conv2d_nhwc_winograd(
    data: te.Tensor, transformed_weight: te.Tensor, padding: tuple[int, int, int, int], tile: int
) -> te.Tensor:
    """NHWC 3x3 stride-1 convolution of ``data`` with weights already transformed into
    ``[alpha, alpha, out_channels, in_channels]`` (``transform_weight``); padding (top, left, bottom,
    right)."""
    batch, height, width, in_channels = (int(d) for d in data.shape)
    alpha, _, out_channels, _ = (int(d) for d in transformed_weight.shape)
    top, left, bottom, right = padding
    out_height, out_width = height + top + bottom - 2, width + left + right - 2
    tiles_h, tiles_w = -(-out_height // tile), -(-out_width // tile)
    tiles = batch * tiles_h * tiles_w
    matrices, dtype = transforms(tile), str(data.dtype)
    to_wino, to_out = _constant(matrices.data.T, "B", dtype), _constant(matrices.output.T, "A", dtype)

    def padded_value(n, h, w, c):
        inside = tvm.tirx.all(h >= top, h < top + height, w >= left, w < left + width)
        return tvm.tirx.if_then_else(inside, data[n, h - top, w - left, c], tvm.tirx.const(0, dtype))

    padded = te.compute(
        (batch, tiles_h * tile + 2, tiles_w * tile + 2, in_channels),
        padded_value,
        name="data_pad",
        attrs={"schedule_rule": "None"},
    )
    per_image = tiles_h * tiles_w
    input_tile = te.compute(
        (alpha, alpha, tiles, in_channels),
        lambda eps, nu, p, c: padded[
            p // per_image, (p % per_image) // tiles_w * tile + eps, p % tiles_w * tile + nu, c
        ],
        name="input_tile",
        attrs={"schedule_rule": "None"},
    )
    data_pack = _transform(input_tile, to_wino, alpha, np.count_nonzero(matrices.data), "data_pack")
    rc = te.reduce_axis((0, in_channels), "ci")
    bgemm = te.compute(
        (alpha, alpha, tiles, out_channels),
        lambda eps, nu, p, co: te.sum(data_pack[eps, nu, p, rc] * transformed_weight[eps, nu, co, rc], axis=[rc]),
        name="bgemm",
    )
    inverse = _transform(bgemm, to_out, tile, np.count_nonzero(matrices.output), "inverse")
    return te.compute(
        (batch, out_height, out_width, out_channels),
        lambda n, h, w, co: inverse[h % tile, w % tile, n * per_image + h // tile * tiles_w + w // tile, co],
        name="conv2d_winograd",
    )


def _transform(source: te.Tensor, matrix: te.Tensor, size: int, nonzeros: int, name: str) -> te.Tensor:
    """``M^T x M`` for every tile and channel of ``source`` (``[alpha, alpha, tiles, channels]``),
    ``M`` being ``alpha x size``; scheduled by MetaSchedule's CPU rule for a Winograd transform."""
    alpha, _, tiles, channels = (int(d) for d in source.shape)
    ra, rb = te.reduce_axis((0, alpha), "r_a"), te.reduce_axis((0, alpha), "r_b")
    return te.compute(
        (size, size, tiles, channels),
        lambda x, y, p, c: te.sum(source[ra, rb, p, c] * matrix[ra, x] * matrix[rb, y], axis=[ra, rb]),
        name=name,
        attrs={
            "schedule_rule": f"conv2d_nhwc_winograd_{name}",
            FLOPS_ANNOTATION: 2.0 * nonzeros**2 * tiles * channels,  # one multiply-add per non-zero term
        },
    )


def transform_weight(weight_hwio: np.ndarray, tile: int) -> np.ndarray:
    """HWIO 3x3 weights as ``[alpha, alpha, out_channels, in_channels]``: G g G^T per filter."""
    g = transforms(tile).weight
    return np.einsum("ak,bl,klio->aboi", g, g, weight_hwio.astype(np.float64)).astype(weight_hwio.dtype)


def transformed_bytes(out_shape: tuple[int, ...], in_channels: int) -> int:
    """The transformed input and output tiles of a Winograd convolution producing ``out_shape`` (NHWC): one
    (m+2) x (m+2) tile of each input and each output channel per output tile, in float32."""
    batch, height, width, out_channels = out_shape
    m = tile_size(height, width)
    tiles = batch * -(-height // m) * -(-width // m)
    return tiles * (m + 2) ** 2 * (in_channels + out_channels) * 4


def suits_winograd(call: Call, max_transformed_bytes: int | None = None) -> bool:
    """A float32 NHWC 3x3 stride-1 convolution with constant weights, enough channels for the
    transforms to pay and enough uses of each weight value for the larger transformed weights to; with
    ``max_transformed_bytes`` (a core's share of L3), tiles that fit in it: past it the batched product's
    operands come from memory. VGG-16 on a 2-core Zen 4 (16 MB a core; 2026-12-06, trials=0, each alone in
    the model): its 224x224 64-channel convolution 33.8 ms as Winograd (58 MB of tiles) against 20.1 direct,
    the 112x112 ones 15.5 and 23.3 (22, 29 MB) against 9.3 and 18.7; at 56x56 and below (11-14 MB) Winograd
    is the faster, 7.5 and 10.2 ms against 9.1 and 17.9."""
    attrs = call.attrs
    data, weight = call.args
    if (attrs.data_layout, attrs.kernel_layout, attrs.out_layout) != ("NHWC", "HWIO", "NHWC"):
        return False
    if not isinstance(weight, tvm.ir.expr.Constant) or int(attrs.groups) != 1:
        return False
    if [int(s) for s in attrs.strides] != [1, 1] or [int(d) for d in attrs.dilation] != [1, 1]:
        return False
    out, kernel = static_shape(call), static_shape(weight)
    if out is None or kernel is None or static_shape(data) is None or tuple(kernel[:2]) != (3, 3):
        return False
    if str(call.ty.dtype) != "float32" or str(data.ty.dtype) != "float32":
        return False
    if min(kernel[2], kernel[3]) < MIN_CHANNELS:
        return False
    if max_transformed_bytes is not None and transformed_bytes(tuple(out), kernel[2]) > max_transformed_bytes:
        return False
    return math.prod(out[:3]) >= MIN_USES_PER_WEIGHT  # each weight value is used once per output position


@expr_functor.mutator
class _Winograd(PyExprMutator):
    def __init__(self, mod: IRModule, max_transformed_bytes: int | None):
        super().__init__(mod)
        self.max_transformed_bytes = max_transformed_bytes

    def visit_call_(self, call: Call) -> Expr:
        call = super().visit_call_(call)
        if not isinstance(call, Call) or call.op != tvm.ir.Op.get("relax.nn.conv2d"):
            return call
        if not suits_winograd(call, self.max_transformed_bytes):
            return call
        data, weight = call.args
        out = static_shape(call)
        tile = tile_size(out[1], out[2])
        transformed = relax.const(transform_weight(weight.value.numpy(), tile))
        return self.builder_.call_te(
            conv2d_nhwc_winograd,
            data,
            transformed,
            tuple(int(p) for p in call.attrs.padding),  # Relax keeps all four: top, left, bottom, right
            tile,
            primfunc_name_hint="conv2d_winograd",
        )


@tvm.transform.module_pass(opt_level=0, name="WinogradConvolutions")
class WinogradConvolutions:
    """Suitable NHWC 3x3 stride-1 convolutions as Winograd kernels, weights transformed at compile time;
    ``max_transformed_bytes``: see ``suits_winograd``."""

    def __init__(self, max_transformed_bytes: int | None = None):
        self.max_transformed_bytes = max_transformed_bytes

    def transform_module(self, mod: IRModule, ctx: tvm.transform.PassContext) -> IRModule:
        return rewrite_functions(_Winograd(mod, self.max_transformed_bytes), mod)
