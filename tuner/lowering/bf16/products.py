"""A model's convolutions and matmuls by constant weights computed from bfloat16 operands into
float32 accumulators; everything else stays float32, and so do the model's inputs and outputs.

Each such operator reads its activation cast to bf16 (the cast fuses into the kernel that produces
the activation, so activations travel between kernels in bf16 where a product reads them) and its
weight converted once, here. On a CPU with AVX512_BF16 the weight is packed [N/16, K/2, 16, 2]
(convolutions [KH, KW, N/16, C/2, 16, 2]) and the product is a kernel of ours whose schedule uses
the micro-kernels of ``vdpbf16ps``, or of AMX's ``tdpbf16ps`` where the CPU has it (``tuner.spaces.bf16_rule``;
an odd channel count gets a zero channel, the outputs zero ones up to a multiple of 16, sliced off
after; a grouped convolution of wide groups, one such kernel, its groups an axis of the product). Elsewhere,
and for the products those kernels do not take (dilated convolutions, grouped ones of narrow or small groups,
an odd reduction in a matmul), Relax's own operator with bf16 operands and a float32 result: bf16 storage,
fp32 arithmetic, as PyTorch computes bf16 on such CPUs. Matmuls of two activations (attention's) are bf16
products too, with the second operand packed inside the kernel. Where the CPU's bf16 products are calibrated
slower than its float32 ones, a product that runs faster in float32 is left as it is (``precision``).
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.ir.expr import Constant
from tvm.ir.module import IRModule
from tvm.relax import Call, Expr, PyExprMutator, expr_functor

from codegen.amx_dot import STEP_VALUES
from codegen.bf16_dot import AMX, AVX512, LANES, PAIR
from common.relax_functions import rewrite_functions
from tuner.lowering.graph import conv2d_like, ints, op_name, static_shape
from tuner.lowering.inverted_residual import OPAQUE_PATTERN
from tuner.spaces.bf16_rule import padded_rows

from .flat import (
    bf16_conv2d_flat,
    bf16_conv2d_image_windows,
    bf16_padded_image,
    bf16_padded_patches,
    bf16_patches,
    bf16_patches_product,
    flat_rows,
    has_flat_view,
    image_windows_extent,
    pack_patch_weight,
    pack_window_rows_weight,
    padded_image_extent,
    patch_rows,
    patch_width,
    window_run,
)
from .kernels import (
    BF16,
    F32,
    bf16_batch_matmul,
    bf16_conv2d_nhwc,
    bf16_dense,
    bf16_grouped_conv2d_nhwc,
    conv2d_flops,
    out_extent,
    pack_conv_weight,
    pack_dense_weight,
    pack_grouped_conv_weight,
    to_bf16,
)
from .precision import ProductPrecision

AMX_MIN_REDUCTION = STEP_VALUES  # one whole step of AMX's micro-kernel
PATCHES_BELOW_CHANNELS = 8  # a first convolution's (RGB): its products over its window's patches
# the least reduction of a product of two activations on vdpbf16ps (attention's head dimensions are 32-128, its
# tokens more): a guard against products of a few channels, where the pack in the kernel would be most of it
MIN_ACTIVATION_PRODUCT_REDUCTION = 16
# a grouped convolution on our kernels (``wide_groups``): one product whose groups are an axis of it. RegNet's groups
# of 64 channels in bf16 on a 2-core Xeon with AMX (2026-12-05), each alone as a kernel: 2 groups of 56x56 outputs
# 0.38 ms against 0.54 as one convolution over zero weights across the groups (and 0.62 split per group with the
# split and concatenation); 8 of 14x14 81 us against 0.2 ms split; 17 of 7x7 (3.6 MFLOP a group) 74 us against
# 0.25 ms in fp32
MIN_GROUP_CHANNELS = 16
MIN_GROUPED_FLOPS = 8e6


def wide_groups(groups: int, weight: np.ndarray, image: tuple[int, ...], stride: int, padding: tuple[int, ...]) -> bool:
    """Whether a convolution of ``groups`` groups (its HWIO ``weight``, an NHWC ``image``) is one of ours:
    groups wide enough for our tiles (a depthwise convolution's one channel is not) and a kernel worth the
    launch."""
    (kernel_h, kernel_w, channels, all_outputs), (batch, height, width, _) = weight.shape, image
    out_h = out_extent(height, padding[0], padding[2], kernel_h, stride)
    out_w = out_extent(width, padding[1], padding[3], kernel_w, stride)
    flops = conv2d_flops(batch, out_h, out_w, all_outputs, (kernel_h, kernel_w), channels)
    wide = channels >= MIN_GROUP_CHANNELS and all_outputs // groups >= LANES
    return 1 < groups and wide and flops >= MIN_GROUPED_FLOPS


def _channel_step(unit: str) -> int:
    """The multiple a product's reduction is padded to on ``unit``: AMX's whole steps (a rest loads a second
    tile configuration and the accumulators twice per call), else an even count for ``vdpbf16ps``'s pairs."""
    return AMX_MIN_REDUCTION if unit == AMX else PAIR


def is_fp32(expr: Expr) -> bool:
    return isinstance(expr.ty, relax.TensorType) and str(expr.ty.dtype) == F32


def is_bf16(expr: Expr) -> bool:
    return isinstance(expr.ty, relax.TensorType) and str(expr.ty.dtype) == BF16


@expr_functor.mutator
class _Bfloat16Products(PyExprMutator):
    def __init__(
        self,
        mod: IRModule,
        unit: str | None,
        image_windows: bool,
        activation_products: bool,
        precision: ProductPrecision | None,
    ) -> None:
        super().__init__(mod)
        self.unit = unit  # the CPU's bf16 dot product (AVX512_BF16, AMX): our kernels, packed weights
        self.precision = precision  # which products compute in bf16; None: all of them
        self.image_windows = image_windows  # a first convolution reads its padded image in place
        self.activation_products = activation_products  # attention's products of two activations in bf16
        self.rounded: dict[relax.Var, Expr] = {}  # an activation cast to bf16 for a product: that cast
        self.widened: dict[relax.Var, Expr] = {}  # and the cast back, for the activation's other readers

    def _cast(self, expr: Expr) -> Expr:
        """``expr`` in bf16: as it is where it is bf16 already (patches), else cast (once per activation)."""
        if is_bf16(expr):
            return expr
        widening = self.lookup_binding(expr) if isinstance(expr, relax.Var) else None
        # an activation widened from bf16 (one another product read first, a fused inverted residual's output):
        # its bf16 original
        if isinstance(widening, Call) and op_name(widening) == "relax.astype" and is_bf16(widening.args[0]):
            return widening.args[0]
        if isinstance(expr, relax.Var) and self.unit is not None:
            if expr not in self.rounded:
                self.rounded[expr] = self.builder_.emit(relax.op.astype(expr, BF16))
            return self.rounded[expr]
        return self.builder_.emit(relax.op.astype(expr, BF16))

    def _from_bf16(self, arg: Expr) -> Expr:
        """An activation read after a product read it in bf16 is read from that bf16 copy (a residual
        block's output: by its sum as by the next block's convolution), so that its producer writes
        bf16 alone, the cast fused into it, and no kernel of its own casts it: as OpenVINO keeps
        activations in bf16 between kernels."""
        if not isinstance(arg, relax.Var) or arg not in self.rounded:
            return arg
        if arg not in self.widened:
            self.widened[arg] = self.builder_.emit(relax.op.astype(self.rounded[arg], F32))
        return self.widened[arg]

    def visit_call_(self, call: Call) -> Expr:
        call = super().visit_call_(call)
        if self.rounded and any(isinstance(arg, relax.Var) and arg in self.rounded for arg in call.args):
            call = Call(call.op, [self._from_bf16(arg) for arg in call.args], call.attrs, call.ty_args)
        name = op_name(call)
        if name not in ("relax.matmul", "relax.nn.conv2d") or not is_fp32(call.args[0]):
            return call
        if isinstance(call.args[0], Constant):  # a sum as a product (``channel_norms``): kept in fp32
            return call
        if self.precision is not None and not self._faster_in_bf16(call):
            return call
        if not isinstance(call.args[1], Constant):  # a product of two activations (attention's)
            return self._batch_matmul(call)
        return self._matmul(call) if name == "relax.matmul" else self._conv2d(call)

    def _faster_in_bf16(self, call: Call) -> bool:
        """Whether the product ``call`` runs faster in bf16 than in float32 here (``self.precision``); a
        product whose shapes are known only at run time stays in bf16, as every product does where bf16 is
        the faster."""
        shapes = [static_shape(arg) for arg in call.args[:2]]
        out = static_shape(self.builder_.normalize(call))
        if any(shape is None for shape in (*shapes, out)):
            return True
        if op_name(call) == "relax.nn.conv2d":  # HWIO or OIHW alike: its values over its output channels
            reduction = int(np.prod(shapes[1])) // out[-1 if call.attrs.out_layout == "NHWC" else 1]
        else:
            reduction = shapes[0][-1]
        flops = 2 * int(np.prod(out)) * reduction
        return self.precision.in_bf16(flops, sum(int(np.prod(shape)) for shape in shapes))

    def _packed_product(self, compute, data: Expr, packed: np.ndarray, *args, name: str) -> Expr:
        """``compute`` (a TE product of ``bf16_kernels``/``bf16_flat``) of ``data`` cast to bf16 and the
        packed weight, converted once, here."""
        return self.builder_.call_te(
            compute, self._cast(data), relax.const(to_bf16(packed)), *args, primfunc_name_hint=name
        )

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
            out = self._packed_product(bf16_dense, data, packed, padded, unit, name="bf16_dense")
            return self._computed(out, rows, weight.shape[1])
        return relax.op.matmul(self._cast(data), relax.const(to_bf16(weight)), out_dtype=F32)

    def _batch_matmul(self, call: Call) -> Expr:
        """bf16 where both operands' shapes are known and their batch axes alike; else fp32."""
        a, b = (static_shape(arg) for arg in call.args)
        if self.unit is None or not a or not b or len(a) != len(b) or len(a) < 3 or a[:-2] != b[:-2]:
            return call
        if not self.activation_products:
            return call
        least = AMX_MIN_REDUCTION if self.unit == AMX else MIN_ACTIVATION_PRODUCT_REDUCTION
        if not is_fp32(call.args[1]) or a[-1] + a[-1] % PAIR < least:
            return call
        rows = padded_rows(a[-2], -(-b[-1] // LANES), self.unit)
        first, second = (self._cast(arg) for arg in call.args)
        return self.builder_.call_te(
            bf16_batch_matmul, first, second, rows, self.unit, primfunc_name_hint="bf16_batch_matmul"
        )

    def _conv2d(self, call: Call) -> Expr:
        attrs = call.attrs
        data, weight = call.args[0], call.args[1].value.numpy()
        layouts = (attrs.data_layout, attrs.kernel_layout, attrs.out_layout)
        strides = [int(s) for s in attrs.strides]
        groups, padding = int(attrs.groups), tuple(int(p) for p in attrs.padding)
        ours = (
            self.unit is not None
            and layouts == ("NHWC", "HWIO", "NHWC")
            and [int(d) for d in attrs.dilation] == [1, 1]
            and strides[0] == strides[1]
            and static_shape(data) is not None
        )
        if ours and groups == 1:
            return self._packed_conv2d(data, weight, strides[0], padding)
        if ours and wide_groups(groups, weight, static_shape(data), strides[0], padding):
            return self._grouped_conv2d(data, weight, groups, strides[0], padding)
        return conv2d_like(call, self._cast(data), relax.const(to_bf16(weight)), out_dtype=F32)

    def _grouped_conv2d(
        self, data: Expr, weight: np.ndarray, groups: int, stride: int, padding: tuple[int, ...]
    ) -> Expr:
        """A grouped convolution as one of our convolutions, its groups an axis of the product
        (``bf16_grouped_conv2d_nhwc``): RegNet's, 64 channels a group, ran in fp32 at 4% of AMX's peak (1.9 of
        6.0 ms for the first alone, on a 2-core Xeon), where OpenVINO computes them in bf16."""
        channels, outputs = weight.shape[2], weight.shape[3] // groups
        unit = self._unit_for(channels + channels % PAIR)
        packed = pack_grouped_conv_weight(weight, groups, _channel_step(unit))
        out_w = out_extent(static_shape(data)[2], padding[1], padding[3], weight.shape[1], stride)
        columns = padded_rows(out_w, packed.shape[3], unit)
        return self._packed_product(
            bf16_grouped_conv2d_nhwc, data, packed, stride, padding, outputs, columns, unit, name="bf16_grouped_conv2d"
        )

    def _packed_conv2d(self, data: Expr, weight: np.ndarray, stride: int, padding: tuple[int, ...]) -> Expr:
        image, kernel = static_shape(data)[1:3], weight.shape[:2]
        if kernel[0] * kernel[1] > 1 and self._over_patches(weight.shape[2]):
            in_place = self._image_windows_conv2d(data, weight, stride, padding)
            return in_place if in_place is not None else self._patches_conv2d(data, weight, stride, padding)
        unit = self._unit_for(weight.shape[2] + weight.shape[2] % PAIR)
        packed = pack_conv_weight(weight, _channel_step(unit))  # [KH, KW, N/16, C/2, 16, 2]
        flat = flat_rows(image, kernel, stride, padding, packed.shape[2], unit) if unit == AMX else None
        if flat is not None:
            view = None
            if has_flat_view(image, kernel, stride, padding, packed.shape[3] * PAIR - weight.shape[2], flat):
                batch, channels = static_shape(data)[0], weight.shape[2]
                data = self.builder_.emit(relax.op.reshape(self._cast(data), (batch, 1, 1, flat, channels)))
                view = tuple(image)
            return self._packed_product(
                bf16_conv2d_flat, data, packed, stride, padding, flat, weight.shape[3], unit, view, name="bf16_conv2d"
            )
        out_w = out_extent(image[1], padding[1], padding[3], kernel[1], stride)
        columns = padded_rows(out_w, packed.shape[2], unit)
        out = self._packed_product(bf16_conv2d_nhwc, data, packed, stride, padding, columns, unit, name="bf16_conv2d")
        return self._computed(out, out_w, weight.shape[3])

    def _over_patches(self, channels: int) -> bool:
        """Whether a convolution over a window of ``channels`` input channels is best a product over its
        patches: a first convolution's 3, and on AMX any too few for one step (SqueezeNet's 16: its
        window's 9 calls over 16 channels each ran on ``vdpbf16ps``, at 230 GFLOP/s)."""
        least = AMX_MIN_REDUCTION if self.unit == AMX else PATCHES_BELOW_CHANNELS
        return channels + channels % PAIR < least

    def _image_windows_conv2d(
        self, data: Expr, weight: np.ndarray, stride: int, padding: tuple[int, ...]
    ) -> Expr | None:
        """A first convolution over its padded image read in place (``bf16_conv2d_image_windows``); None
        where it cannot be: off, not the model's input, a window row longer than an AMX step reads. Its
        patches were a pass over 5.6 MB for ResNet's 7x7 window (107 us on AMX) and as much again read back."""
        kernel, (batch, height, width, channels) = weight.shape[:2], static_shape(data)
        source = self._transposed_input(data)
        run = window_run(kernel[1], channels, self.unit)
        if not self.image_windows or source is None or run is None:
            return None
        packed = pack_window_rows_weight(weight, run)  # [KH, 1, N/16, run/2, 16, 2]
        out_h = out_extent(height, padding[0], padding[2], kernel[0], stride)
        out_w = out_extent(width, padding[1], padding[3], kernel[1], stride)
        columns = padded_rows(out_w, packed.shape[2], self.unit)
        extent = image_windows_extent((height, width), tuple(kernel), stride, padding, columns, channels, run)
        padded = self.builder_.emit(
            self.builder_.call_te(
                bf16_padded_image,
                source.args[0],
                padding,
                extent,
                primfunc_name_hint="bf16_padded_image",
                primfunc_attrs={"op_pattern": OPAQUE_PATTERN},  # its own kernel: the product reads it in place
            )
        )
        flat = self.builder_.emit(relax.op.reshape(padded, (batch, extent[0] * extent[1] * channels)))
        flops = conv2d_flops(batch, out_h, out_w, weight.shape[3], tuple(kernel), channels)
        image = (out_h, columns, extent[1], channels)
        out = self._packed_product(
            bf16_conv2d_image_windows, flat, packed, image, stride, self.unit, flops, name="bf16_conv2d"
        )
        return self._computed(out, out_w, weight.shape[3])

    def _transposed_input(self, data: Expr) -> Call | None:
        """The transpose to channels-last that ``data`` is, of the model's NCHW input; else None."""
        source = self.lookup_binding(data) if isinstance(data, relax.Var) else None
        if op_name(source) == "relax.permute_dims" and ints(source.attrs.axes) == [0, 2, 3, 1]:
            return source
        return None

    def _patches_conv2d(self, data: Expr, weight: np.ndarray, stride: int, padding: tuple[int, ...]) -> Expr:
        kernel, (batch, height, width, channels) = weight.shape[:2], static_shape(data)
        row_width = patch_width(kernel[1], channels)
        unit = self._unit_for(kernel[0] * row_width)
        window_rows = patch_rows(kernel[0], row_width, _channel_step(unit))
        packed = pack_patch_weight(weight, window_rows)  # [N/16, window_rows*width/2, 16, 2]
        out_h = out_extent(height, padding[0], padding[2], kernel[0], stride)
        out_w = out_extent(width, padding[1], padding[3], kernel[1], stride)
        rows = padded_rows(out_h * out_w, packed.shape[0], unit)
        patches = self._patches(data, tuple(kernel), stride, padding, rows, window_rows)
        flops = conv2d_flops(batch, out_h, out_w, weight.shape[3], tuple(kernel), channels)
        by_position = self.builder_.emit(relax.op.reshape(patches, (batch, rows, packed.shape[1] * PAIR)))
        image = (out_h, out_w)
        return self._packed_product(
            bf16_patches_product, by_position, packed, image, weight.shape[3], unit, flops, name="bf16_dense"
        )

    def _patches(
        self, data: Expr, kernel: tuple[int, int], stride: int, padding: tuple[int, ...], rows: int, window_rows: int
    ) -> Expr:
        """The patches of ``data`` (NHWC): of the model's input (NCHW, transposed by ``channels_last``)
        read through a padded copy in bf16 that replaces the transpose's kernel; of an activation, read
        from it (its cast in its producer's epilogue) with a test for the padding at each value."""
        batch, height, width, channels = static_shape(data)
        source = self._transposed_input(data)
        if source is not None:
            extent = padded_image_extent((height, width), kernel, stride, padding, rows, channels, window_rows)
            padded = self.builder_.emit(
                self.builder_.call_te(
                    bf16_padded_image, source.args[0], padding, extent, primfunc_name_hint="bf16_padded_image"
                )
            )
            padded = self.builder_.emit(relax.op.reshape(padded, (batch, extent[0], extent[1] * channels)))
            out_w = out_extent(width, padding[1], padding[3], kernel[1], stride)
            patches = self.builder_.call_te(
                bf16_padded_patches,
                padded,
                kernel[1],
                stride,
                out_w,
                rows,
                channels,
                window_rows,
                primfunc_name_hint="bf16_patches",
                # a kernel of its own, as the conditional form is (``pads``): merged into the product, whose
                # tiles load whole rows from a buffer, its gather would be a copy inside the GEMM
                primfunc_attrs={"op_pattern": OPAQUE_PATTERN},
            )
            return self.builder_.emit(patches)
        image_rows = self.builder_.emit(relax.op.reshape(self._cast(data), (batch, height, width * channels)))
        patches = self.builder_.call_te(
            bf16_patches,
            image_rows,
            kernel,
            stride,
            padding,
            rows,
            channels,
            window_rows,
            primfunc_name_hint="bf16_patches",
        )
        return self.builder_.emit(patches)


@tvm.transform.module_pass(opt_level=0, name="Bfloat16Products")
class Bfloat16Products:
    """Convolutions and matmuls by constant weights from bf16 operands into fp32 (module docstring);
    ``unit``: the target CPU's bf16 dot product (``tuner.lowering.bf16.precision.bf16_unit``), None where it has none;
    ``image_windows``: a first convolution reads the model's input in place; ``activation_products``:
    attention's products of two activations are bf16 products too; ``precision``: which products compute in
    bf16 where bf16 products are the slower ones (``tuner.lowering.bf16.precision``), the rest left in float32;
    None: all of them."""

    def __init__(
        self,
        unit: str | None,
        image_windows: bool = True,
        activation_products: bool = True,
        precision: ProductPrecision | None = None,
    ) -> None:
        self.unit = unit
        self.image_windows = image_windows
        self.activation_products = activation_products
        self.precision = precision

    def transform_module(self, mod: IRModule, ctx: tvm.transform.PassContext) -> IRModule:
        mutator = _Bfloat16Products(mod, self.unit, self.image_windows, self.activation_products, self.precision)
        return rewrite_functions(mutator, mod)
