"""Channels-last group norms of one channel per group computed with their sums as products by a row
of averaging weights.

Once ``channels_last`` has moved wav2vec 2.0's first group norm (512 groups of one channel over
3,199 positions) past its convolution's layout change, its mean and variance reduce along the
positions, one channel's values 512 apart in memory: TVM's reduction schedules loop each channel
over all positions, a cache line read per value, and the kernel ran at 6.6 ms (22.7 GFLOP/s) where
it had taken 0.52 ms in NCW. As a product of a row of 1/P by the [P, C] activation, each sum is tiled
like a matmul's, vectorised along the channels, reading the activation once. Two passes (the mean,
then the variance of the centred values), as the norm itself computes them.

A group norm of one group (PoolFormer's, over every channel and position) is the same products, each
channel's mean then averaged over the channels: as one reduction to a single value per image, its
schedule had one thread walk the whole tensor (12.3 ms for a [56, 56, 64] image, 58% of the model).
A norm of several channels per group (BiT's 32 groups) is the same products, each channel's mean then
averaged over its group's channels (``any_groups``): its own kernels ran at 4-11% of the FMA peak.
"""

from __future__ import annotations

import math

import numpy as np
import tvm
from tvm import relax
from tvm.ir.module import IRModule
from tvm.relax import Call, Expr, PyExprMutator, expr_functor

from common.relax_functions import rewrite_functions

from .graph import ints, op_name, static_shape


def _over_positions(call: Call, any_groups: bool) -> tuple[int, ...] | None:
    """The shape of a channels-last group norm over all positions with a group per channel or one group
    of all channels (any number of groups dividing the channels where ``any_groups``); else None."""
    shape = static_shape(call.args[0])
    if shape is None or len(shape) < 3 or str(call.args[0].ty.dtype) != "float32":
        return None
    rank, attrs = len(shape), call.attrs
    groups = int(attrs.num_groups)
    by_groups = groups in (shape[-1], 1) or (any_groups and shape[-1] % groups == 0)
    grouped = by_groups and int(attrs.channel_axis) in (rank - 1, -1)
    return shape if grouped and sorted(ints(attrs.axes)) == list(range(1, rank - 1)) else None


@expr_functor.mutator
class _PerChannelNormsAsProducts(PyExprMutator):
    def __init__(self, mod: IRModule, any_groups: bool) -> None:
        super().__init__(mod)
        self.any_groups = any_groups

    def visit_call_(self, call: Call) -> Expr:
        call = super().visit_call_(call)
        shape = _over_positions(call, self.any_groups) if op_name(call) == "relax.nn.group_norm" else None
        if shape is None:
            return call
        batch, positions, channels = shape[0], math.prod(shape[1:-1]), shape[-1]
        groups = int(call.attrs.num_groups)
        one_group = groups == 1 and channels > 1
        emit = self.builder_.emit
        x = emit(relax.op.reshape(call.args[0], (batch, positions, channels)))
        average = relax.const(np.full((1, 1, positions), 1.0 / positions, np.float32))

        def mean(values: Expr) -> Expr:  # per channel, or over the one group's channels too
            per_channel = self._sum(relax.op.matmul(average, values))
            if groups == channels:
                return per_channel
            if not one_group:  # each group's channels averaged, the mean given back to each of them
                by_group = emit(relax.op.reshape(per_channel, (batch, groups, channels // groups)))
                group_mean = emit(relax.op.mean(by_group, axis=[2], keepdims=True))
                spread = emit(relax.op.broadcast_to(group_mean, (batch, groups, channels // groups)))
                return emit(relax.op.reshape(spread, (batch, 1, channels)))
            # expanded back as a step of its own, as ``_sum``'s: read directly, the [N, P, C] steps took the
            # mean into their kernel and computed it again for every element (PoolFormer's: 1.5-1.8 ms each)
            return emit(relax.op.expand_dims(emit(relax.op.mean(per_channel, axis=[1, 2])), axis=[1, 2]))

        centered = emit(relax.op.subtract(x, mean(x)))
        variance = mean(emit(relax.op.multiply(centered, centered)))
        epsilon = relax.const(np.float32(call.attrs.epsilon))
        # |variance|: the same number (a mean of squares), and finite when the tuner times the kernel on
        # random inputs (a negative one made every candidate's output NaN: wav2vec 2.0's ran untuned, 4.4 ms)
        spread = relax.op.add(relax.op.abs(variance), epsilon)
        normed = emit(relax.op.multiply(centered, emit(relax.op.rsqrt(spread))))
        if bool(call.attrs.scale):
            normed = emit(relax.op.multiply(normed, call.args[1]))
        if bool(call.attrs.center):
            normed = emit(relax.op.add(normed, call.args[2]))
        return relax.op.reshape(normed, shape)

    def _sum(self, product: Expr) -> Expr:
        """A product's [N, 1, C] result squeezed and expanded back: the layout steps end its kernel there.
        Read directly, the norm's element-wise steps became the product's epilogue, a [N, P, C] one
        computed under a [N, 1, C] product's tiles (wav2vec 2.0's: 18 ms)."""
        squeezed = self.builder_.emit(relax.op.squeeze(self.builder_.emit(product), axis=[1]))
        return self.builder_.emit(relax.op.expand_dims(squeezed, axis=1))


@tvm.transform.module_pass(opt_level=0, name="PerChannelNormsAsProducts")
class PerChannelNormsAsProducts:
    """Channels-last group norms of a channel per group, or of one group (or of any number of groups where
    ``any_groups``), with their sums as products (module docstring)."""

    def __init__(self, any_groups: bool = True) -> None:
        self.any_groups = any_groups

    def transform_module(self, mod: IRModule, ctx: tvm.transform.PassContext) -> IRModule:
        return rewrite_functions(_PerChannelNormsAsProducts(mod, self.any_groups), mod)
