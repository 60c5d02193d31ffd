"""Softmax kernels (``rewrites.row_softmax``) rebuilt for ``tuner.spaces.softmax_rule``'s design space: a
row per parallel task, its maximum and its sum over ``LANES`` partial results.

MetaSchedule tiles a softmax's loops by perfect factors only: ViT's rows of 197 (a prime) got no
vector loops, and its softmax took 308 us where DeiT's 198 took 77. Here each row's maximum and
sum are taken over its whole vectors first, up to ``MAX_CHAINS`` vectors of running results at a time
(independent chains: one chain waits out each add's latency, 4 cycles, where two adds a cycle could
issue), then over those pairwise (half of them a step: 16 lanes in 4 steps, not 16), then the row's last
values; the rule splits the exponentials and the quotients into whole vectors and the rest. The
results are the same up to the order of the sum's additions. On a 2-core Emerald Rapids, alone, the
attention block's softmax (1024 rows of 256) ran in 0.77-0.85 of its time with one vector of running
results combined lane by lane and a division per quotient, BERT-base's (128) in 0.67, Swin-T's (49, masks
fused) in 0.59-0.66.
"""

from __future__ import annotations

import tvm
from tvm import te
from tvm.ir.module import IRModule
from tvm.s_tir import Schedule

from tuner.spaces.softmax_rule import LANES, QUOTIENTS, SOFTMAX_RULE, running_chains

from .fast_math import row_softmax


def in_lanes(values: te.Tensor, reducer, combine, name: str, axis: str) -> te.Tensor:
    """``rewrites.whole_row``'s reduction over whole vectors into up to ``MAX_CHAINS`` vectors of partial results
    (``NAME_lanes``), over those pairwise (``_halving``), and over the rest (``NAME_rest``)."""
    *outer, length = values.shape
    width = LANES * running_chains(int(length), LANES)
    whole, rest = divmod(int(length), width)
    pieces = []
    if whole:
        c = te.reduce_axis((0, whole), "c")
        lanes = te.compute(
            (*outer, width), lambda *i: reducer(values(*i[:-1], c * width + i[-1]), axis=c), name=f"{name}_lanes"
        )
        pieces.append(_halving(lanes, combine, name))
    if rest:
        t = te.reduce_axis((0, rest), axis)
        pieces.append(te.compute(outer, lambda *i: reducer(values(*i, whole * width + t), axis=t), name=f"{name}_rest"))
    if len(pieces) == 1:
        return pieces[0]
    return te.compute(outer, lambda *i: combine(pieces[0](*i), pieces[1](*i)), name=name)


def _halving(lanes: te.Tensor, combine, name: str) -> te.Tensor:
    """Each row's partial results combined pairwise, halving their number each step (``NAME_half32``, ...,
    ``NAME_half2``; the last ``NAME_of_lanes``): a chain of log2 of their number, where one running result
    waited out a combination's latency per lane."""
    *outer, width = lanes.shape
    half, width = lanes, int(width)
    while width > 2:
        half, width = _halved(half, combine, f"{name}_half{width // 2}"), width // 2
    return te.compute(outer, lambda *i: combine(half(*i, 0), half(*i, 1)), name=f"{name}_of_lanes")


def _halved(values: te.Tensor, combine, name: str) -> te.Tensor:
    *outer, width = values.shape
    half = int(width) // 2
    return te.compute(
        (*outer, half), lambda *i: combine(values(*i[:-1], i[-1]), values(*i[:-1], i[-1] + half)), name=name
    )


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
