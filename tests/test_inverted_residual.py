"""A 1x1 expanding convolution and the depthwise convolution after it as one kernel
(tuner.lowering.inverted_residual, scheduled by tuner.spaces.schedule_rules): which blocks are fused, that
the fused kernel's design space replays under new decisions, and that the model built with its
schedules, by real TVM, still computes what PyTorch computes."""

from dataclasses import replace

import numpy as np
import pytest
from bf16_builds import BF16_THROUGHOUT
from lowered_models import error_against_torch
from tvm.s_tir import meta_schedule as ms

from tuner.lowering import LoweringOptions, inverted_residual
from tuner.spaces import metaschedule as msc
from tuner.spaces.analytic import configure_kernel
from tuner.spaces.register_tiles import RegisterFile
from tuner.spaces.schedule_rules import (
    EXPAND_PIXELS,
    MAX_CHANNEL_VECTORS,
    MAX_OUTPUT_COLUMNS,
    MAX_OUTPUT_ROWS,
    ExpandDepthwiseDraw,
)
from tuner.targets import resolve_target
from tuner.tasks.extraction import extract_tasks, lower_workload
from workloads import load_workload

torch = pytest.importorskip("torch")


class _InvertedResidual(torch.nn.Module):
    """MobileNetV2's block: 1x1 expansion, 3x3 depthwise (stride 1 or 2), 1x1 projection; batch norms
    and ReLU6 between, the input added back at stride 1."""

    def __init__(self, channels: int, expansion: int, stride: int):
        super().__init__()
        wide = channels * expansion

        def conv_bn(cin, cout, kernel, stride=1, groups=1, relu=True):
            layers = [
                torch.nn.Conv2d(cin, cout, kernel, stride, kernel // 2, groups=groups, bias=False),
                torch.nn.BatchNorm2d(cout),
            ]
            return layers + ([torch.nn.ReLU6()] if relu else [])

        self.stride = stride
        self.body = torch.nn.Sequential(
            *conv_bn(channels, wide, 1),
            *conv_bn(wide, wide, 3, stride, groups=wide),
            *conv_bn(wide, channels, 1, relu=False),
        )
        for module in self.body:  # batch-norm statistics that are not the identity
            if isinstance(module, torch.nn.BatchNorm2d):
                torch.nn.init.uniform_(module.weight, 0.5, 1.5)
                torch.nn.init.uniform_(module.bias, -0.5, 0.5)
                module.running_mean.uniform_(-0.2, 0.2)
                module.running_var.uniform_(0.5, 1.5)

    def forward(self, x):
        y = self.body(x)
        return x + y if self.stride == 1 else y


class _SiluInvertedResidual(torch.nn.Module):
    """MobileViT's and EfficientNet's block: the same convolutions, biased, with SiLUs between them (which
    torch's export gives as x times its sigmoid)."""

    def __init__(self, channels: int, expansion: int, stride: int):
        super().__init__()
        wide = channels * expansion
        self.body = torch.nn.Sequential(
            torch.nn.Conv2d(channels, wide, 1),
            torch.nn.SiLU(),
            torch.nn.Conv2d(wide, wide, 3, stride, 1, groups=wide),
            torch.nn.SiLU(),
            torch.nn.Conv2d(wide, channels, 1),
        )

    def forward(self, x):
        return self.body(x)


def _block(stride: int, side: int, llvm_target, options=None, block_type=None):
    """The block, its workload and the workload lowered."""
    block = (block_type or _InvertedResidual)(8, 4, stride).eval()
    workload = load_workload(block, [(1, 8, side, side)])
    return block, workload, lower_workload(workload, llvm_target, options)


def _fused(tasks):
    return [t for t in tasks if t.name.startswith("expand_depthwise")]


def _fused_tasks(workload, target, lowered):
    return _fused(extract_tasks(workload, target, lowered))


@pytest.fixture
def fuse_small_blocks(monkeypatch):
    """Fuse blocks whatever the size of their expanded activation, so that tests stay small."""
    monkeypatch.setattr(inverted_residual, "MIN_EXPANDED_BYTES", 0)


def _with_sampled_schedule(task, target, seed: int) -> ms.database.MemoryDatabase:
    """A database holding one schedule drawn from the fused kernel's design space."""
    context = msc.make_context(task.mod, target, seed=seed)
    sch = msc.sample(task.mod, msc.design_spaces(context)[0], seed, msc.postprocessors(context))
    assert sch is not None
    return _database_holding(task, target, sch)


def _database_holding(task, target, sch) -> ms.database.MemoryDatabase:
    database = ms.database.MemoryDatabase()
    workload = database.commit_workload(task.mod)
    args = ms.arg_info.ArgInfo.from_prim_func(task.mod["main"])
    database.commit_tuning_record(ms.database.TuningRecord(sch.trace, workload, [1e-3], target, args))
    return database


def _error_with_sampled_schedule(block, lowered, task, target, stride: int, seed: int) -> float:
    """The lowered block's error against PyTorch, its fused kernel built with a schedule drawn by ``seed``."""
    x = np.random.default_rng(stride).standard_normal((1, 8, 20, 20)).astype("float32")
    return error_against_torch(block, lowered, target, x, _with_sampled_schedule(task, target, seed))


@pytest.mark.parametrize(("stride", "seed"), [(1, 3), (2, 5)])
def test_a_fused_block_computes_what_pytorch_computes(stride, seed, llvm_target, fuse_small_blocks):
    """One fused kernel per block (the projection stays a kernel of its own), built with a schedule from
    its design space: the padding rows and columns, the halo between row bands and the weights'
    rewritten layout must all come out right."""
    block, workload, lowered = _block(stride, 20, llvm_target)
    (task,) = _fused_tasks(workload, llvm_target, lowered)
    assert _error_with_sampled_schedule(block, lowered, task, llvm_target, stride, seed) < 1e-5


def test_the_design_space_replays_whatever_tiles_are_drawn(llvm_target, fuse_small_blocks):
    """The search draws and mutates the space's tile sizes: every draw must give a schedule that the
    postprocessors accept (a loop count that depends on a draw breaks the trace's replay)."""
    _, workload, lowered = _block(2, 24, llvm_target)
    (task,) = _fused_tasks(workload, llvm_target, lowered)
    context = msc.make_context(task.mod, llvm_target, seed=1)
    space, postprocs = msc.design_spaces(context)[0], msc.postprocessors(context)
    assert all(msc.sample(task.mod, space, seed, postprocs) is not None for seed in range(1, 9))


def test_only_expansions_larger_than_a_cores_cache_are_fused(llvm_target):
    """The default threshold keeps a block whose expanded activation fits the L2 as two kernels; a
    larger one is fused; with the option off, none is."""
    _, small, lowered = _block(1, 20, llvm_target)  # 20x20x32 floats: 51 KB
    assert _fused_tasks(small, llvm_target, lowered) == []
    _, large, lowered = _block(1, 96, llvm_target)  # 96x96x32 floats: 1.2 MB
    assert len(_fused_tasks(large, llvm_target, lowered)) == 1
    off = lower_workload(large, llvm_target, LoweringOptions(fuse_expand_depthwise=False))
    assert _fused_tasks(large, llvm_target, off) == []


@pytest.mark.parametrize(
    ("stride", "seed", "block_type"),
    [(1, 3, _InvertedResidual), (2, 5, _InvertedResidual), (2, 5, _SiluInvertedResidual)],
)
def test_in_bf16_a_fused_block_writes_bf16_for_its_projection(stride, seed, block_type, llvm_target, fuse_small_blocks):
    """In a bf16 model the block stays one float32 kernel whose output is bf16, read as it is by the
    projection (a bf16 product): no kernel of its own casts it between them. With the option off, the
    block is two bf16 products and a depthwise kernel, as before."""
    block, workload, lowered = _block(stride, 20, llvm_target, BF16_THROUGHOUT, block_type)
    tasks = extract_tasks(workload, llvm_target, lowered)
    (task,) = _fused(tasks)
    assert str(task.mod["main"].params[-1].dtype) == "bfloat16"
    assert not [t.name for t in tasks if t.name.startswith("cast")]
    assert _error_with_sampled_schedule(block, lowered, task, llvm_target, stride, seed) < 2e-2
    off = lower_workload(workload, llvm_target, replace(BF16_THROUGHOUT, bf16_fuse_expand_depthwise=False))
    assert _fused_tasks(workload, llvm_target, off) == []


@pytest.mark.parametrize(("stride", "seed", "fast_math"), [(1, 3, True), (2, 5, True), (2, 5, False)])
def test_a_block_activated_by_silus_is_fused_and_computes_what_pytorch_computes(
    stride, seed, fast_math, llvm_target, fuse_small_blocks
):
    """Both SiLUs go into the kernel (fast_math's polynomial one, or the exact one), leaving only the
    projection beside it; built with a drawn schedule and with the analytic one, it matches PyTorch."""
    options = LoweringOptions(fast_math=fast_math)
    block, workload, lowered = _block(stride, 20, llvm_target, options, _SiluInvertedResidual)
    tasks = extract_tasks(workload, llvm_target, lowered)
    (task,) = _fused(tasks)
    assert not [t.name for t in tasks if "sigmoid" in t.name or "silu" in t.name]
    assert _error_with_sampled_schedule(block, lowered, task, llvm_target, stride, seed) < 1e-5
    database = _database_holding(task, llvm_target, configure_kernel(task.mod, llvm_target).sch)
    x = np.random.default_rng(stride).standard_normal((1, 8, 20, 20)).astype("float32")
    assert error_against_torch(block, lowered, llvm_target, x, database) < 1e-5


def test_with_the_option_off_a_silu_block_stays_apart(llvm_target, fuse_small_blocks):
    _, workload, _ = _block(1, 20, llvm_target, block_type=_SiluInvertedResidual)
    off = lower_workload(workload, llvm_target, LoweringOptions(fuse_silu_blocks=False))
    assert _fused_tasks(workload, llvm_target, off) == []


@pytest.mark.parametrize("option", ["fuse_expand_depthwise", "bf16_fuse_expand_depthwise", "fuse_silu_blocks"])
def test_a_work_dir_tuned_before_the_fusion_existed_is_applied_without_it(option):
    before = {k: v for k, v in LoweringOptions().as_dict().items() if k != option}
    assert getattr(LoweringOptions.from_record(before), option) is False


@pytest.mark.parametrize(("cpu", "vectors", "pixels"), [("haswell", 1, 4), ("skylake-avx512", 2, 8)])
def test_the_analytic_schedule_fits_the_fused_tiles_to_the_register_file(cpu, vectors, pixels, fuse_small_blocks):
    """Channel vectors enough for the expansion's tile to hide the FMA latency (12 accumulators on
    AVX-512, 6 on AVX2), and as many expansion pixels (a power of two) as the registers hold beside its
    weights: on AVX2 a 16-lane vector takes two of 16 registers, so one vector and 4 pixels, not 8; on
    AVX-512 one vector of 8 pixels is 8 accumulators, two are 16."""
    target = resolve_target(f"llvm -mcpu={cpu} -num-cores 2")
    _, workload, lowered = _block(1, 20, target)
    (task,) = _fused_tasks(workload, target, lowered)
    decisions = configure_kernel(task.mod, target).sch.trace.decisions.items()
    tiles = [[int(f) for f in d] for inst, d in decisions if inst.kind.name == "SamplePerfectTile"]
    (pixel_choice,) = [int(d) for inst, d in decisions if inst.kind.name == "SampleCategorical"]
    assert tiles[0][-1] == 10  # rows: 20's largest divisor up to 16
    assert tiles[2][-1] == vectors
    assert EXPAND_PIXELS[pixel_choice] == pixels


@pytest.mark.parametrize(
    ("registers", "channel_vectors", "expected"),
    [
        (RegisterFile(16, 32), 6, 2),  # 96 channels: 8 pixels x 2 vectors, 16 accumulators
        (RegisterFile(16, 32), 9, 3),  # 144 channels: 2 does not divide 9; 3 x 8 = 24, all AVX-512 lends
        (RegisterFile(16, 32), 7, 1),  # 112 channels: 7 is prime
        (RegisterFile(8, 16), 9, 1),  # AVX2: one 16-lane vector of 4 pixels is 8 accumulators already
    ],
)
def test_the_fused_tiles_channel_vectors_are_the_fewest_that_hide_the_fma_latency(registers, channel_vectors, expected):
    draw = ExpandDepthwiseDraw(registers)
    draw.perfect_tile(20, MAX_OUTPUT_ROWS)  # rows, then columns, then the channel vectors
    draw.perfect_tile(20, MAX_OUTPUT_COLUMNS)
    assert draw.perfect_tile(channel_vectors, MAX_CHANNEL_VECTORS) == [channel_vectors // expected, expected]
    pixels = EXPAND_PIXELS[draw.pixels(list(EXPAND_PIXELS))]
    vector_registers = expected * draw.per_vector
    assert registers.holds(pixels * vector_registers, vector_registers)


def test_the_analytic_schedule_of_a_fused_block_computes_what_pytorch_computes(llvm_target, fuse_small_blocks):
    block, workload, lowered = _block(1, 20, llvm_target)
    (task,) = _fused_tasks(workload, llvm_target, lowered)
    database = _database_holding(task, llvm_target, configure_kernel(task.mod, llvm_target).sch)
    x = np.random.default_rng(0).standard_normal((1, 8, 20, 20)).astype("float32")
    assert error_against_torch(block, lowered, llvm_target, x, database) < 1e-5


def test_in_bf16_on_amx_an_expansion_over_a_whole_step_of_channels_is_left_to_amx(fuse_small_blocks):
    """MobileNetV1's pointwise convolutions over 32-128 channels, fused in fp32, ran at 4-5% of AMX's peak:
    on AMX an expansion over 32 channels or more stays a bf16 product of its own; over fewer, and wherever
    the bf16 unit is ``vdpbf16ps``, the block is fused as before."""
    amx, avx512 = resolve_target("llvm -mcpu=sapphirerapids"), resolve_target("llvm -mcpu=znver4")
    for channels, target, fused in ((32, amx, False), (16, amx, True), (32, avx512, True)):
        block = _InvertedResidual(channels, 4, 1).eval()
        workload = load_workload(block, [(1, channels, 12, 12)])
        lowered = lower_workload(workload, target, BF16_THROUGHOUT)
        assert len(_fused_tasks(workload, target, lowered)) == int(fused), (channels, str(target))
