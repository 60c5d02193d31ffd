"""CUDA candidates build into real cubins on a machine without a GPU (nvcc and a stand-in driver)."""

import shutil

import pytest
import tvm

from costmodel import CandidateFeatures, CostModel
from measure import EngineConfig, MeasureEngine, MeasureInput
from tuner.search import TaskSearch
from tuner.targets import resolve_target
from workloads import get_workload

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None and not tvm.cuda(0).exist, reason="needs the CUDA toolkit")


def test_search_proposes_valid_gpu_schedules_and_they_build_to_cubins(tmp_path):
    target = resolve_target("cuda -arch=sm_90")
    mod = get_workload("matmul-128").mod
    search = TaskSearch(mod, target, seed=3, cost_model=CostModel(), features=CandidateFeatures(), group="mm")
    candidates = search.propose(3)
    assert len(candidates) == 3
    engine = MeasureEngine(target, tmp_path, EngineConfig(build_workers=2))
    try:
        built = list(engine.build([MeasureInput(c.key, c.mod) for c in candidates]))
    finally:
        engine._builders[0].close()
        engine._builders[1].close()
    assert all(b.ok for b in built), [b.error for b in built]
    for b in built:
        data = open(b.artifact, "rb").read()
        assert b"sm_90" in data or b"\x7fELF" in data  # the cubin (an ELF image for sm_90) is embedded
        assert b"__global__" not in data, "CUDA source instead of a binary"
        assert b.args == [["float32", [128, 128]]] * 3
