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

The kernel's blocks: a padded input, its tiles, their transform (two blocks, one side of the tile each), the
batched GEMM, the inverse transform (two blocks) and the output gathered from its tiles. The transforms take our
rule (``tuner.spaces.winograd_rule``), the GEMM MetaSchedule's tiling like any product.
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
from tuner.spaces.winograd_rule import INPUT_TILE, ROWS_SUFFIX, WINOGRAD_TRANSFORM_RULE

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
        name=INPUT_TILE,
        attrs={"schedule_rule": "None"},
    )
    data_pack = _transform(input_tile, matrices.data.T, "data_pack")
    rc = te.reduce_axis((0, in_channels), "ci")
    bgemm = te.compute(
        (alpha, alpha, tiles, out_channels),
        lambda eps, nu, p, co: te.sum(data_pack[eps, nu, p, rc] * transformed_weight[eps, nu, co, rc], axis=[rc]),
        name="bgemm",
    )
    inverse = _transform(bgemm, matrices.output.T, "inverse")
    return te.compute(
        (batch, out_height, out_width, out_channels),
        lambda n, h, w, co: inverse[h % tile, w % tile, n * per_image + h // tile * tiles_w + w // tile, co],
        name="conv2d_winograd",
    )


def _transform(source: te.Tensor, matrix: np.ndarray, name: str) -> te.Tensor:
    """``M^T x M`` for every tile and channel of ``source`` (``[alpha, alpha, tiles, channels]``), ``M``
    being ``alpha x size``, one side at a time: ``M^T x`` into a ``<name>_rows`` block, then ``. M``. That is
    2 x alpha x nnz(M) terms per tile and channel, where both sides at once take nnz(M)^2: 312 against 676 for
    F(4x4, 3x3)'s input. The first side is a sum over the matrix (its entries constants once the loops are
    unrolled, the zeros folded away): a block that only reads the batched GEMM's output element by element
    would be taken by MetaSchedule's tiling of the GEMM for a write cache to move into its tiles, which it
    cannot. The second is each output's non-zero terms written out. Scheduled by our rule
    (``tuner.spaces.winograd_rule``), vectorised over the channels."""
    alpha, _, tiles, channels = (int(d) for d in source.shape)
    size = matrix.shape[1]
    nonzeros = int(np.count_nonzero(matrix))
    ra = te.reduce_axis((0, alpha), "r_a")
    rows = te.compute(
        (size, alpha, tiles, channels),
        lambda x, b, p, c: te.sum(source[ra, b, p, c] * _entry(matrix, ra, x, str(source.dtype)), axis=[ra]),
        name=f"{name}{ROWS_SUFFIX}",
        attrs={"schedule_rule": "None", FLOPS_ANNOTATION: 2.0 * nonzeros * alpha * tiles * channels},
    )
    return te.compute(
        (size, size, tiles, channels),
        lambda x, y, p, c: _by_index(y, [_combination(column, lambda b: rows[x, b, p, c]) for column in matrix.T]),
        name=name,
        attrs={
            "schedule_rule": WINOGRAD_TRANSFORM_RULE,
            FLOPS_ANNOTATION: 2.0 * nonzeros * size * tiles * channels,  # one multiply-add per non-zero term
        },
    )


def _combination(coefficients: np.ndarray, term) -> tvm.tirx.PrimExpr:
    """The sum of ``coefficients[i] * term(i)`` over the non-zero coefficients, ones and minus ones without
    a multiplication."""
    total = None
    for i, coefficient in enumerate(coefficients):
        if coefficient == 0:
            continue
        value = term(i)
        if abs(coefficient) != 1:
            value = value * tvm.tirx.const(float(abs(coefficient)), value.dtype)
        if total is None:
            total = value if coefficient > 0 else -value
        else:
            total = total + value if coefficient > 0 else total - value
    return total


def _entry(matrix: np.ndarray, row: tvm.tirx.Var, column: tvm.tirx.Var, dtype: str) -> tvm.tirx.PrimExpr:
    """``matrix[row, column]`` as selects on the indices."""
    return _by_index(row, [_by_index(column, [tvm.tirx.const(float(v), dtype) for v in values]) for values in matrix])


def _by_index(index: tvm.tirx.Var, values: list[tvm.tirx.PrimExpr]) -> tvm.tirx.PrimExpr:
    """``values[index]``: a chain of selects, which unrolling ``index`` reduces to the one taken."""
    value = values[-1]
    for i in reversed(range(len(values) - 1)):
        value = tvm.tirx.Select(index == i, values[i], value)
    return value


def transform_weight(weight_hwio: np.ndarray, tile: int) -> np.ndarray:
    """HWIO 3x3 weights as ``[alpha, alpha, out_channels, in_channels]``: G g G^T per filter."""
    g = transforms(tile).weight
    return np.einsum("ak,bl,klio->aboi", g, g, weight_hwio.astype(np.float64)).astype(weight_hwio.dtype)


def suits_winograd(call: Call) -> bool:
    """A float32 NHWC 3x3 stride-1 convolution with constant weights, enough channels for the
    transforms to pay and enough uses of each weight value for the larger transformed weights to. However
    large the image: with the transforms vectorised (``tuner.spaces.winograd_rule``), VGG-16's 224x224
    64-channel convolution, 58 MB of transformed tiles against 16 MB of L3 a core, ran 0.64x as long as its
    direct form, the 112x112 ones 0.54-0.68x (2-core Zen 4, 2026-12-06, analytic schedules, each alone); the
    model at trials=0 83.6 ms against 104.6-119.9 with those kept direct. (With MetaSchedule's scalar
    transforms they had been 1.2-1.7x slower than direct.)"""
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
    return math.prod(out[:3]) >= MIN_USES_PER_WEIGHT  # each weight value is used once per output position


@expr_functor.mutator
class _Winograd(PyExprMutator):
    def visit_call_(self, call: Call) -> Expr:
        call = super().visit_call_(call)
        if not isinstance(call, Call) or call.op != tvm.ir.Op.get("relax.nn.conv2d") or not suits_winograd(call):
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
    """Suitable NHWC 3x3 stride-1 convolutions (``suits_winograd``) as Winograd kernels, weights transformed
    at compile time."""

    def transform_module(self, mod: IRModule, ctx: tvm.transform.PassContext) -> IRModule:
        return rewrite_functions(_Winograd(mod), mod)
