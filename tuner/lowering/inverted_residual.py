"""A 1x1 expanding convolution and the depthwise convolution after it as one kernel (MobileNet's
inverted-residual block), so that the expanded activation never leaves the cache.

MobileNetV2 widens each block's input six times with a 1x1 convolution, filters it with a 3x3
depthwise convolution and narrows it again. As separate kernels, the wide activation (4.8 MB at
112x112x96) is written by one kernel and read back by the next; inside the model those two kernels
ran 2-3x slower than alone (experiments/vs_frameworks.md, "What holds MobileNetV2"). Here both are
one kernel whose schedule (``tuner.spaces.schedule_rules.schedule_expand_depthwise``) computes the wide
activation band by band, each band with the rows its depthwise window needs.

The kernel computes the expansion over the padded image, reading clamped input indices, and zeroes
the padding after the activation: the padding then costs no condition in the expansion's inner loop.

In a bf16 model the block stays a float32 kernel (its expansions reduce over 16-24 channels, less than
one step of AMX's micro-kernel) but writes its output in bf16 for the projection after it, a bf16
product: as two kernels, that output's cast to bf16 would be a pass of its own. On AMX an expansion over a
whole step of channels or more is left to AMX (``below_channels``): MobileNetV1's pointwise convolutions
over 32-128 channels, fused in fp32, were its three slowest kernels (0.8 of 2.2 ms at 4-5% of AMX's peak,
1.33x OpenVINO's default after 3 minutes on a 2-core Xeon). Its input stays fp32:
read in bf16, each value's conversion in the expansion's inner loop made MobileNetV2's three fused
kernels 1.07-1.5x slower alone with the same schedules (Emerald Rapids).

The activations may be clips and ReLUs (MobileNetV2) or SiLUs (``silu``: MobileViT's and EfficientNet's
blocks, where a depthwise convolution reading an 8 MB expansion ran at 2.3-3.2x its time alone inside the
model). A SiLU's fast form is written over tensors (``fast_math``), so it comes as blocks of its own that the
kernel's schedule inlines.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial

import numpy as np
import tvm
from tvm import relax, te, tirx, topi
from tvm.ir.expr import Constant
from tvm.ir.module import IRModule
from tvm.relax import Call, Expr, PyExprMutator, expr_functor

from common.relax_functions import rewrite_functions
from tuner.spaces.metaschedule import FLOPS_ANNOTATION
from tuner.spaces.schedule_rules import EXPAND_DEPTHWISE_RULE, VECTOR_LANES

from .dataflow import Dataflow
from .fast_math import FAST_FORMS, fast_form_applied
from .graph import op_name, static_shape


@dataclass(frozen=True)
class Silu:
    """x * sigmoid(x); ``fast``: with fast_math's polynomial exp, as the graph's own SiLU kernel computes it."""

    fast: bool


# (low, high) bounds of a clip or ReLU, None where unbounded; or a SiLU
Activation = tuple[float | None, float | None] | Silu

_CONV = "relax.nn.conv2d"
_ADD = "relax.add"
_ACTIVATIONS = {"relax.clip", "relax.nn.relu", "relax.nn.relu6"}
# Fused only where the expanded activation is larger than a core's L2 (1 MB on this machine's
# Zen 4): there, as separate kernels, it went to L3 and back at 2-3x the kernels' time alone. Smaller
# ones stay in the cache between the two kernels (within 5-15% of their time alone, run 7), and the
# fused kernel's recomputed halo rows would cost more than it saves.
MIN_EXPANDED_BYTES = 1 << 20
OPAQUE_PATTERN = 8  # relax's kOpaque: FuseOps leaves the kernel as it is


@dataclass(frozen=True)
class ExpandDepthwise:
    """The operators of one block, from the expanding convolution to the depthwise one's activation."""

    data: Expr
    expand_weight: np.ndarray  # [in_channels, channels]
    expand_bias: np.ndarray  # [channels]
    expand_activation: Activation
    depthwise_weight: np.ndarray  # [kernel_h, kernel_w, channels]
    depthwise_bias: np.ndarray
    depthwise_activation: Activation
    stride: int
    padding: tuple[int, int, int, int]  # top, left, bottom, right


def _activate(value: tirx.PrimExpr, activation: tuple[float | None, float | None]) -> tirx.PrimExpr:
    low, high = activation
    if high is not None:
        value = tirx.min(value, tirx.const(high, "float32"))
    if low is not None:
        value = tirx.max(value, tirx.const(low, "float32"))
    return value


