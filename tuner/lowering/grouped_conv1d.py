"""Grouped 1-D convolutions (NCW) as a kernel of our own that vectorises along each group's output channels.

wav2vec 2.0's, HuBERT's, WavLM's and SEW's positional embedding is a 1-D convolution of 768 channels in 16
groups with a window of 128 positions over a few dozen positions (SEW's: 49 in, stride 2, 25 out). TVM's NCW
grouped convolution vectorises along the output positions, which a stride of 2 reads every other one of and
which 25 positions fill a vector of barely once: 1.8 ms at 27% of the FMA peak in SEW's tuned model, a quarter
of it (Zen 5; `experiments/README.md`, "Grouped positional convolutions").

Here each output is computed channels-last, per group: ``out[n, g, jo, y, ji]`` sums, over the window and the
group's input channels, ``x[n, g * CG + c, y * stride + k]`` times ``w[g, k, c, jo, ji]``, with ``ji`` a vector
of ``VECTOR_LANES`` output channels and ``jo`` the group's vectors of them. In a step of the reduction an input
value is broadcast and multiplied into every output channel of its group, and the register tile
(``spaces.block_plan``, ``COLUMN_VECTORS_ATTR``) takes all of a group's vectors at once (3 of 48 channels) beside
a few positions: 3 x 5 and 3 x 6 tiles, 0.54-0.59 ms where the NCW kernel took 1.9 (its analytic schedule, 2
cores, Zen 5). Positions are loop ``y`` just outside the vector, so MetaSchedule never fuses ``jo`` with ``ji``
into one vector loop three registers wide (20x slower in LLVM's hands). The transposed padded input and the
output back in NCW are blocks of the same kernel; the weights are rearranged once, at compile time, where
they are constants.
"""

from __future__ import annotations

import tvm
from tvm import relax, te, tirx
from tvm.ir.module import IRModule
from tvm.relax import Call, Expr, PyExprMutator, expr_functor

from common.relax_functions import rewrite_functions
from tuner.spaces.block_plan import COLUMN_VECTORS_ATTR
from tuner.spaces.schedule_rules import VECTOR_LANES

from .graph import ints, is_float32, op_name, static_shape

OUT_EWISE_FUSABLE = 4  # relax's kOutEWiseFusable: the element-wise ops after the convolution fuse into its kernel
MIN_WINDOW = 8  # a shorter window is cheap enough as TVM's own grouped convolution


def grouped_conv1d_channels_last(
    data: te.Tensor, weight: te.Tensor, stride: int, padding: tuple[int, int], dilation: int
) -> te.Tensor:
    """NCW ``conv1d(data, weight, groups=G)`` for ``weight`` as ``[G, K, CG, OG // VECTOR_LANES, VECTOR_LANES]``."""
    batch, channels, width = (int(d) for d in data.shape)
    groups, kernel, group_channels, vectors, lanes = (int(d) for d in weight.shape)
    left, right = padding
    padded = width + left + right
    out_width = (padded - dilation * (kernel - 1) - 1) // stride + 1
    outputs = groups * vectors * lanes
    transposed = te.compute(
        (batch, padded, channels),
        lambda n, i, c: tirx.if_then_else(
            tirx.all(i >= left, i < left + width),
            data[n, c, tirx.min(tirx.max(i - left, 0), width - 1)],  # in bounds where a vector loads both sides
            tirx.const(0.0, data.dtype),
        ),
        name="pad_temp",
    )
    c = te.reduce_axis((0, group_channels), "rc")
    k = te.reduce_axis((0, kernel), "ry")
    conv = te.compute(
        (batch, groups, vectors, out_width, lanes),
        lambda n, g, jo, y, ji: te.sum(
            transposed[n, y * stride + k * dilation, g * group_channels + c] * weight[g, k, c, jo, ji], axis=[k, c]
        ),
        name="group_conv1d_nwc",
        attrs={COLUMN_VECTORS_ATTR: vectors},
    )
    per_group = vectors * lanes
    return te.compute(
        (batch, outputs, out_width),
        lambda n, o, y: conv[n, o // per_group, o % per_group // lanes, y, o % lanes],
        name="group_conv1d_ncw",
    )


def _takes(call: Call) -> tuple[int, int, int, int] | None:
    """(groups, input and output channels per group, window) of a float32 NCW grouped 1-D convolution this
    kernel computes; None for any other call."""
    if op_name(call) != "relax.nn.conv1d":
        return None
    attrs = call.attrs
    data, weight = call.args
    shapes = static_shape(data), static_shape(weight)
    if (attrs.data_layout, attrs.kernel_layout, attrs.out_layout) != ("NCW", "OIW", "NCW") or None in shapes:
        return None
    if not all(is_float32(tensor) for tensor in (data, weight, call)):
        return None
    groups = int(attrs.groups)
    (_, channels, _), (outputs, group_channels, kernel) = shapes
    if groups == 1 or groups == channels or outputs % groups or (outputs // groups) % VECTOR_LANES:
        return None
    return (groups, group_channels, outputs // groups, kernel) if kernel >= MIN_WINDOW else None


@expr_functor.mutator
class _GroupedConv1dChannelsLast(PyExprMutator):
    def visit_call_(self, call: Call) -> Expr:
        call = super().visit_call_(call)
        taken = _takes(call)
        if taken is None:
            return call
        groups, group_channels, per_group, kernel = taken
        data, weight = call.args
        # OIW -> [G, OG, CG, K] -> [G, K, CG, OG] -> [G, K, CG, OG / lanes, lanes] (folded where a constant)
        grouped = relax.op.reshape(weight, (groups, per_group, group_channels, kernel))
        arranged = relax.op.reshape(
            relax.op.permute_dims(grouped, [0, 3, 2, 1]),
            (groups, kernel, group_channels, per_group // VECTOR_LANES, VECTOR_LANES),
        )
        return self.builder_.call_te(
            grouped_conv1d_channels_last,
            data,
            self.builder_.emit(arranged),
            stride=ints(call.attrs.strides)[0],
            padding=tuple(ints(call.attrs.padding)),
            dilation=ints(call.attrs.dilation)[0],
            primfunc_name_hint="group_conv1d",
            primfunc_attrs={"op_pattern": OUT_EWISE_FUSABLE},
        )


@tvm.transform.module_pass(opt_level=0, name="GroupedConv1dChannelsLast")
class GroupedConv1dChannelsLast:
    """Float32 NCW grouped 1-D convolutions (not depthwise) of a window of ``MIN_WINDOW`` or more, whose groups'
    output channels fill whole vectors, as ``grouped_conv1d_channels_last`` kernels."""

    def transform_module(self, mod: IRModule, ctx: tvm.transform.PassContext) -> IRModule:
        return rewrite_functions(_GroupedConv1dChannelsLast(mod), mod)
