"""Explicit paddings: folded into the convolutions they feed, and kept out of reductions' epilogues.

A model written with TensorFlow's "same" padding (Hugging Face's MobileNetV2, EfficientNet) pads a
convolution's input with ``F.pad(x, (0, 1, 0, 1))`` before a strided convolution. Left as it is,
FuseOps makes that pad the epilogue of the convolution that produced ``x``, and the fused kernel
ends in a block that writes a larger tensor (113x113) than the one it reads (112x112) and declares
its reads with the same indices as its writes. MetaSchedule's multi-level tiling takes such a block
for an element-wise consumer and computes it under the convolution's tiles (reverse_compute_at),
which cover only the 112 rows and columns the convolution produces: the padded row and column are
never written, and the compiled model returned garbage there (issue 32). The same holds for any
injective block that reads an intermediate result conditionally over a larger domain: a
concatenation, whose output is wider than each of its inputs.

Two passes:

- ``FoldPadsIntoConvolutions``: ``conv2d(pad(x))`` with a zero pad on the spatial axes becomes
  ``conv2d(x)`` with the pad in its own (asymmetric) padding; nothing is written twice, and the
  convolution's design space handles its padding as usual;
- ``KeepGrowingBlocksOutOfEpilogues``: after AnnotateTIROpPattern, any remaining injective kernel
  whose output is larger than each of its inputs and which selects what it reads by a condition
  (a pad, a concatenation) is marked opaque, so FuseOps leaves it a kernel of its own.
"""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.ir.module import IRModule
from tvm.relax import Call, Expr, PyExprMutator, expr_functor
from tvm.s_tir import Schedule

from common.relax_functions import rewrite_functions
from tuner.spaces.copy_rule import BF16_COPY_RULE

from .graph import conv2d_like, op_name
from .inverted_residual import OPAQUE_PATTERN

_SPATIAL_AXES = {"NCHW": (2, 3), "NHWC": (1, 2)}
_INJECTIVE_PATTERN = 2  # relax's kInjective


def _zero_spatial_pad(call: Call, layout: str) -> list[int] | None:
    """[top, left, bottom, right] of a constant-zero ``pad`` that pads only the spatial axes of
    ``layout``, else None."""
    attrs = call.attrs
    if str(attrs.pad_mode) != "constant" or float(attrs.pad_value) != 0.0:
        return None
    widths = [int(w) for w in attrs.pad_width]
    if len(widths) != 8 or min(widths) < 0:
        return None
    h, w = _SPATIAL_AXES[layout]
    if any(widths[2 * axis] or widths[2 * axis + 1] for axis in range(4) if axis not in (h, w)):
        return None
    return [widths[2 * h], widths[2 * w], widths[2 * h + 1], widths[2 * w + 1]]


@expr_functor.mutator
class _PadFolder(PyExprMutator):
    def visit_call_(self, call: Call) -> Expr:
        call = super().visit_call_(call)
        if op_name(call) != "relax.nn.conv2d" or str(call.attrs.data_layout) not in _SPATIAL_AXES:
            return call
        data = call.args[0]
        bound = self.lookup_binding(data) if isinstance(data, relax.Var) else data
        if op_name(bound) != "relax.nn.pad":
            return call
        extra = _zero_spatial_pad(bound, str(call.attrs.data_layout))
        if extra is None:
            return call
        padding = [int(p) + e for p, e in zip(call.attrs.padding, extra, strict=True)]
        return conv2d_like(call, bound.args[0], call.args[1], padding=padding)


@tvm.transform.module_pass(opt_level=0, name="FoldPadsIntoConvolutions")
class FoldPadsIntoConvolutions:
    """``conv2d(pad(x, zeros on H and W))`` as ``conv2d(x)`` with the pad added to its padding."""

    def transform_module(self, mod: IRModule, ctx: tvm.transform.PassContext) -> IRModule:
        return relax.transform.DeadCodeElimination(["main"])(rewrite_functions(_PadFolder(mod), mod))


def _elements(buffer: tvm.tirx.Buffer) -> int | None:
    total = 1
    for dim in buffer.shape:
        if not isinstance(dim, tvm.tirx.IntImm | int):
            return None
        total *= int(dim)
    return total


def _reads_conditionally(func: tvm.tirx.PrimFunc) -> bool:
    """Whether some block of ``func`` picks its value by a condition (TVM 0.27's Python has no TIR
    visitor: the blocks' own text is read)."""
    sch = Schedule(IRModule({"main": func}))
    blocks = sch.get_child_blocks(sch.get_sblock("root", func_name="main"))
    return any(word in str(sch.get(rv).body) for rv in blocks for word in ("if_then_else", "T.Select"))


def grows_conditionally(func: tvm.tirx.PrimFunc) -> bool:
    """Whether a kernel writes more elements than any one input holds and picks, by a condition,
    where each element comes from: the shape of kernel whose block must not be fused into a
    reduction's tiles."""
    buffers = [param for param in func.params if hasattr(param, "shape")]  # TVM 0.27: the params are the buffers
    if len(buffers) < 2:
        return False
    sizes = [_elements(b) for b in buffers]
    if any(size is None for size in sizes):
        return False
    *inputs, output = sizes
    return output > max(inputs) and _reads_conditionally(func)


@tvm.transform.module_pass(opt_level=0, name="KeepGrowingBlocksOutOfEpilogues")
class KeepGrowingBlocksOutOfEpilogues:
    """Mark pads and concatenations opaque to FuseOps (see the module's docstring)."""

    def transform_module(self, mod: IRModule, ctx: tvm.transform.PassContext) -> IRModule:
        for gv, func in list(mod.functions_items()):
            if not isinstance(func, tvm.tirx.PrimFunc) or not func.attrs or "op_pattern" not in func.attrs:
                continue
            if int(func.attrs["op_pattern"]) == _INJECTIVE_PATTERN and grows_conditionally(func):
                if gv.name_hint.startswith("concatenate"):
                    func = _with_bf16_copy_rule(func)
                mod[gv] = func.with_attr("op_pattern", OPAQUE_PATTERN)
        return mod


def _with_bf16_copy_rule(func: tvm.tirx.PrimFunc) -> tvm.tirx.PrimFunc:
    """A bf16 concatenation with ``tuner.spaces.copy_rule``'s design space named on its block (vectorised copies;
    a pad's or a patch gather's condition varies along the innermost axis, and their own spaces stay)."""
    if str(func.params[-1].dtype) != "bfloat16":
        return func
    sch = Schedule(tvm.IRModule({"main": func}))
    blocks = sch.get_child_blocks(sch.get_sblock("root"))
    if len(blocks) != 1:
        return func
    sch.annotate(blocks[0], "schedule_rule", BF16_COPY_RULE)
    return sch.mod["main"]