def _activated(shape: tuple, biased, activation: Activation, name: str):
    """``activation`` of ``biased`` (a function of the indices), as a function of the indices: a clip inline;
    a SiLU through tensors of its own (``name`` and topi's), which ``schedule_expand_depthwise`` inlines."""
    if not isinstance(activation, Silu):
        return lambda *i: _activate(biased(*i), activation)
    x = te.compute(shape, biased, name=name)
    silu = FAST_FORMS["relax.nn.silu"](x) if activation.fast else topi.multiply(x, topi.sigmoid(x))
    return lambda *i: silu(*i)


def expand_depthwise(
    data: te.Tensor,
    expand_weight: te.Tensor,
    expand_bias: te.Tensor,
    depthwise_weight: te.Tensor,
    depthwise_bias: te.Tensor,
    expand_activation: Activation,
    depthwise_activation: Activation,
    stride: int,
    padding: tuple[int, int, int, int],
    out_dtype: str = "float32",
) -> te.Tensor:
    """NHWC ``act(depthwise(pad(act(data @ expand_weight + expand_bias))) + depthwise_bias)`` in ``out_dtype``."""
    batch, height, width, in_channels = (int(d) for d in data.shape)
    kernel_h, kernel_w, channels = (int(d) for d in depthwise_weight.shape)
    top, left, bottom, right = padding
    padded_h, padded_w = height + top + bottom, width + left + right
    out_h, out_w = (padded_h - kernel_h) // stride + 1, (padded_w - kernel_w) // stride + 1
    ours = {"schedule_rule": "None"}

    def inside(h, w):
        return tirx.all(h >= top, h < top + height, w >= left, w < left + width)

    clamped = te.compute(
        (batch, padded_h, padded_w, in_channels),
        lambda n, h, w, k: data[
            n, tirx.max(tirx.min(h - top, height - 1), 0), tirx.max(tirx.min(w - left, width - 1), 0), k
        ],
        name="data_clamped",
        attrs=ours,
    )
    k = te.reduce_axis((0, in_channels), "k")
    expanded = te.compute(
        (batch, padded_h, padded_w, channels),
        lambda n, h, w, c: te.sum(clamped[n, h, w, k] * expand_weight[k, c], axis=k),
        name="expand",
        attrs={**ours, FLOPS_ANNOTATION: 2.0 * batch * height * width * channels * in_channels},
    )
    zero = tirx.const(0, data.dtype)
    expand_activated = _activated(
        (batch, padded_h, padded_w, channels),
        lambda n, h, w, c: expanded[n, h, w, c] + expand_bias[c],
        expand_activation,
        "expand_biased",
    )
    padded = te.compute(
        (batch, padded_h, padded_w, channels),
        lambda n, h, w, c: tirx.if_then_else(inside(h, w), expand_activated(n, h, w, c), zero),
        name="expand_padded",
        attrs=ours,
    )
    kh, kw = te.reduce_axis((0, kernel_h), "kh"), te.reduce_axis((0, kernel_w), "kw")
    filtered = te.compute(
        (batch, out_h, out_w, channels),
        lambda n, h, w, c: te.sum(
            padded[n, h * stride + kh, w * stride + kw, c] * depthwise_weight[kh, kw, c], axis=[kh, kw]
        ),
        name="depthwise",
        attrs={"schedule_rule": EXPAND_DEPTHWISE_RULE},
    )
    depthwise_activated = _activated(
        (batch, out_h, out_w, channels),
        lambda n, h, w, c: filtered[n, h, w, c] + depthwise_bias[c],
        depthwise_activation,
        "depthwise_biased",
    )
    return te.compute(
        (batch, out_h, out_w, channels),
        lambda n, h, w, c: depthwise_activated(n, h, w, c).astype(out_dtype),
        name="depthwise_epilogue",
        attrs=ours,
    )


def _fast_kernel_input(call: Expr, operator: str) -> Expr | None:
    """The input of ``call`` where it calls fast_math's kernel for ``operator`` (``FAST_FORMS``)."""
    applied = fast_form_applied(call)
    return applied[1] if applied is not None and applied[0] is FAST_FORMS[operator] else None


def _activation(call: Call) -> Activation | None:
    name = op_name(call)
    if name == "relax.nn.relu":
        return (0.0, None)
    if name == "relax.nn.relu6":
        return (0.0, 6.0)
    if name == "relax.clip":
        bounds = call.args[1:]
        if all(isinstance(b, tirx.IntImm | tirx.FloatImm) for b in bounds):
            return (float(bounds[0].value), float(bounds[1].value))
    return None


