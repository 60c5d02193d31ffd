"""Graph rewrites on imported Relax models, before legalization: forms the importers produce that
legalize into slow or unfusable kernels, replaced by equivalent ones that tune well."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.ir.module import IRModule
from tvm.relax import Call, Expr, PyExprMutator, expr_functor

from .fast_math import FAST_FORMS, fast_form_call, row_softmax
from .graph import is_float32, op_name, static_shape


def _whole_input_pool_as_mean(call: Call) -> Expr:
    """An unpadded average pool whose one window covers the whole input, as the mean over its
    spatial axes. transformers' EfficientNet pools its 7x7 maps with ``AvgPool2d(1280,
    ceil_mode=True)``, whose divisor is the window clipped to the input (49): TVM's pool then walks
    the nominal 1280x1280 window's bounds (0.25 ms of a 7.2 ms model, torch.compile's 280 ms), a
    mean reads the input once."""
    attrs, before, after = call.attrs, static_shape(call.args[0]), static_shape(call)
    layout = str(attrs.layout)
    if before is None or after is None or layout not in ("NCHW", "NHWC") or str(attrs.out_layout) != layout:
        return call
    axes = [layout.index("H"), layout.index("W")]
    whole = all(int(k) >= before[a] and after[a] == 1 for k, a in zip(attrs.pool_size, axes, strict=True))
    if not whole or any(int(p) for p in attrs.padding) or any(int(d) != 1 for d in attrs.dilation):
        return call
    return relax.op.mean(call.args[0], axis=axes, keepdims=True)


def _top_one_as_max(call: Call, builder: relax.BlockBuilder) -> Expr:
    """A top-1 along an axis (torch's ``max(dim)``, which the importer takes as ``topk`` with k=1) as a max and
    an argmax: TVM's topk sorts the axis in a kernel of one thread (HF Hiera's query pooling, the largest of 4
    values for each of a [784, 192] map: 6.6 ms, six such kernels 23 of the model's 85 ms). An argmax nothing
    reads is dropped with its binding."""
    attrs = call.attrs
    if int(attrs.k) != 1:
        return call
    data, axis, ret_type = call.args[0], int(attrs.axis), str(attrs.ret_type)
    largest = bool(attrs.largest)
    values = (relax.op.max if largest else relax.op.min)(data, axis=[axis], keepdims=True)
    if ret_type == "values":
        return values
    index = (relax.op.argmax if largest else relax.op.argmin)(data, axis=axis, keepdims=True)
    indices = relax.op.astype(builder.emit(index), str(attrs.dtype))
    if ret_type == "indices":
        return indices
    return relax.Tuple([builder.emit(values), builder.emit(indices)])


_UNARY_ELEMENTWISE = {
    *FAST_FORMS,
    *(
        f"relax.{op}"
        for op in (
            "exp",
            "erf",
            "tanh",
            "negative",
            "sqrt",
            "rsqrt",
            "abs",
            "clip",
            "nn.relu",
            "nn.gelu_tanh",
            "nn.relu6",
        )
    ),
}
_BINARY_ELEMENTWISE = {f"relax.{op}" for op in ("add", "subtract", "multiply", "divide")}
_RESHAPES = ("relax.reshape", "relax.expand_dims", "relax.squeeze")


def _shape_of(reshape: Call) -> Expr:
    """The shape a reshape, squeeze or expand_dims gives its data."""
    return reshape.args[1] if op_name(reshape) == "relax.reshape" else relax.ShapeExpr(static_shape(reshape))


def _same_data(before: tuple[int, ...] | None, after: tuple[int, ...] | None) -> bool:
    """Whether two shapes differ only in dimensions of size 1."""
    return before is not None and after is not None and [d for d in before if d != 1] == [d for d in after if d != 1]


@expr_functor.mutator
class _Rewriter(PyExprMutator):
    def __init__(self, mod: IRModule, fast_math: bool):
        super().__init__(mod)
        self.fast_math = fast_math

    def _bound_call(self, expr: Expr, wanted: str) -> Call | None:
        """The call ``expr`` is bound to, if it is a call of the operator ``wanted``."""
        value = self.lookup_binding(expr) if isinstance(expr, relax.Var) else expr
        return value if op_name(value) == wanted else None

    def visit_call_(self, call: Call) -> Expr:
        call = super().visit_call_(call)
        if not isinstance(call, Call) or not isinstance(call.op, tvm.ir.Op):
            return call
        name = call.op.name
        if name == "relax.matmul":
            return self._matmul_without_broadcasts(call)
        if name == "relax.take":
            return self._take_as_slice(call)
        if name == "relax.power":
            return self._power_as_products(call)
        if name == "relax.broadcast_to":
            return self._broadcast(call)
        if name == "relax.where":
            return self._safe_softmax(call)
        if name == "relax.nn.avg_pool2d":
            return _whole_input_pool_as_mean(call)
        if name == "relax.topk":
            return _top_one_as_max(call, self.builder_)
        if name == "relax.reshape":
            return _first(self._reshape(call.args[0], static_shape(call)), call)
        if name in _UNARY_ELEMENTWISE or name in _BINARY_ELEMENTWISE:
            return self._elementwise(call)
        return call

    def _elementwise(self, call: Call) -> Expr:
        """An element-wise op moved above a reshape of its input (a reshape between a matmul and its
        activation or residual add keeps FuseOps from making those the matmul's epilogue), and given
        its fast form."""
        sunk = self._without_reshape(call)
        if sunk is None:
            return self._fast_form(call)
        inner, shape = sunk
        result = self.builder_.emit(self._fast_form(self.builder_.normalize(inner)))
        return _first(self._reshape(result, static_shape(call)), relax.op.reshape(result, shape))

    def _fast_form(self, call: Call) -> Expr:
        form = FAST_FORMS.get(call.op.name)
        if form is None or not self.fast_math or not is_float32(call):
            return call
        return fast_form_call(self.builder_, form, call.args[0])

    def _without_reshape(self, call: Call) -> tuple[Call, Expr] | None:
        """(the op applied before the reshape of an operand, the reshape's shape), where equivalent.

        A unary op commutes with a reshape. A binary op does when the other operand has the
        reshaped shape itself (it is reshaped back instead: a view), or is a constant that varies
        along the last dimension only and the reshape keeps that dimension."""
        if call.op.name in _UNARY_ELEMENTWISE:
            reshape = self._bound_reshape(call.args[0])
            if reshape is None:
                return None
            return relax.Call(call.op, [reshape.args[0], *call.args[1:]], call.attrs, call.ty_args), _shape_of(reshape)
        for index in (0, 1):
            reshape = self._bound_reshape(call.args[index])
            if reshape is None:
                continue
            other = self._operand_before(reshape, call.args[1 - index])
            if other is not None:
                args = [reshape.args[0], other] if index == 0 else [other, reshape.args[0]]
                return relax.Call(call.op, args, call.attrs, call.ty_args), _shape_of(reshape)
        return None

    def _bound_reshape(self, expr: Expr) -> Call | None:
        """The reshape ``expr`` is bound to, or the squeeze or expand_dims ``_reshape`` made of one between
        sequences (a batch dimension given and taken away around a transformer's activation). Not of an
        image: EfficientNet's squeeze-and-excitation blocks, their sigmoid moved above a squeeze, lost their
        second convolution's epilogue (14 convolutions more a kernel of their own)."""
        value = self.lookup_binding(expr) if isinstance(expr, relax.Var) else expr
        name = op_name(value)
        if name == "relax.reshape":
            return value
        if name not in _RESHAPES:
            return None
        shapes = (static_shape(value), static_shape(value.args[0]))  # known, or ``_shape_of`` has none to give
        return value if None not in shapes and max(map(len, shapes)) <= 3 else None

    def _operand_before(self, reshape: Call, other: Expr) -> Expr | None:
        """``other`` as it combines with the reshape's input, or None if it cannot."""
        before, after, shape = static_shape(reshape.args[0]), static_shape(reshape), static_shape(other)
        if None in (before, after, shape) or not before or not after:
            return None
        if shape == after:
            return _first(self._reshape(other, before), relax.op.reshape(other, before))
        if not isinstance(other, tvm.ir.expr.Constant) or before[-1] != after[-1] or len(shape) > len(after):
            return None
        if any(d != 1 for d in shape[:-1]) or (shape and shape[-1] not in (1, after[-1])):
            return None
        return relax.op.reshape(other, [shape[-1]]) if shape else other

    def _reshape(self, data: Expr, after: tuple[int, ...] | None) -> Expr | None:
        """A reshape that only drops or inserts size-1 dimensions, as squeeze and expand_dims (None
        for any other). TE's reshape reads through the flat offset (``(j // 768 + i) % 128``), which
        MetaSchedule cannot prove injective: it is never inlined, and a matmul whose epilogue reads
        it cannot take that epilogue (its design space fails to generate)."""
        before = static_shape(data)
        if not _same_data(before, after):
            return None
        earlier = self._bound_reshape(data)  # size-1 dimensions inserted, then dropped: from its input
        if earlier is not None and _same_data(static_shape(earlier.args[0]), after):
            data, before = earlier.args[0], static_shape(earlier.args[0])
        if before == after:
            return data
        squeezed = [i for i, d in enumerate(before) if d == 1]
        if squeezed:
            data = self.builder_.emit(relax.op.squeeze(data, squeezed))
        inserted = [i for i, d in enumerate(after) if d == 1]
        return relax.op.expand_dims(data, inserted) if inserted else data

    def _matmul_without_broadcasts(self, call: Call) -> Expr:
        """matmul broadcasts batch dimensions itself: a ``broadcast_to`` of an operand that only adds
        batch dimensions materialises copies (torch's MultiheadAttention imports its input projection
        as a batched GEMV against 256 copies of the weight, a 12 MB constant once folded)."""
        out_shape = static_shape(call)
        if out_shape is None:
            return call
        args = list(call.args)
        for index, arg in enumerate(args):
            broadcast = self._bound_call(arg, "relax.broadcast_to")
            if broadcast is None:
                continue
            source, target_shape = static_shape(broadcast.args[0]), static_shape(arg)
            if source is None or target_shape is None or len(source) < 2 or source[-2:] != target_shape[-2:]:
                continue
            candidate = [*args[:index], broadcast.args[0], *args[index + 1 :]]
            rewritten = relax.op.matmul(candidate[0], candidate[1], out_dtype=call.attrs.out_dtype)
            if static_shape(self.builder_.normalize(rewritten)) == out_shape:
                args = candidate
        if all(a.same_as(b) for a, b in zip(args, call.args, strict=True)):
            return call
        return relax.op.matmul(args[0], args[1], out_dtype=call.attrs.out_dtype)

    def _take_as_slice(self, call: Call) -> Expr:
        """``take`` with one constant index is a slice; as a gather it is opaque to fusion."""
        indices = call.args[1]
        shape = static_shape(call.args[0])
        if (
            not isinstance(indices, tvm.ir.expr.Constant)
            or tuple(indices.value.shape) != ()
            or shape is None
            or call.attrs.axis is None
        ):
            return call
        axis = int(call.attrs.axis) % len(shape)
        index = int(indices.value.numpy()) % shape[axis]
        sliced = relax.op.strided_slice(call.args[0], axes=[axis], begin=[index], end=[index + 1])
        return relax.op.squeeze(sliced, axis=[axis])

    def _safe_softmax(self, call: Call) -> Expr:
        """``where(all(x == -inf, axis=-1), 0, softmax(x))`` (how torch.export writes the softmax of
        scaled_dot_product_attention): three kernels and two passes over the scores, as one."""
        condition, zeros, softmax = call.args
        softmax = self._bound_call(softmax, "relax.nn.softmax")
        if (
            softmax is None
            or int(softmax.attrs.axis) not in (-1, len(static_shape(softmax) or ()) - 1)
            or not self._is_zeros(zeros)
        ):
            return call
        scores = softmax.args[0]
        if not self._all_minus_inf(condition, scores):
            return call
        fast = self.fast_math and is_float32(softmax)
        return self.builder_.call_te(row_softmax, scores, fast, True, primfunc_name_hint="safe_softmax")

    def _is_zeros(self, expr: Expr) -> bool:
        if isinstance(expr, tvm.ir.expr.Constant):  # a full_like that FoldConstant materialised
            return not np.any(expr.value.numpy())
        if self._bound_call(expr, "relax.zeros_like") is not None:
            return True
        full = self._bound_call(expr, "relax.full_like")
        if full is None:
            return False
        fill = full.args[1]
        return isinstance(fill, tvm.ir.expr.Constant) and float(fill.value.numpy()) == 0.0

    def _all_minus_inf(self, condition: Expr, scores: Expr) -> bool:
        """Whether ``condition`` is not(any(not(scores == -inf))) along the last axis, keeping dims."""
        chain = ["relax.logical_not", "relax.max", "relax.logical_not", "relax.equal"]
        expr = condition
        for wanted in chain:
            expr = self._skip_casts(expr)
            call = self._bound_call(expr, wanted)
            if call is None:
                return False
            if wanted == "relax.max" and (
                not call.attrs.keepdims
                or [int(a) for a in call.attrs.axis] not in ([-1], [len(static_shape(scores) or ()) - 1])
            ):
                return False
            if wanted == "relax.equal":
                bound = call.args[1]
                return (
                    call.args[0].same_as(scores)
                    and isinstance(bound, tvm.ir.expr.Constant)
                    and float(bound.value.numpy()) == float("-inf")
                )
            expr = call.args[0]
        return False

    def _skip_casts(self, expr: Expr) -> Expr:
        while (cast := self._bound_call(expr, "relax.astype")) is not None:
            expr = cast.args[0]
        return expr

    def _power_as_products(self, call: Call) -> Expr:
        """``x ** n`` for a whole ``n`` from 2 to 4 as multiplies, instead of one libm pow call per
        element: GPT-2's tanh GELU cubes every activation of its feed-forward layers, and the pow
        calls made that kernel 17 times slower than the same kernel without them."""
        exponent = call.args[1]
        if not isinstance(exponent, tvm.ir.expr.Constant) or tuple(exponent.value.shape) != ():
            return call
        power = float(exponent.value.numpy())
        if power not in (2.0, 3.0, 4.0):
            return call
        base = call.args[0]
        if power == 4.0:
            square = self.builder_.emit(relax.op.multiply(base, base))
            return relax.op.multiply(square, square)
        product = base
        for _ in range(int(power) - 2):
            product = self.builder_.emit(relax.op.multiply(product, base))
        return relax.op.multiply(product, base)

    def _broadcast(self, call: Call) -> Expr:
        """A broadcast to the shape its input already has (the importers emit them around batched
        matmuls) is that input."""
        shape = static_shape(call.args[0])
        return call.args[0] if shape is not None and shape == static_shape(call) else call


def _first(preferred: Expr | None, fallback: Expr) -> Expr:
    return preferred if preferred is not None else fallback


@expr_functor.mutator
class _SoftmaxRewriter(PyExprMutator):
    """Every softmax over the last axis left (the safe ones are already rewritten) as ``row_softmax``."""

    def __init__(self, mod: IRModule, fast_math: bool):
        super().__init__(mod)
        self.fast_math = fast_math

    def visit_call_(self, call: Call) -> Expr:
        call = super().visit_call_(call)
        if op_name(call) != "relax.nn.softmax":
            return call
        shape = static_shape(call)
        if shape is None or int(call.attrs.axis) not in (-1, len(shape) - 1):
            return call
        return self.builder_.call_te(
            row_softmax, call.args[0], self.fast_math and is_float32(call), False, primfunc_name_hint="softmax"
        )


@tvm.transform.module_pass(opt_level=0, name="SimplifyImportedGraph")
class SimplifyImportedGraph:
    """Rewrites ``matmul(broadcast_to(x), broadcast_to(w))`` to ``matmul(x, w)``, ``take`` at a
    constant index to a slice, element-wise ops on a reshape to the reshape of the op, and softmax
    (PyTorch's safe one too) to one kernel that computes each exponential once; with
    ``fast_math``, float32 exponentials, sigmoid, SiLU and GELU get vectorisable forms."""

    def __init__(self, fast_math: bool = True):
        self.fast_math = fast_math

    def transform_module(self, mod: IRModule, ctx: tvm.transform.PassContext) -> IRModule:
        for mutator in (_Rewriter, _SoftmaxRewriter):
            rewriter = mutator(mod, self.fast_math)
            for gv, func in mod.functions_items():
                if isinstance(func, relax.Function):
                    rewriter.builder_.update_func(gv, rewriter.visit_expr(func))
            mod = rewriter.builder_.get()
        return mod
