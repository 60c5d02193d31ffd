"""Softmax kernels (``rewrites.row_softmax``) rebuilt for ``tuner.spaces.softmax_rule``'s design space: a
row per parallel task, its maximum and its sum over ``LANES`` partial results.

MetaSchedule tiles a softmax's loops by perfect factors only: ViT's rows of 197 (a prime) got no
vector loops, and its softmax took 308 us where DeiT's 198 took 77. Here each row's maximum and
sum are taken over its whole vectors first, ``LANES`` running results at a time (independent
chains: one scalar chain waits out each add's latency), then over those and the row's last
values; the rule splits the exponentials and the quotients into whole vectors and the rest. The
results are the same up to the order of the sum's additions.
"""

from __future__ import annotations

import tvm
from tvm import te
from tvm.ir.module import IRModule
from tvm.s_tir import Schedule

from tuner.spaces.softmax_rule import LANES, QUOTIENTS, SOFTMAX_RULE

from .fast_math import row_softmax


def in_lanes(values: te.Tensor, reducer, combine, name: str, axis: str) -> te.Tensor:
    """``rewrites.whole_row``'s reduction over whole vectors into ``LANES`` partial results
    (``NAME_lanes``) and over those (``NAME_of_lanes``), and over the rest (``NAME_rest``)."""
    *outer, length = values.shape
    whole, rest = divmod(int(length), LANES)
    pieces = []
    if whole:
        c, lane = te.reduce_axis((0, whole), "c"), te.reduce_axis((0, LANES), "lane")
        lanes = te.compute(
            (*outer, LANES), lambda *i: reducer(values(*i[:-1], c * LANES + i[-1]), axis=c), name=f"{name}_lanes"
        )
        pieces.append(te.compute(outer, lambda *i: reducer(lanes(*i, lane), axis=lane), name=f"{name}_of_lanes"))
    if rest:
        t = te.reduce_axis((0, rest), axis)
        pieces.append(te.compute(outer, lambda *i: reducer(values(*i, whole * LANES + t), axis=t), name=f"{name}_rest"))
    if len(pieces) == 1:
        return pieces[0]
    return te.compute(outer, lambda *i: combine(pieces[0](*i), pieces[1](*i)), name=name)


def _block_names(func: tvm.tirx.PrimFunc) -> list[str]:
    sch = Schedule(IRModule({"main": func}))
    return [sch.get(block).name_hint for block in sch.get_child_blocks(sch.get_sblock("root"))]


def by_rows(func: tvm.tirx.PrimFunc) -> tvm.tirx.PrimFunc:
    """A row softmax's kernel rebuilt with its reductions ``in_lanes``, every block naming the rule; any other
    function unchanged."""
    names = _block_names(func)
    quotients = [name for name in QUOTIENTS if name in names]
    buffers = [param for param in func.params if hasattr(param, "shape")]
    if len(quotients) != 1 or not {"row_max", "exp", "row_sum"} <= set(names) or len(buffers) != 2:
        return func
    if len(buffers[0].shape) < 2:
        return func
    x = te.placeholder(buffers[0].shape, str(buffers[0].dtype), name="x")  # its index type (int64) kept for fusion
    fast, safe = "T_fast_exp" in names, quotients[0] == "safe_softmax"
    rebuilt = te.create_prim_func([x, row_softmax(x, fast, safe, reduction=in_lanes)])
    sch = Schedule(IRModule({"main": rebuilt}))
    for block in sch.get_child_blocks(sch.get_sblock("root")):
        sch.annotate(block, "schedule_rule", SOFTMAX_RULE)
    rebuilt = sch.mod["main"].without_attr("global_symbol")  # the module names it, as it named the original
    return rebuilt.with_attrs(func.attrs) if func.attrs else rebuilt


@tvm.transform.module_pass(opt_level=0, name="SoftmaxByRows")
class SoftmaxByRows:
    """Every row softmax's kernel rebuilt for ``tuner.spaces.softmax_rule`` (module docstring)."""

    def transform_module(self, mod: IRModule, ctx: tvm.transform.PassContext) -> IRModule:
        for gv, func in list(mod.functions_items()):
            if isinstance(func, tvm.tirx.PrimFunc):
                mod[gv] = by_rows(func)
        return mod