def _conv_layout_ok(call: Call) -> bool:
    attrs = call.attrs
    return (
        (attrs.data_layout, attrs.kernel_layout, attrs.out_layout) == ("NHWC", "HWIO", "NHWC")
        and [int(d) for d in attrs.dilation] == [1, 1]
        and isinstance(call.args[1], Constant)
        and str(call.ty.dtype) == "float32"
        and static_shape(call) is not None
        and static_shape(call.args[0]) is not None
    )


def _is_depthwise(expr: Expr) -> bool:
    """A depthwise convolution, equally strided both ways, over a multiple of the vector length of
    channels."""
    if op_name(expr) != _CONV or not _conv_layout_ok(expr):
        return False
    _, _, per_group, channels = static_shape(expr.args[1])
    strides = [int(s) for s in expr.attrs.strides]
    return (
        per_group == 1
        and int(expr.attrs.groups) == channels
        and strides[0] == strides[1]
        and channels % VECTOR_LANES == 0
    )


def _is_expansion(expr: Expr) -> bool:
    """A 1x1 convolution of stride 1, without padding."""
    if op_name(expr) != _CONV or not _conv_layout_ok(expr) or int(expr.attrs.groups) != 1:
        return False
    kernel_h, kernel_w, _, _ = static_shape(expr.args[1])
    return (
        (kernel_h, kernel_w) == (1, 1)
        and [int(s) for s in expr.attrs.strides] == [1, 1]
        and not any(int(p) for p in expr.attrs.padding)
    )


def _per_channel(value: Expr, channels: int) -> np.ndarray | None:
    """A constant that adds one value per channel, as a vector."""
    if not isinstance(value, Constant):
        return None
    array = value.value.numpy()
    if array.size != channels or array.shape[-1] != channels:
        return None
    return array.reshape(channels)


def _continues(value: Expr, user: Expr | None) -> bool:
    """Whether ``user`` extends the block that ends at ``value``: a bias after a convolution, an
    activation after either."""
    if user is None or op_name(value) in _ACTIVATIONS:
        return False
    if op_name(user) in _ACTIVATIONS:
        return True
    return op_name(value) == _CONV and op_name(user) == _ADD and isinstance(user.args[1], Constant)


