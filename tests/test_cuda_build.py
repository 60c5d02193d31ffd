"""CUDA code builds into real cubins on a machine without a GPU (nvcc and a stand-in driver)."""

import shutil

import pytest
import tvm

from costmodel import CandidateFeatures, CostModel
from measure import EngineConfig, MeasureEngine, MeasureInput
from tuner.search import TaskSearch
from tuner.targets import resolve_target
from workloads import get_workload

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None and not tvm.cuda(0).exist, reason="needs the CUDA toolkit")


def _holds_a_cubin(path) -> bool:
    data = open(path, "rb").read()
    return b"\x7fELF" in data[64:] and b"__global__" not in data  # an embedded sm_90 image, not CUDA source


def test_search_proposes_valid_gpu_schedules_and_they_build_to_cubins(tmp_path):
    target = resolve_target("cuda -arch=sm_90")
    mod = get_workload("matmul-128").mod
    search = TaskSearch(mod, target, seed=3, cost_model=CostModel(), features=CandidateFeatures(), group="mm")
    candidates = search.propose(3)
    assert len(candidates) == 3
    with MeasureEngine(target, tmp_path, EngineConfig(build_workers=2)) as engine:
        built = list(engine.build([MeasureInput(c.key, c.mod) for c in candidates]))
        assert all(b.ok for b in built), [b.error for b in built]
        for b in built:  # artifacts live as long as the engine
            assert _holds_a_cubin(b.artifact)
            assert b.args == [["float32", [128, 128]]] * 3


@pytest.mark.parametrize("name", ["matmul-llama2-7b-qproj-fp16", "conv2d-resnet50-l3", "softmax-bert-base-attn", "layernorm-bert-base"])
def test_operators_build_for_sm90_with_tvms_default_gpu_schedules(name, tmp_path):
    workload = get_workload(name)
    engine = MeasureEngine(resolve_target("cuda -arch=sm_90"), tmp_path, EngineConfig(build_workers=1))
    try:
        artifact = engine.compile_program(tmp_path / "op.so", mod=workload.mod, kind="tir", schedules=[])
    finally:
        engine.close()
    assert _holds_a_cubin(artifact)


def test_an_illegal_memory_access_is_recorded_and_the_next_candidate_measures(tmp_path):
    """Builds here; measures where a GPU is present (the CUDA context of the measuring worker is
    lost after the fault, so the worker must be replaced)."""
    import faulty

    from measure import Status

    target = resolve_target("cuda -arch=sm_90" if not tvm.cuda(0).exist else "cuda")
    inputs = [MeasureInput("illegal", faulty.gpu_out_of_bounds()), MeasureInput("good", faulty.gpu_copy())]
    with MeasureEngine(target, tmp_path, EngineConfig(build_workers=1)) as engine:
        built = list(engine.build(inputs))
        assert all(b.ok for b in built), [b.error for b in built]
        if not tvm.cuda(0).exist:
            pytest.skip("built; measuring needs a GPU")
        results = {r.key: r for r in engine.measure_built(built)}
    assert results["illegal"].status in (Status.RUN_ERROR, Status.RUN_CRASH) and "illegal" in results["illegal"].error.lower()
    assert results["good"].ok
