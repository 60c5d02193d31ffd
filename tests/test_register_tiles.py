"""Fresh CPU samples drawn so that a tile's accumulators fill the vector registers (tuner/spaces/register_tiles.py)."""

import numpy as np
import pytest
import tvm
from tvm import te, topi

from tuner.spaces import metaschedule as msc
from tuner.spaces.register_tiles import MIN_INNER_REDUCTION, RegisterFile, register_file, register_tile
from tuner.targets import resolve_target
from workloads.operators import matmul


def _space(mod: tvm.IRModule, target):
    context = msc.make_context(mod, target, seed=1)
    return msc.design_spaces(context), msc.postprocessors(context)


def _register_tile(sch, lanes: int) -> tuple[int, int, int]:
    """The first CPU-tiled block's accumulators (vector registers), inner reduction steps and unroll limit index."""
    spatial, reduction, unroll, in_block = [], [], None, False
    for inst in sch.trace.insts:
        kind = inst.kind.name
        if kind == "Annotate" and str(inst.attrs[0]) == "meta_schedule.tiling_structure":
            in_block = not spatial
        elif kind == "SamplePerfectTile" and in_block:
            decision = [int(x) for x in sch.trace.decisions[inst]]
            (spatial if len(decision) == 4 else reduction).append(decision[-1])
        elif kind == "SampleCategorical":
            unroll = int(sch.trace.decisions[inst])
    rows = int(np.prod(spatial[:-1]))
    return rows * -(-spatial[-1] // lanes), int(np.prod(reduction)), unroll


def _fits(sch, registers: RegisterFile) -> bool:
    accumulators, inner_reduction, unroll = _register_tile(sch, registers.lanes)
    within = registers.min_accumulators <= accumulators <= registers.max_accumulators
    return within and inner_reduction >= MIN_INNER_REDUCTION and unroll > 0


def test_the_host_cpu_has_a_register_file_and_a_gpu_none(llvm_target):
    flags = open("/proc/cpuinfo").read().split()
    registers = register_file(llvm_target)
    assert registers == (RegisterFile(16, 32) if "avx512f" in flags else RegisterFile(8, 16))
    assert register_file(resolve_target("cuda -arch=sm_90")) is None


def test_fitted_samples_fill_the_registers_where_metaschedules_rarely_do(llvm_target):
    mod = msc.normalize_prim_func_module(matmul(128, 768, 256))
    registers = register_file(llvm_target)
    spaces, postprocs = _space(mod, llvm_target)

    def share(fitted: bool) -> float:
        samples = [
            msc.sample(mod, spaces[seed % len(spaces)], seed, postprocs, registers if fitted else None)
            for seed in range(1, 61)
        ]
        return sum(_fits(s, registers) for s in samples if s is not None) / len(samples)

    assert share(fitted=True) >= 0.7
    assert share(fitted=False) <= 0.3


def test_a_schedules_register_tile_is_read_from_its_trace(llvm_target):
    mod = msc.normalize_prim_func_module(matmul(128, 768, 256))
    registers = register_file(llvm_target)
    spaces, postprocs = _space(mod, llvm_target)
    for seed in range(1, 9):
        sch = msc.sample(mod, spaces[seed % len(spaces)], seed, postprocs, registers)
        assert register_tile(sch, registers.lanes) == _register_tile(sch, registers.lanes)[:2]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_fitted_convolution_computes_what_numpy_does(llvm_target, seed):
    """Several spatial and reduction loops: the tile over all of them fits, and its schedule is right."""
    data = te.placeholder((1, 10, 10, 32), "float32", name="data")
    weight = te.placeholder((3, 3, 32, 48), "float32", name="weight")
    out = topi.nn.conv2d_nhwc(data, weight, 1, 1, 1, out_dtype="float32")
    mod = msc.normalize_prim_func_module(te.create_prim_func([data, weight, out]))
    spaces, postprocs = _space(mod, llvm_target)
    sch = msc.sample(mod, spaces[0], seed, postprocs, register_file(llvm_target))
    assert sch is not None
    accumulators, inner_reduction, _ = _register_tile(sch, register_file(llvm_target).lanes)
    assert inner_reduction >= MIN_INNER_REDUCTION  # 3x3 window x 32 channels: it can be
    built = tvm.compile(sch.mod, target=llvm_target)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((1, 10, 10, 32)).astype("float32")
    w = rng.standard_normal((3, 3, 32, 48)).astype("float32")
    result = tvm.runtime.tensor(np.zeros((1, 10, 10, 48), "float32"))
    built(tvm.runtime.tensor(x), tvm.runtime.tensor(w), result)
    padded = np.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))
    expected = sum(
        np.einsum("nhwc,ck->nhwk", padded[:, dy : dy + 10, dx : dx + 10, :], w[dy, dx])
        for dy in range(3)
        for dx in range(3)
    )
    np.testing.assert_allclose(result.numpy(), expected, rtol=1e-4, atol=1e-4)


def test_the_search_proposes_mostly_fitted_candidates(llvm_target):
    from costmodel import CandidateFeatures, CostModel
    from tuner.search.task_search import TaskSearch

    mod = msc.normalize_prim_func_module(matmul(128, 768, 256))
    search = TaskSearch(mod, llvm_target, seed=3, cost_model=CostModel(), features=CandidateFeatures(), group="m")
    proposed = search.propose(32)
    registers = register_file(llvm_target)
    assert sum(_fits(c.schedule, registers) for c in proposed) >= 0.45 * len(proposed)


def test_where_no_tile_fills_the_registers_the_samples_are_metaschedules_own(llvm_target):
    """197 rows (a ViT's tokens) divide only into one-row tiles: of 16 columns, two AVX2 vectors at most,
    fewer accumulators than any register file wants."""
    mod = msc.normalize_prim_func_module(matmul(197, 16, 64))
    registers = register_file(llvm_target)
    spaces, postprocs = _space(mod, llvm_target)
    for seed in range(1, 6):
        drawn = msc.sample(mod, spaces[0], seed, postprocs, registers)
        own = msc.sample(mod, spaces[0], seed, postprocs)
        assert msc.structural_key(drawn.mod) == msc.structural_key(own.mod)
