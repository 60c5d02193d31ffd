"""2-D convolutions computed channels-last (NHWC activations, HWIO weights) in models written
channels-first (NCHW), with the layout changes between them cancelled out.

On a CPU, MetaSchedule's NCHW convolutions vectorise along the image width (7 to 56 here); the
same convolutions in NHWC vectorise along the channels and run close to the FMA peak (measured in
experiments/README.md, "The inference lowering these numbers rest on"). TVM's own ConvertLayout
does this, but in TVM 0.27 it crashes (a segfault or bad_alloc) on half of the zoo's models, so
this pass does the part the models need.

Each convolution becomes ``to_nchw(conv2d_nhwc(to_nhwc(x), hwio(w)))``; then every ``to_nchw`` is
moved past the operators that do not care about the layout (element-wise ops, bias and residual
adds, pooling, mean, concatenation, group norm), so that it meets the next convolution's
``to_nhwc`` and both disappear. What is left is one transpose at the model's input and one where
the network leaves the image layout (its head), which layout fusion makes part of the next kernel.

With ``resizes``, image resizes (a segmentation head's upsampling) are moved too, and a sequence
``(N, H*W, C)`` transposed and reshaped into an image (``(N, C, H, W)``) is that sequence reshaped as
NHWC: SegFormer's head read each token's 256 channels 256 floats apart to upsample them channels-first
(four resizes, 22 ms of its 34), then transposed the concatenated 1,024 channels back (3.4 ms). A
resize to the size it starts from (bilinear or nearest, every coordinate mode but cubic's) is dropped.

An image flattened into a sequence of tokens (a patch embedding's ``flatten(2).transpose(1, 2)``) is the
NHWC image reshaped: Swin-T's 4x4/4 stem, left NCHW, vectorised along the width and gathered its inputs
4 floats apart (2.0 ms, 7% of the model); NHWC into its tokens it takes 0.21 ms and the image's transpose
0.07 ms.

Those edge transposes are worth it only when there is enough convolution between them: a function
whose convolutions do fewer than ``MIN_FLOPS_PER_EDGE_BYTE`` operations per byte the edges move is
left in NCHW (a lone depthwise convolution: 2 FLOP per byte, and 121 us in NCHW against 350 us
with its two transposes).
"""

from __future__ import annotations

import math

import tvm
from tvm import relax
from tvm.ir.module import IRModule
from tvm.relax import Call, Expr, PyExprMutator, expr_functor

from common.relax_functions import rewrite_functions
from tuner.spaces.schedule_rules import VECTOR_LANES

from .fast_math import fast_form_applied, fast_form_call
from .graph import conv2d_like, ints, op_name, static_shape
from .numpy_folding import fold_constants

# Channels are the vectorised axis of an NHWC convolution; MetaSchedule tiles an axis only by its
# exact divisors, so an output-channel count that is not a multiple of the vector length (1000
# classes) gets half-width vectors at best: SqueezeNet's 512 -> 1000 classifier ran well below the
# rate its other convolutions reach. Such a convolution gets zero weights up to the next multiple of two
# vectors (a register tile two vectors wide needs its columns in whole pairs: SqueezeNet's classifier over
# 13 x 13 positions ran 13 x 1 over 1008 channels, 15% slower alone than 13 x 2 over 1024), else of one,
# and its result sliced back, where that adds at most 1/8 of work (VECTOR_LANES: AVX-512's fp32 lanes).
MAX_PADDING = 0.125
PADDED_MULTIPLE = 2 * VECTOR_LANES

# Measured here (64 trials each, alone, experiments/vs_frameworks.md): channels-last with its edge transposes
# against NCHW, a 3x3 convolution at 144 FLOP per edge byte 1175 against 1489 us, a 1x1 at 51 FLOP/B 592
# against 648 us, a depthwise convolution at 2 FLOP/B 416 against 112 us.
MIN_FLOPS_PER_EDGE_BYTE = 16.0

