"""Fast math: float32 activations and softmaxes computed by vectorisable approximations (TOPI's polynomial
exp, erf and tanh) instead of one libm call per element, each as a kernel of its own name."""

from __future__ import annotations

import tvm
from tvm import relax, te, topi
from tvm.relax import Expr


def _fast_sigmoid(x: te.Tensor) -> te.Tensor:
    exp = topi.fast_exp(topi.negative(x))
    return te.compute(
        x.shape, lambda *i: tvm.tirx.const(1.0, x.dtype) / (tvm.tirx.const(1.0, x.dtype) + exp(*i)), name="fast_sigmoid"
    )


def _fast_silu(x: te.Tensor) -> te.Tensor:
    return topi.multiply(x, _fast_sigmoid(x))


def _fast_gelu(x: te.Tensor) -> te.Tensor:
    """0.5 x (1 + erf(x / sqrt 2)), torch's exact GELU, with TOPI's polynomial erf."""
    erf = topi.fast_erf(topi.multiply(x, tvm.tirx.const(0.7071067811865476, x.dtype)))
    return te.compute(
        x.shape,
        lambda *i: x(*i) * tvm.tirx.const(0.5, x.dtype) * (tvm.tirx.const(1.0, x.dtype) + erf(*i)),
        name="fast_gelu",
    )


def _fast_gelu_tanh(x: te.Tensor) -> te.Tensor:
    """0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), torch's GELU(approximate="tanh"), with TOPI's
    rational tanh: TVM's own tanh calls libm's expf per element (Gemma's FFN output kernel, this
    GELU merged into it, ran at 3 GFLOP/s, 2.4 of the model's 9.8 ms)."""

    def const(value: float) -> tvm.tirx.PrimExpr:
        return tvm.tirx.const(value, x.dtype)

    inner = te.compute(
        x.shape, lambda *i: const(0.7978845608028654) * x(*i) * (const(1.0) + const(0.044715) * x(*i) * x(*i))
    )
    tanh = topi.fast_tanh(inner)
    return te.compute(x.shape, lambda *i: x(*i) * const(0.5) * (const(1.0) + tanh(*i)), name="fast_gelu_tanh")


def whole_row(values: te.Tensor, reducer, combine, name: str, axis: str) -> te.Tensor:
    """``reducer`` over the last axis of ``values``, in one reduction (``combine``: its binary form)."""
    *outer, length = values.shape
    over = te.reduce_axis((0, length), name=axis)
    return te.compute(outer, lambda *i: reducer(values(*i, over), axis=over), name=name)


def row_softmax(x: te.Tensor, fast: bool, safe: bool, reduction=whole_row) -> te.Tensor:
    """Softmax over the last axis as one kernel: the row's maximum, its exponentials, their sum,
    the quotient (each exponential times the sum's reciprocal: one division a row). The exponentials are
    stored once (MetaSchedule may not inline them into both their readers, which computed each exp twice).
    ``safe``: a row of -inf gives 0, as PyTorch's ``_safe_softmax`` does (scaled_dot_product_attention uses
    it); such a row is the one whose maximum never rose above where a maximum starts (the lowest finite
    value, TVM's identity of max), so the softmax's own maximum decides (tested against -inf, it never
    held: such rows gave NaN). ``reduction``: how the maximum and the sum reduce a row (``whole_row``'s
    signature)."""
    row_max = reduction(x, te.max, tvm.tirx.max, "row_max", "k")
    shifted = te.compute(x.shape, lambda *i: x(*i) - row_max(*i[:-1]), name="shifted")
    exp = topi.fast_exp(shifted) if fast else topi.exp(shifted)
    stored = te.compute(x.shape, lambda *i: exp(*i), name="exp", attrs={"meta_schedule.inline_rule": "disable"})
    total = reduction(stored, te.sum, lambda a, b: a + b, "row_sum", "j")
    one = tvm.tirx.const(1.0, x.dtype)
    reciprocal = te.compute(total.shape, lambda *i: one / total(*i), name="row_reciprocal")
    if not safe:
        return te.compute(x.shape, lambda *i: stored(*i) * reciprocal(*i[:-1]), name="softmax")
    zero, lowest = tvm.tirx.const(0.0, x.dtype), te.min_value(x.dtype)
    return te.compute(
        x.shape,
        lambda *i: tvm.tirx.Select(row_max(*i[:-1]) <= lowest, zero, stored(*i) * reciprocal(*i[:-1])),
        name="safe_softmax",
    )


# float32 activations whose legalized forms call libm once per element (LLVM does not vectorise
# those calls), with vectorisable replacements
FAST_FORMS = {
    "relax.sigmoid": _fast_sigmoid,
    "relax.nn.silu": _fast_silu,
    "relax.nn.gelu": _fast_gelu,
    "relax.tanh": topi.fast_tanh,
    "relax.nn.gelu_tanh": _fast_gelu_tanh,
}


def _kernel_name(form) -> str:
    return form.__name__.lstrip("_")


FAST_FORMS_BY_NAME = {_kernel_name(form): form for form in FAST_FORMS.values()}


def fast_form_call(builder: relax.BlockBuilder, form, x: Expr) -> Expr:
    """``form`` (a value of ``FAST_FORMS``) of ``x``, as a kernel named after it."""
    return builder.call_te(form, x, primfunc_name_hint=_kernel_name(form))


def fast_form_named(kernel: str):
    """The fast form a kernel computes, by its name (``fast_gelu1``: ``_fast_gelu``), or None: a pass
    after the fast forms were given sees the kernel, not the operator."""
    return FAST_FORMS_BY_NAME.get(kernel.rstrip("0123456789"))


def fast_form_applied(call: Expr):
    """(the fast form, its input) where ``call`` calls a kernel ``fast_form_call`` made; else None."""
    if not isinstance(call, relax.Call) or call.op != tvm.ir.Op.get("relax.call_tir"):
        return None
    callee, args = call.args[0], call.args[1]
    form = fast_form_named(callee.name_hint) if isinstance(callee, relax.GlobalVar) else None
    if form is None or not isinstance(args, relax.Tuple) or len(args.fields) != 1:
        return None
    return form, args.fields[0]
