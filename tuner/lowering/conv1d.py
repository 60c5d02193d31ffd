"""1-D convolutions (NCW) as channels-last 2-D ones over an image one row high (NHWC, H = 1), with
the layout changes between them cancelled out by ``channels_last``.

MetaSchedule's NCW convolutions vectorise along the positions, which a stride of 2 reads every other
element of: wav2vec 2.0's feature encoder (512 channels, kernel 3, stride 2, over thousands of
positions) ran at 99-175 GFLOP/s, 35.6 of the model's 49.7 ms. As NHWC 2-D convolutions they vectorise
along the channels. Grouped convolutions (a positional embedding's) are left as they are.

Their output positions are the rows of the product's register tile, which MetaSchedule tiles only by their
divisors: the encoder's 799 positions (17 x 47) and 199 (a prime) tile one row at a time, and those two
convolutions ran at 49% and 66% of the FMA peak where their neighbours of 1599 and 399 positions ran at 80-84%
(Zen 5). With ``pad_positions`` (float32) such a count is padded as ``row_padding`` pads a product's rows: a
few more zeros on the right of the input, the extra positions sliced off the output (in the kernel that reads
it).
"""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.ir.module import IRModule
from tvm.relax import Call, Expr, PyExprMutator, expr_functor

from common.relax_functions import rewrite_functions

from .graph import ints, static_shape
from .row_padding import padded_row_count

NWC = [0, 2, 1]  # NCW <-> NWC


@expr_functor.mutator
class _Conv1dAsConv2d(PyExprMutator):
    def __init__(self, mod: IRModule, pad_positions: bool):
        super().__init__(mod)
        self.pad_positions = pad_positions

    def visit_call_(self, call: Call) -> Expr:
        call = super().visit_call_(call)
        if not isinstance(call, Call) or call.op != tvm.ir.Op.get("relax.nn.conv1d"):
            return call
        attrs = call.attrs
        layouts = (attrs.data_layout, attrs.kernel_layout, attrs.out_layout)
        data, weight = call.args
        shapes = static_shape(data), static_shape(weight), static_shape(call)
        if layouts != ("NCW", "OIW", "NCW") or int(attrs.groups) != 1 or any(s is None for s in shapes):
            return call
        (batch, channels, width), (outputs, _, kernel), (_, _, out_width) = shapes
        left, right = ints(attrs.padding)
        computed = padded_row_count(out_width) if self.pad_positions else out_width
        right += (computed - out_width) * ints(attrs.strides)[0]  # each position more reads a stride further
        # NCW -> NWC -> [N, 1, W, C]; OIW -> WIO -> [1, K, I, O] (a constant weight is folded)
        image = self.builder_.emit(relax.op.reshape(relax.op.permute_dims(data, NWC), (batch, 1, width, channels)))
        hwio = relax.op.reshape(relax.op.permute_dims(weight, [2, 1, 0]), (1, kernel, channels, outputs))
        out = relax.op.nn.conv2d(
            image,
            self.builder_.emit(hwio),
            strides=[1, *ints(attrs.strides)],
            padding=[0, left, 0, right],
            dilation=[1, *ints(attrs.dilation)],
            data_layout="NHWC",
            kernel_layout="HWIO",
            out_layout="NHWC",
            out_dtype=attrs.out_dtype,
        )
        out = self.builder_.emit(out)
        if computed != out_width:
            out = self.builder_.emit(relax.op.strided_slice(out, axes=[2], begin=[0], end=[out_width]))
        sequence = self.builder_.emit(relax.op.reshape(out, (batch, out_width, outputs)))
        return relax.op.permute_dims(sequence, NWC)  # back to NCW: channels_last moves it on past element-wise ops


@tvm.transform.module_pass(opt_level=0, name="Conv1dAsConv2d")
class Conv1dAsConv2d:
    """Ungrouped NCW 1-D convolutions as NHWC 2-D ones over an image one row high; with ``pad_positions``, over
    a few output positions more where their count tiles badly."""

    def __init__(self, pad_positions: bool = False):
        self.pad_positions = pad_positions

    def transform_module(self, mod: IRModule, ctx: tvm.transform.PassContext) -> IRModule:
        return rewrite_functions(_Conv1dAsConv2d(mod, self.pad_positions), mod)
