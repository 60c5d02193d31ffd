"""Values a kernel reads broadcast are computed once (tuner.lowering.broadcast_values): a squeeze-and-excitation
gate's sigmoid once per channel, not once per element of the map it scales; what is marked, what is not, and
that the analytic schedule of the gate's kernel computes what the unscheduled kernel does."""

from __future__ import annotations

import numpy as np
import pytest
from analytic_rules import unscheduled_and_scheduled_outputs

from tuner.lowering.broadcast_values import NO_INLINE, broadcast_blocks, row_vector
from tuner.spaces.analytic import configure_kernel
from tuner.spaces.metaschedule import root_vector
from tuner.targets import resolve_target
from tuner.tasks.extraction import extract_tasks, load_model

torch = pytest.importorskip("torch")

TARGET = resolve_target("llvm")


class SqueezeExcite(torch.nn.Module):
    """RegNet's gate: the map's channel means, reduced, expanded, a sigmoid, the map scaled by it."""

    def __init__(self, channels: int = 64, reduced: int = 8):
        super().__init__()
        # enough convolution for the model to be computed channels-last; it reads each input 9 * channels times
        self.expand = torch.nn.Conv2d(32, channels, 3, padding=1)
        self.reduce = torch.nn.Conv2d(channels, reduced, 1)
        self.excite = torch.nn.Conv2d(reduced, channels, 1)

    def forward(self, x):
        x = torch.relu(self.expand(x))
        gate = torch.sigmoid(self.excite(torch.relu(self.reduce(x.mean((2, 3), keepdim=True)))))
        return x * gate


def _tasks(channels: int = 64) -> dict:
    workload = load_model(SqueezeExcite(channels).eval(), (torch.randn(1, 32, 28, 28),))
    return {task.name: task for task in extract_tasks(workload, TARGET)}


def _gate(tasks: dict):
    return next(task for name, task in tasks.items() if "sigmoid" in name and "multiply" in name)


def test_the_gate_is_marked_and_its_schedule_computes_it_once_per_channel():
    gate = _gate(_tasks())
    (marked,) = broadcast_blocks(gate.mod["main"])
    key, value = NO_INLINE
    assert f'T.sblock_attr({{"{key}": "{value}"}})' in gate.mod.script()
    configured = configure_kernel(gate.mod, TARGET)
    assert configured is not None
    scheduled = configured.sch
    assert scheduled.get(scheduled.get_sblock(marked)) is not None  # computed in a block of its own: not inlined
    expected, got = unscheduled_and_scheduled_outputs(gate.mod, scheduled.mod, seed=0)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_a_convolution_reading_its_input_many_times_over_marks_nothing():
    tasks = _tasks()
    expanding = [task for name, task in tasks.items() if "sigmoid" not in name and "relu" in name]
    assert expanding
    for task in expanding:  # the 3x3 convolution and the gate's reduction
        assert broadcast_blocks(task.mod["main"]) == []


def test_a_gate_over_144_channels_has_its_multiply_vectorised_48_lanes_at_a_time():
    """MetaSchedule's 64-lane vectors would straddle rows of 144 channels and gather the gate lane by lane."""
    gate = _gate(_tasks(channels=144))
    assert broadcast_blocks(gate.mod["main"]) and root_vector(gate.mod) == 48
    scheduled = configure_kernel(gate.mod, TARGET).sch
    *_, vectorised = scheduled.get_loops(scheduled.get_sblock("T_multiply"))
    assert int(scheduled.get(vectorised).extent) == 48
    expected, got = unscheduled_and_scheduled_outputs(gate.mod, scheduled.mod, seed=1)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_a_gate_over_channels_in_no_whole_vectors_is_left_inlined():
    assert broadcast_blocks(_gate(_tasks(channels=72)).mod["main"]) == []
    assert row_vector(72) is None and row_vector(144) == 48 and row_vector(1088) == 64


class RoutedExperts(torch.nn.Module):
    """Mixtral's experts: each expert's product of the tokens routed to it, scaled by each token's routing weight."""

    def __init__(self, experts: int = 4, width: int = 128, hidden: int = 64, bias: bool = False):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(experts, width, hidden) / width**0.5)
        self.bias = torch.nn.Parameter(torch.randn(experts, 1, hidden)) if bias else None

    def forward(self, tokens, routing):
        product = torch.bmm(tokens, self.weight)
        return (product if self.bias is None else product + self.bias) * routing.unsqueeze(-1)


@pytest.mark.parametrize("bias", [False, True])  # Mixtral's experts; GPT-OSS's, a bias added before the scaling
def test_a_products_epilogue_reading_a_broadcast_value_keeps_its_design_space(bias):
    """The routing weight, read 64 times over by the scaled product, stays inlined: marked, it left the product's
    epilogue a producer MetaSchedule's tiling could not move the epilogue past, and the kernel unscheduled."""
    workload = load_model(RoutedExperts(bias=bias).eval(), (torch.randn(4, 32, 128), torch.rand(4, 32)))
    (product,) = [task for task in extract_tasks(workload, TARGET) if "matmul" in task.name]
    assert broadcast_blocks(product.mod["main"]) == []
    configured = configure_kernel(product.mod, TARGET)
    assert configured is not None and configured.plans  # tiled as a product, its register tile and blocks planned
    expected, got = unscheduled_and_scheduled_outputs(product.mod, configured.sch.mod, seed=2)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
