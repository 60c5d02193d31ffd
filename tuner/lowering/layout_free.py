"""Which kernel arguments MetaSchedule may store in a layout of its choosing."""

from __future__ import annotations

import tvm
from tvm.ir.module import IRModule
from tvm.s_tir import SBlockRealize, Schedule

from tuner.spaces.metaschedule import LAYOUT_FREE_ATTR as _ATTR


def _reduction_reads(func: tvm.tirx.PrimFunc) -> set[int]:
    """Indices of the arguments some reduction block (a matmul's, a convolution's) reads."""
    sch = Schedule(IRModule({"main": func}))
    # the root block is "root" but in kernels written in TVMScript with a block of their own on top
    # (topi's index_put: "index_put_generic")
    root = func.body.block.name_hint if isinstance(func.body, SBlockRealize) else "root"
    indices = set()
    for rv in sch.get_child_blocks(sch.get_sblock(root, func_name="main")):
        block = sch.get(rv)
        if not any(int(iv.iter_type) == tvm.tirx.IterVar.CommReduce for iv in block.iter_vars):
            continue
        for region in block.reads:
            indices.update(i for i, param in enumerate(func.params) if region.source.same_as(param))
    return indices


@tvm.transform.module_pass(opt_level=0, name="KeepLayoutFreeWeightsOfReductions")
class KeepLayoutFreeWeightsOfReductions:
    """After AttachAttrLayoutFreeBuffers (which marks every constant argument): keep only the
    weights a reduction reads. Those are the ones whose layout a schedule's tiling wants changed;
    on others MetaSchedule's RewriteLayout has nothing to gain, and on a group norm's scale and
    shift it fails (TVM 0.27 raises instead of rejecting the schedule)."""

    def transform_module(self, mod: IRModule, ctx: tvm.transform.PassContext) -> IRModule:
        for gv, func in list(mod.functions_items()):
            if not isinstance(func, tvm.tirx.PrimFunc) or not func.attrs or _ATTR not in func.attrs:
                continue
            kept = [int(i) for i in func.attrs[_ATTR] if int(i) in _reduction_reads(func)]
            if len(kept) != len(func.attrs[_ATTR]):
                mod[gv] = func.with_attr(_ATTR, kept)
        return mod