@expr_functor.mutator
class _FuseExpandDepthwise(PyExprMutator):
    def __init__(self, mod: IRModule, out_dtype: str, silu: bool, below_channels: int | None) -> None:
        super().__init__(mod)
        self.dataflow = Dataflow.of(mod)
        self.out_dtype = out_dtype
        self.silu = silu
        self.below_channels = below_channels  # an expansion over more input channels is left a kernel of its own

    def _sigmoid(self, var: Expr) -> tuple[Expr, bool] | None:
        """(x, fast) where ``var`` holds sigmoid(x): the operator, or fast_math's kernel of it."""
        value = self.dataflow.binding(var)
        if op_name(value) == "relax.sigmoid":
            return value.args[0], False
        x = None if value is None else _fast_kernel_input(value, "relax.sigmoid")
        return None if x is None else (x, True)

    def _silu(self, end: Expr) -> tuple[Expr, Silu] | None:
        """(x, the SiLU) where ``end`` computes x * sigmoid(x) and nothing else reads x: the operator,
        fast_math's kernel of it, or x times its sigmoid (as torch's export gives it), the sigmoid read by
        nothing else."""
        if op_name(end) == "relax.nn.silu":
            x, silu, uses = end.args[0], Silu(fast=False), 1
        elif (kernel_input := _fast_kernel_input(end, "relax.nn.silu")) is not None:
            x, silu, uses = kernel_input, Silu(fast=True), 1
        elif op_name(end) == "relax.multiply":
            x, silu, uses = None, None, 2
            for a, b in (end.args, end.args[::-1]):
                sigmoid = self._sigmoid(b)
                if sigmoid is not None and sigmoid[0].same_as(a) and self.dataflow.sole_user(b) is not None:
                    x, silu = a, Silu(fast=sigmoid[1])
            if x is None:
                return None
        else:
            return None
        read_by = self.dataflow.users.get(x, []) if isinstance(x, relax.DataflowVar) else []
        return (x, silu) if len(read_by) == uses else None

    def _continues(self, value: Expr, var: relax.Var) -> bool:
        """Whether the block that ends at ``value`` (bound to ``var``) goes on after it: a SiLU of it (where
        ``silu``) or what ``_continues`` takes."""
        if self.silu and op_name(value) not in _ACTIVATIONS:
            for user in self.dataflow.users.get(var, []):
                silu = None if user is None else self._silu(user)
                if silu is not None and silu[0].same_as(var):
                    return True
        return _continues(value, self.dataflow.sole_user(var))

    def _producer(self, expr: Expr) -> Expr | None:
        """The call that computes ``expr``, where ``expr`` is a variable used only once."""
        if self.dataflow.sole_user(expr) is None:
            return None
        return self.lookup_binding(expr)

    def _bias_and_activation(self, end: Expr) -> tuple[Expr, Expr | None, Activation] | None:
        """``end`` read as ``act(add(x, bias))``, with either part optional: (x, bias or None, act)."""
        activation: Activation = (None, None)
        silu = self._silu(end) if self.silu else None
        if silu is not None:
            activation, end = silu[1], self.lookup_binding(silu[0])
        elif op_name(end) in _ACTIVATIONS:
            found = _activation(end)
            if found is None:
                return None
            activation, end = found, self._producer(end.args[0])
        if end is None:
            return None
        if op_name(end) == _ADD and isinstance(end.args[1], Constant):
            producer = self._producer(end.args[0])
            return None if producer is None else (producer, end.args[1], activation)
        return end, None, activation

    def match(self, end: Call) -> ExpandDepthwise | None:
        """The block that ends at ``end``, if ``end`` ends one that can be fused."""
        tail = self._bias_and_activation(end)
        if tail is None or not _is_depthwise(tail[0]):
            return None
        depthwise, depthwise_bias, depthwise_activation = tail
        head = self._producer(depthwise.args[0])
        head = None if head is None else self._bias_and_activation(head)
        if head is None or not _is_expansion(head[0]):
            return None
        expand, expand_bias, expand_activation = head
        in_channels, channels = static_shape(expand.args[1])[2:]
        kernel_h, kernel_w, _, depthwise_channels = static_shape(depthwise.args[1])
        biases = [
            np.zeros(channels, "float32") if b is None else _per_channel(b, channels)
            for b in (expand_bias, depthwise_bias)
        ]
        if depthwise_channels != channels or any(b is None for b in biases):
            return None
        if self.below_channels is not None and in_channels >= self.below_channels:
            return None
        if math.prod(static_shape(expand)) * 4 < MIN_EXPANDED_BYTES:
            return None
        return ExpandDepthwise(
            data=expand.args[0],
            expand_weight=expand.args[1].value.numpy().reshape(in_channels, channels),
            expand_bias=biases[0],
            expand_activation=expand_activation,
            depthwise_weight=depthwise.args[1].value.numpy().reshape(kernel_h, kernel_w, channels),
            depthwise_bias=biases[1],
            depthwise_activation=depthwise_activation,
            stride=int(depthwise.attrs.strides[0]),
            padding=tuple(int(p) for p in depthwise.attrs.padding),
        )

    def visit_call_(self, call: Call) -> Expr:
        var = self.dataflow.bound_to.get(call)
        ends_block = var is not None and not self._continues(call, var)
        call = super().visit_call_(call)
        block = self.match(call) if ends_block and isinstance(call, Call) else None
        if block is None:
            return call
        fused = self.builder_.call_te(
            # bound here: call_te takes no argument of a type of ours (a ``Silu``)
            partial(
                expand_depthwise,
                expand_activation=block.expand_activation,
                depthwise_activation=block.depthwise_activation,
            ),
            block.data,
            relax.const(block.expand_weight),
            relax.const(block.expand_bias),
            relax.const(block.depthwise_weight),
            relax.const(block.depthwise_bias),
            stride=block.stride,
            padding=block.padding,
            out_dtype=self.out_dtype,
            primfunc_name_hint="expand_depthwise",
            primfunc_attrs={"op_pattern": OPAQUE_PATTERN},
        )
        if self.out_dtype == "float32":
            return fused
        # for the block's other readers; a bf16 product reads the kernel's output itself (``bf16``)
        return relax.op.astype(self.builder_.emit(fused), "float32")


@tvm.transform.module_pass(opt_level=0, name="FuseExpandDepthwise")
class FuseExpandDepthwise:
    """Each NHWC 1x1 expanding convolution followed by a depthwise convolution (biases and clip/ReLU
    activations, and SiLUs where ``silu``, between and after them allowed), whose intermediate results have
    no other use, as one ``expand_depthwise`` kernel, which writes ``out_dtype`` (widened to float32 after it
    where that is not float32); with ``below_channels``, only expansions over fewer input channels."""

    def __init__(self, out_dtype: str = "float32", silu: bool = True, below_channels: int | None = None) -> None:
        self.out_dtype = out_dtype
        self.silu = silu
        self.below_channels = below_channels

    def transform_module(self, mod: IRModule, ctx: tvm.transform.PassContext) -> IRModule:
        return rewrite_functions(_FuseExpandDepthwise(mod, self.out_dtype, self.silu, self.below_channels), mod)
