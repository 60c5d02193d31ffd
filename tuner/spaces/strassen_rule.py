"""The design space of a kernel that adds Strassen's products up into a matmul's output
(``tuner.lowering.strassen``), with whatever element-wise work fused after it.

The products are added up as ``[2, rows / 2, 2, columns / 2]`` blocks, whose signs and product indices
depend only on the block; the model reads the result through a reshape to ``[rows, columns]``.
MetaSchedule inlines everything into the last block, which loops over ``[rows, columns]``: each
element then picks its block by division and remainder, and vectors of it straddle two blocks, so the
products are gathered an element at a time (Mistral's gated feed-forward output ran at 8 GB/s). Here the
output's loops are split back into blocks: inside a block a vector of the output reads contiguous
products, and the choice of products is the same for the whole block. (A gate and its other operand
computed as one matmul and split, as Phi-3's, are the two column blocks of a half as wide output.)
"""

from __future__ import annotations

from tvm.s_tir import Schedule
from tvm.s_tir.schedule import SBlockRV

STRASSEN_OUTPUT_RULE = "tuner_strassen_output"
LANE_CHOICES = (16, 32, 64, 8)  # fp32 elements per vector of the output: one to four AVX-512 registers


def _ours(sch: Schedule, block: SBlockRV) -> bool:
    return sch.get(block).annotations.get("schedule_rule") == STRASSEN_OUTPUT_RULE


def schedule_strassen_output(sch: Schedule, output: SBlockRV) -> list[Schedule]:
    """Inline the block that adds the products up; at the kernel's last such block (MetaSchedule applies
    this rule before its generic ones), inline the element-wise blocks too, and loop over the one left by
    Strassen's blocks. A kernel of another shape (its output transposed, a reduction after it) is left to
    MetaSchedule's generic rules."""
    half_rows, half_columns = (int(sch.get(loop).extent) for loop in sch.get_loops(output)[1::2])
    sch.compute_inline(output)
    root = sch.get_sblock("root")
    if any(_ours(sch, block) for block in sch.get_child_blocks(root)):
        return [sch]  # another output to add up: the last one restructures
    *inner, last = sch.get_child_blocks(root)
    for block in reversed(inner):
        try:
            sch.compute_inline(block)
        except Exception:  # noqa: BLE001 - not element-wise (a reduction): the generic rules take the kernel
            return [sch]
    loops = sch.get_loops(last)
    extents = [int(sch.get(loop).extent) for loop in loops]
    wide = [(loop, extent) for loop, extent in zip(loops, extents, strict=True) if extent != 1]
    units = [loop for loop, extent in zip(loops, extents, strict=True) if extent == 1]
    if len(wide) != 2:
        return [sch]
    (rows, row_count), (column, columns) = wide
    # the output's columns are both halves, or one (a gate and its other operand side by side, split)
    if row_count != 2 * half_rows or columns not in (half_columns, 2 * half_columns):
        return [sch]
    block_row, row = sch.split(rows, [2, half_rows])
    outer = [block_row, row]
    if columns == 2 * half_columns:
        block_column, column = sch.split(column, [2, half_columns])
        outer.append(block_column)
    sch.reorder(*units, *outer, column)
    lanes = [n for n in LANE_CHOICES if half_columns % n == 0]
    if lanes:
        chosen = sch.sample_categorical(lanes, [1.0 / len(lanes)] * len(lanes))
        sch.vectorize(sch.split(column, [None, chosen])[1])
    sch.parallel(sch.fuse(*units, *outer))
    # keeps MetaSchedule's generic rules from parallelising and vectorising the loops above again
    sch.annotate(root, "schedule_rule", "None")
    return [sch]