TO_NHWC = [0, 2, 3, 1]
TO_NCHW = [0, 3, 1, 2]
# by rank: images (NCHW <-> NHWC) and sequences (NCW <-> NWC, 1-D convolutions as ``conv1d`` lowers them)
TO_CHANNELS_FIRST = {4: TO_NCHW, 3: [0, 2, 1]}
TO_CHANNELS_LAST = {4: TO_NHWC, 3: [0, 2, 1]}
ELEMENT_WISE_RANKS = (4, 3)  # the ranks element-wise ops are moved past layout changes in
_UNARY = {
    f"relax.{op}"
    for op in (
        "nn.relu",
        "nn.relu6",
        "clip",
        "sigmoid",
        "nn.silu",
        "nn.gelu",
        "nn.gelu_tanh",
        "tanh",
        "exp",
        "negative",
        "astype",
    )
}
_BINARY = {f"relax.{op}" for op in ("add", "subtract", "multiply", "divide", "maximum", "minimum")}
_POOLS = {"relax.nn.max_pool2d", "relax.nn.avg_pool2d", "relax.nn.adaptive_avg_pool2d"}


def _padded_channels(channels: int) -> int:
    if channels % VECTOR_LANES == 0:
        return channels
    for multiple in (PADDED_MULTIPLE, VECTOR_LANES):
        padded = -(-channels // multiple) * multiple
        if padded - channels <= MAX_PADDING * channels:
            return padded
    return channels


def _axes(call: Call) -> list[int] | None:
    axes = call.attrs.axes
    return None if axes is None else ints(axes)


@expr_functor.mutator
class _ChannelsLast(PyExprMutator):
    def __init__(self, mod: IRModule, resizes: bool, convolutions: bool = True):
        super().__init__(mod)
        self.resizes = resizes
        self.convolutions = convolutions  # False: only the model's own transposes composed (``_pays``' baseline)

    def _nchw_source(self, expr: Expr, ranks: tuple[int, ...] = (4,)) -> Expr | None:
        """``y`` if ``expr`` is ``to_nchw(y)`` (also through a tuple: torch's pooling with
        ``ceil_mode`` imports as ``(max_pool2d(x),)[0]``); with rank 3 among ``ranks``, also if it is
        ``y`` NWC (a 1-D convolution's, ``conv1d``) back to NCW."""
        value = self.lookup_binding(expr) if isinstance(expr, relax.Var) else None
        if isinstance(value, relax.TupleGetItem):
            tuple_value = (
                self.lookup_binding(value.tuple_value)
                if isinstance(value.tuple_value, relax.Var)
                else value.tuple_value
            )
            if isinstance(tuple_value, relax.Tuple):
                return self._nchw_source(tuple_value.fields[int(value.index)], ranks)
            return None
        if op_name(value) == "relax.reshape" and self.resizes and 4 in ranks:
            return self._image_of_sequence(value)
        if op_name(value) != "relax.permute_dims":
            return None
        rank = len(static_shape(value.args[0]) or ())
        return value.args[0] if rank in ranks and _axes(value) == TO_CHANNELS_FIRST.get(rank) else None

    def _image_of_sequence(self, reshape: Call) -> Expr | None:
        """For ``reshape(permute_dims(x, [0, 2, 1]), (N, C, H, W))`` of a sequence ``x`` of ``(N, H*W, C)``:
        ``x`` reshaped to ``(N, H, W, C)``."""
        transposed = self.lookup_binding(reshape.args[0]) if isinstance(reshape.args[0], relax.Var) else None
        image, sequence = static_shape(reshape), None
        if op_name(transposed) == "relax.permute_dims" and _axes(transposed) == [0, 2, 1]:
            sequence = static_shape(transposed.args[0])
        if image is None or sequence is None or len(image) != 4:
            return None
        n, c, h, w = image
        if sequence != (n, h * w, c):
            return None
        return self.builder_.emit(relax.op.reshape(transposed.args[0], (n, h, w, c)))

    def _sequence_of_image(self, reshape: Call) -> Expr | None:
        """For ``permute_dims(reshape(to_nchw(y), (N, C, H*W)), [0, 2, 1])`` (a patch embedding's
        ``flatten(2).transpose(1, 2)``) of ``y`` NHWC: ``y`` reshaped to ``(N, H*W, C)``, no transpose."""
        image = self._nchw_source(reshape.args[0])
        shape = static_shape(image) if image is not None else None
        if shape is None or len(shape) != 4:
            return None
        n, h, w, c = shape
        if static_shape(reshape) != (n, c, h * w):
            return None
        return relax.op.reshape(image, (n, h * w, c))

    def _to_nchw(self, expr: Expr) -> Expr:
        """``expr`` (NHWC, or NWC) back to channels-first."""
        bound = self.builder_.emit(expr)
        return relax.op.permute_dims(bound, TO_CHANNELS_FIRST[int(bound.ty.ndim)])

    def visit_call_(self, call: Call) -> Expr:
        call = super().visit_call_(call)
        if not isinstance(call, Call) or not isinstance(call.op, tvm.ir.Op):
            return call
        name = call.op.name
        rewrite = {
            "relax.nn.conv2d": self._conv2d,
            "relax.permute_dims": self._permute,
            "relax.mean": self._mean,
            "relax.concat": self._concat,
            "relax.nn.group_norm": self._group_norm,
            "relax.call_tir": self._fast_form,
            "relax.image.resize2d": self._resize,
        }.get(name)
        if rewrite is not None:
            return rewrite(call)
        if name in _UNARY:
            source = self._nchw_source(call.args[0], ELEMENT_WISE_RANKS)
            return (
                call
                if source is None
                else self._to_nchw(relax.Call(call.op, [source, *call.args[1:]], call.attrs, call.ty_args))
            )
        if name in _BINARY:
            return self._binary(call)
        if name in _POOLS:
            return self._pool(call)
        return call

    def _conv2d(self, call: Call) -> Expr:
        attrs = call.attrs
        if (
            not self.convolutions
            or (attrs.data_layout, attrs.kernel_layout, attrs.out_layout) != ("NCHW", "OIHW", "NCHW")
            or static_shape(call) is None
        ):
            return call
        data, weight = call.args
        source = self._nchw_source(data)
        data = source if source is not None else relax.op.permute_dims(data, TO_NHWC)
        channels = static_shape(call)[1]
        padded = (
            _padded_channels(channels)
            if int(attrs.groups) == 1 and isinstance(weight, tvm.ir.expr.Constant)
            else channels
        )
        hwio = relax.op.permute_dims(weight, [2, 3, 1, 0])  # OIHW -> HWIO (a constant weight is folded)
        if padded != channels:
            hwio = relax.op.nn.pad(hwio, [0, 0, 0, 0, 0, 0, 0, padded - channels])
        out = conv2d_like(call, data, hwio, data_layout="NHWC", kernel_layout="HWIO", out_layout="NHWC")
        if padded != channels:
            out = relax.op.strided_slice(self.builder_.emit(out), axes=[3], begin=[0], end=[channels])
        return self._to_nchw(out)

    def _permute(self, call: Call) -> Expr:
        """Two transposes in a row as one, or none where they undo each other; an image flattened into
        a sequence, as the sequence of its NHWC form (``_sequence_of_image``)."""
        inner = self.lookup_binding(call.args[0]) if isinstance(call.args[0], relax.Var) else None
        outer = _axes(call)
        if op_name(inner) == "relax.reshape" and outer == [0, 2, 1]:
            sequence = self._sequence_of_image(inner)
            return call if sequence is None else sequence
        if op_name(inner) != "relax.permute_dims" or outer is None:
            return call
        first = _axes(inner)
        if first is None or len(first) != len(outer):
            return call
        composed = [first[a] for a in outer]
        if composed == list(range(len(composed))):
            return inner.args[0]
        return relax.op.permute_dims(inner.args[0], composed)

    def _fast_form(self, call: Call) -> Expr:
        """An element-wise activation given its fast form before this pass (``rewrites``), as a unary op."""
        applied = fast_form_applied(call)
        if applied is None:
            return call
        form, x = applied
        source = self._nchw_source(x, ELEMENT_WISE_RANKS)
        return call if source is None else self._to_nchw(fast_form_call(self.builder_, form, source))

    def _binary(self, call: Call) -> Expr:
        a, b = call.args
        sources = [self._nchw_source(a, ELEMENT_WISE_RANKS), self._nchw_source(b, ELEMENT_WISE_RANKS)]
        rank = len(static_shape(call) or ())
        if all(s is None for s in sources) or any(s is not None and len(static_shape(s)) != rank for s in sources):
            return call  # an image broadcast against a sequence: their layouts do not line up
        operands = []
        for operand, source in zip((a, b), sources, strict=True):
            if source is not None:
                operands.append(source)
                continue
            converted = self._as_channels_last(operand, static_shape(call))
            if converted is None:
                return call
            operands.append(converted)
        return self._to_nchw(relax.Call(call.op, operands, call.attrs, call.ty_args))

    def _as_channels_last(self, operand: Expr, out_shape: tuple[int, ...] | None) -> Expr | None:
        """The other operand of a binary op, as it combines with an NHWC tensor: a constant (a bias,
        a folded norm's scale) transposed, or a tensor of the output's own shape transposed."""
        shape = static_shape(operand)
        if shape is None or out_shape is None or len(out_shape) not in ELEMENT_WISE_RANKS:
            return None
        rank, to_last = len(out_shape), TO_CHANNELS_LAST[len(out_shape)]
        if isinstance(operand, tvm.ir.expr.Constant):
            if len(shape) > rank:
                return None
            padded = relax.op.reshape(operand, (1,) * (rank - len(shape)) + shape) if len(shape) < rank else operand
            return relax.op.permute_dims(padded, to_last)
        return relax.op.permute_dims(operand, to_last) if shape == out_shape else None

    def _pool(self, call: Call) -> Expr:
        source = self._nchw_source(call.args[0])
        attrs = call.attrs
        if source is None or attrs.layout != "NCHW" or attrs.out_layout != "NCHW":
            return call
        if call.op.name == "relax.nn.adaptive_avg_pool2d":
            size = None if attrs.output_size is None else [int(d) for d in attrs.output_size]
            return self._to_nchw(relax.op.nn.adaptive_avg_pool2d(source, size, layout="NHWC", out_layout="NHWC"))
        pool = relax.op.nn.max_pool2d if call.op.name == "relax.nn.max_pool2d" else relax.op.nn.avg_pool2d
        pooled = pool(
            source,
            ints(attrs.pool_size),
            ints(attrs.strides),
            ints(attrs.padding),
            ints(attrs.dilation),
            bool(attrs.ceil_mode),
            bool(attrs.count_include_pad),
            layout="NHWC",
            out_layout="NHWC",
        )
        return self._to_nchw(pooled)

    def _resize(self, call: Call) -> Expr:
        attrs = call.attrs
        source = self._nchw_source(call.args[0]) if self.resizes and attrs.layout == "NCHW" else None
        shape = static_shape(call)
        if source is None or shape is None:
            return call
        same_size = shape == static_shape(call.args[0])
        if same_size and attrs.method != "cubic" and attrs.coordinate_transformation_mode != "tf_crop_and_resize":
            return self._to_nchw(source)  # every output point is an input point: nothing to interpolate
        resized = relax.op.image.resize2d(
            source,
            shape[2:],
            [float(r) for r in attrs.roi],
            "NHWC",
            attrs.method,
            attrs.coordinate_transformation_mode,
            attrs.rounding_method,
            float(attrs.cubic_alpha),
            int(attrs.cubic_exclude),
            float(attrs.extrapolation_value),
            attrs.out_dtype if str(attrs.out_dtype) else None,
        )
        return self._to_nchw(resized)

    def _mean(self, call: Call) -> Expr:
        source = self._nchw_source(call.args[0])
        axes = call.attrs.axis
        if source is None or axes is None or sorted(int(a) % 4 for a in axes) != [2, 3]:
            return call
        if call.attrs.keepdims:
            return self._to_nchw(relax.op.mean(source, axis=[1, 2], keepdims=True))
        return relax.op.mean(source, axis=[1, 2], keepdims=False)  # (N, C) either way

    def _concat(self, call: Call) -> Expr:
        fields = call.args[0]
        if not isinstance(fields, relax.Tuple) or int(call.attrs.axis) % 4 != 1:
            return call
        sources = [self._nchw_source(f) for f in fields.fields]
        if any(s is None for s in sources):
            return call
        return self._to_nchw(relax.op.concat(sources, axis=3))

    def _group_norm(self, call: Call) -> Expr:
        """A group norm over an image's (or a sequence's: wav2vec 2.0's first convolution) positions."""
        source = self._nchw_source(call.args[0], ELEMENT_WISE_RANKS)
        attrs = call.attrs
        rank = len(static_shape(call) or ())
        if source is None or int(attrs.channel_axis) != 1 or sorted(int(a) for a in attrs.axes) != list(range(2, rank)):
            return call
        normed = relax.op.nn.group_norm(
            source,
            call.args[1],
            call.args[2],
            int(attrs.num_groups),
            rank - 1,
            list(range(1, rank - 1)),
            float(attrs.epsilon),
            bool(attrs.center),
            bool(attrs.scale),
        )
        return self._to_nchw(normed)


@tvm.transform.module_pass(opt_level=0, name="ChannelsLastConvolutions")
class ChannelsLastConvolutions:
    """NCHW 2-D convolutions computed in NHWC, with the transposes between them cancelled; with
    ``resizes``, through image resizes and sequences reshaped into images too."""

    def __init__(self, resizes: bool = True):
        self.resizes = resizes

    def transform_module(self, mod: IRModule, ctx: tvm.transform.PassContext) -> IRModule:
        rewritten, baseline = (
            self._rewritten(mod, _ChannelsLast(mod, self.resizes, convolutions)) for convolutions in (True, False)
        )
        for gv, func in mod.functions_items():
            if isinstance(func, relax.Function) and not _pays(rewritten[gv], baseline[gv]):
                rewritten[gv] = func
        return rewritten

    def _rewritten(self, mod: IRModule, mutator: _ChannelsLast) -> IRModule:
        rewritten = rewrite_functions(mutator, mod)
        if self.resizes:  # sequences' sources looked for and not taken leave reshapes unused
            for gv, func in rewritten.functions_items():
                if isinstance(func, relax.Function):
                    rewritten[gv] = relax.analysis.remove_all_unused(func)
        return fold_constants()(rewritten)  # the weights' transposes folded


def _pays(func: relax.Function, baseline: relax.Function) -> bool:
    """Whether the channels-last function does enough convolution for the layout changes it adds: those
    left in it beyond the ``baseline``'s (the model's own transposes, composed as this pass composes
    them: Swin-T's attention has four that read as NHWC ones). A function without convolutions keeps its
    sequences' transposes where they were."""
    flops, edge_bytes = _convolution_flops_and_edge_bytes(func)
    added = edge_bytes - _convolution_flops_and_edge_bytes(baseline)[1]
    return flops > 0 and flops >= MIN_FLOPS_PER_EDGE_BYTE * added


def _convolution_flops_and_edge_bytes(func: relax.Function) -> tuple[int, int]:
    """The FLOPs of a function's NHWC convolutions, and the bytes its layout changes (NCHW <-> NHWC,
    NCW <-> NWC) move."""
    flops, edge_bytes = 0, 0
    for block in relax.analysis.remove_all_unused(func).body.blocks:
        for binding in block.bindings:
            value = binding.value
            if not isinstance(value, Call) or not isinstance(value.op, tvm.ir.Op):
                continue
            if value.op.name == "relax.nn.conv2d" and value.attrs.data_layout == "NHWC":
                flops += _conv2d_nhwc_flops(value)
            elif value.op.name == "relax.permute_dims" and _axes(value) in (TO_NHWC, TO_NCHW, TO_CHANNELS_LAST[3]):
                shape = static_shape(value.args[0])
                edge_bytes += math.prod(shape) * tvm.DataType(str(value.args[0].ty.dtype)).bits // 8 if shape else 0
    return flops, edge_bytes


def _conv2d_nhwc_flops(call: Call) -> int:
    out, weight = static_shape(call), static_shape(call.args[1])  # NHWC and HWIO (I per group)
    if out is None or weight is None:
        return 0
    kernel_h, kernel_w, inputs_per_group, _ = weight
    return 2 * math.prod(out) * kernel_h * kernel_w * inputs_per_group
