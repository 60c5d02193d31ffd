"""Grouped 1-D convolutions as our channels-last kernel (tuner.lowering.grouped_conv1d): which take that form,
that the model built from it computes what PyTorch computes, and that its analytic register tile takes a
group's vectors of output channels together."""

import numpy as np
import pytest
from analytic_facts import AVX2, AVX512, check_factors
from analytic_rules import unscheduled_and_scheduled_outputs
from lowered_models import error_against_torch

from tuner.lowering import LoweringOptions
from tuner.spaces.analytic import configure_kernel
from tuner.spaces.block_plan import TiledLoop, plan_block
from tuner.targets import resolve_target
from tuner.tasks.extraction import extract_tasks, lower_workload
from workloads import load_workload

torch = pytest.importorskip("torch")


class _PositionalEmbedding(torch.nn.Module):
    """wav2vec 2.0's positional embedding in small (SEW's with a stride): a grouped convolution of a long
    window, its last position dropped, a GELU, added to its input (strided: to a projection of it)."""

    def __init__(self, stride: int):
        super().__init__()
        self.conv = torch.nn.Conv1d(96, 96, kernel_size=16, padding=8, groups=2, stride=stride)
        self.stride = stride

    def forward(self, x):  # x: [batch, positions, channels]
        y = self.conv(x.transpose(1, 2))[:, :, :-1]
        y = torch.nn.functional.gelu(y).transpose(1, 2)
        return x[:, :: self.stride] + y


def _lowered(stride: int, options: LoweringOptions | None = None):
    torch.manual_seed(0)
    model = _PositionalEmbedding(stride).eval()
    target = resolve_target("llvm")
    workload = load_workload(model, [(1, 40, 96)])
    return model, target, workload, lower_workload(workload, target, options)


def _names(lowered) -> list[str]:
    return [gv.name_hint for gv, _ in lowered.functions_items()]


@pytest.mark.parametrize("stride", [1, 2])
def test_a_grouped_convolution_of_a_long_window_runs_as_our_kernel_and_matches_pytorch(stride):
    model, target, _, lowered = _lowered(stride)
    names = _names(lowered)
    assert any("group_conv1d" in name for name in names), names
    assert not any("conv1d" in name and "group_conv1d" not in name for name in names), names
    x = np.random.default_rng(stride).standard_normal((1, 40, 96)).astype("float32")
    assert error_against_torch(model, lowered, target, x) < 1e-5


def test_short_windows_groups_of_ragged_vectors_and_older_work_dirs_keep_tvms_grouped_convolution():
    before = {k: v for k, v in LoweringOptions().as_dict().items() if k != "grouped_conv1d_channels_last"}
    *_, lowered = _lowered(2, LoweringOptions.from_record(before))
    assert not any("group_conv1d" in name for name in _names(lowered))

    class Short(torch.nn.Module):  # a window of 5; 12 channels a group (not whole vectors)
        def __init__(self):
            super().__init__()
            self.short = torch.nn.Conv1d(96, 96, kernel_size=5, padding=2, groups=2)
            self.ragged = torch.nn.Conv1d(96, 96, kernel_size=16, padding=8, groups=8)

        def forward(self, x):
            return self.ragged(self.short(x))

    lowered = lower_workload(load_workload(Short().eval(), [(1, 96, 40)]), resolve_target("llvm"))
    assert not any("group_conv1d" in name for name in _names(lowered))


def test_the_analytic_schedule_tiles_a_groups_vectors_of_channels_together_and_computes_the_convolution():
    _, target, workload, lowered = _lowered(2)
    (task,) = [t for t in extract_tasks(workload, target, lowered) if "group_conv1d" in t.name]
    configured = configure_kernel(task.mod, target)
    assert configured is not None and len(configured.plans) == 1
    (plan,) = configured.plans
    vectors, positions = [loop for loop in plan.loops if loop.role == "spatial"][-2:]  # the group's vectors: 3
    assert plan.factors[vectors.index][-1] == vectors.extent == 3
    assert plan.accumulators == 3 * plan.factors[positions.index][-1]
    unscheduled, ours = unscheduled_and_scheduled_outputs(task.mod, configured.sch.mod, seed=0)
    np.testing.assert_allclose(ours, unscheduled, rtol=1e-4, atol=1e-4)


def _grouped_loops(positions: int) -> list[TiledLoop]:
    """A grouped convolution's tiled loops as MetaSchedule splits them: batch, groups, the group's vectors of
    output channels, positions, a vector's channels; the window, the group's input channels."""
    spatial = [1, 16, 3, positions]
    loops = [TiledLoop(i, "spatial", extent, 4, 64) for i, extent in enumerate(spatial)]
    loops.append(TiledLoop(4, "vector", 16, 4, 64))
    return loops + [TiledLoop(5, "reduction", 128, 2, 64), TiledLoop(6, "reduction", 48, 2, 64)]


@pytest.mark.parametrize(("positions", "rows"), [(24, 6), (25, 5), (50, 5)])
def test_a_tile_of_a_groups_vectors_keeps_a_register_for_each_rows_broadcast(positions, rows):
    """3 x 8 would be 24 accumulators, 3 weights and 8 broadcasts: over AVX-512's 32 registers (it spilled)."""
    loops = _grouped_loops(positions)
    plan = plan_block(loops, AVX512, column_vectors=3)
    check_factors(loops, plan)
    assert plan.factors[2][-1] == 3 and plan.factors[3][-1] == rows
    assert plan.accumulators == 3 * rows
    assert plan_block(loops, AVX512).factors[2][-1] == 1  # without the annotation: a loop like any other
    small = plan_block(loops, AVX2, column_vectors=3)  # 16 registers: 3 x 2 (6 + 3 + 2 + 1)
    check_factors(loops, small)
    assert small.accumulators <= 12
