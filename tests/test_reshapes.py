"""Reshapes legalized with bounded indices (tuner.lowering.reshapes), and where the analytic draw
(tuner.spaces.analytic) computes them: a block read through a remainder at the root, a reshape that moves
nothing inlined into the product that reads it. Real TE, TVM builds and PyTorch."""

import numpy as np
import pytest
import tvm
from analytic_rules import unscheduled_and_scheduled_outputs
from lowered_models import error_against_torch
from tvm import te, tirx

from tuner.lowering import LoweringOptions
from tuner.lowering.reshapes import bounded_reshape
from tuner.spaces.analytic import INLINED, ROOT, configure_kernel
from tuner.spaces.block_reads import is_view
from tuner.targets import resolve_target
from tuner.tasks.extraction import extract_tasks, lower_workload
from workloads import load_workload

torch = pytest.importorskip("torch")


def _reshaped(before: tuple[int, ...], after: tuple[int, ...]) -> tvm.IRModule:
    data = te.placeholder(before, name="x")
    out = bounded_reshape(data, [tirx.IntImm("int64", d) for d in after])
    return tvm.IRModule({"main": te.create_prim_func([data, out]).with_attr("global_symbol", "main")})


@pytest.mark.parametrize(
    ("before", "after", "divides"),
    [
        ((1, 3136, 576), (1, 64, 49, 3, 2, 96), False),  # Hiera's tokens into windows of heads
        ((1, 196, 768), (1, 14, 14, 768), False),
        ((6, 10), (4, 15), True),  # neither split nor merge: the division stays
    ],
)
def test_a_reshape_reads_its_input_at_affine_indices_where_the_output_bounds_allow(before, after, divides):
    mod = _reshaped(before, after)
    reads = [line for line in mod.script().splitlines() if "T.reads" in line]
    assert any("//" in line or "%" in line for line in reads) == divides, reads
    x = np.random.default_rng(0).standard_normal(before).astype("float32")
    out = tvm.runtime.tensor(np.zeros(after, "float32"))
    tvm.compile(mod, target="llvm")["main"](tvm.runtime.tensor(x), out)
    np.testing.assert_array_equal(out.numpy(), x.reshape(after))


class _QueryPooling(torch.nn.Module):
    """Hiera's query pooling in small: tokens regrouped into windows of heads, a max over the windows."""

    def forward(self, x):  # [1, 64, 3 * 2 * 16]
        q = x.view(1, 64, 3, 2, 16).permute(2, 0, 3, 1, 4)[0]  # [1, 2, 64, 16]
        return q.view(1, 2, 4, 16, 16).max(dim=2).values


def _kernel_scripts(lowered) -> str:
    return "".join(f.script() for _, f in lowered.functions_items() if isinstance(f, tvm.tirx.PrimFunc))


def test_a_model_of_reshapes_lowers_without_remainders_and_matches_pytorch():
    target = resolve_target("llvm")
    model = _QueryPooling().eval()
    workload = load_workload(model, [(1, 64, 96)])
    lowered = lower_workload(workload, target)
    assert "%" not in _kernel_scripts(lowered)
    x = np.random.default_rng(1).standard_normal((1, 64, 96)).astype("float32")
    assert error_against_torch(model, lowered, target, x) < 1e-6
    before = {k: v for k, v in LoweringOptions().as_dict().items() if k != "bounded_reshapes"}
    older = lower_workload(workload, target, LoweringOptions.from_record(before))  # a work dir's kernels kept
    assert "%" in _kernel_scripts(older)
    plain = [gv.name_hint for gv, _ in lowered.functions_items()]
    assert len(plain) == len(list(older.functions_items()))  # no reshape became a copy kernel of its own


def test_a_block_read_through_a_remainder_is_computed_at_the_root():
    """TVM's own reshape (a work dir's from before ``bounded_reshapes``) leaves the max reading its copy of the
    windows through ``%``: computed at a loop of the max, TVM cannot bound what an iteration reads, and the whole
    copy would be made again at every iteration."""
    target = resolve_target("llvm")
    model = _QueryPooling().eval()
    workload = load_workload(model, [(1, 64, 96)])
    lowered = lower_workload(workload, target, LoweringOptions(bounded_reshapes=False))
    (task,) = [t for t in extract_tasks(workload, target, lowered) if "max" in t.name]
    configured = configure_kernel(task.mod, target)
    assert configured is not None
    trace = configured.sch.trace
    locations = [int(trace.decisions[i]) for i in trace.insts if i.kind.name == "SampleComputeLocation"]
    assert ROOT in locations, locations
    unscheduled, ours = unscheduled_and_scheduled_outputs(task.mod, configured.sch.mod, seed=2)
    np.testing.assert_array_equal(ours, unscheduled)


def _product_of(rows: te.Tensor, columns: int) -> tvm.IRModule:
    """``rows`` (a 2-D copy of an input) times a weight of ``columns`` columns."""
    (data,) = rows.op.input_tensors
    weight = te.placeholder((rows.shape[1], columns), name="w")
    k = te.reduce_axis((0, rows.shape[1]), name="k")
    out = te.compute((rows.shape[0], columns), lambda i, j: te.sum(rows[i, k] * weight[k, j], axis=k), name="matmul")
    func = te.create_prim_func([data, weight, out]).with_attr("global_symbol", "main")
    return tvm.IRModule({"main": func})


def _copy_location(mod: tvm.IRModule) -> int:
    configured = configure_kernel(mod, resolve_target("llvm"))
    assert configured is not None
    unscheduled, ours = unscheduled_and_scheduled_outputs(mod, configured.sch.mod, seed=3)
    np.testing.assert_allclose(ours, unscheduled, rtol=1e-5, atol=1e-5)
    trace = configured.sch.trace
    (location,) = [int(trace.decisions[i]) for i in trace.insts if i.kind.name == "SampleComputeLocation"]
    return location


def test_a_reshape_that_moves_nothing_is_inlined_into_the_product_that_reads_it():
    """MobileViT's patches (4x256x144) read as 1024 rows of 144: at the root the reshape was a copy of the
    whole input and a parallel launch of its own (its product 249 -> 185 us alone on a 2-core Xeon)."""
    data = te.placeholder((4, 64, 48), name="x")
    rows = bounded_reshape(data, [tirx.IntImm("int64", d) for d in (256, 48)])
    mod = _product_of(rows, 32)
    assert is_view(_block(mod, "T_reshape"))
    assert _copy_location(mod) == INLINED
    # a transpose moves every element: a pass of its own at the root, the product reading rows as they lie
    columns_first = te.placeholder((48, 256), name="x")
    moved = te.compute((256, 48), lambda i, j: columns_first[j, i], name="T_transpose")
    assert not is_view(_block(_product_of(moved, 32), "T_transpose"))
    assert _copy_location(_product_of(moved, 32)) == ROOT
    # the same offsets across the innermost axis (6x10 read as 4x15): a division in the vectorised loop
    across = bounded_reshape(te.placeholder((6, 10), name="x"), [tirx.IntImm("int64", d) for d in (4, 15)])
    assert not is_view(_block(_product_of(across, 16), "T_reshape"))


def _block(mod: tvm.IRModule, name: str):
    sch = tvm.s_tir.Schedule(mod)
    return sch.get(sch.get_sblock(name))
