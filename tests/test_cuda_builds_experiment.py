"""experiments/cuda_builds.py: each compile mode builds the same sampled candidates through the
engine, its build workers say they used it, and the table has a rate for it."""

from __future__ import annotations

import pytest
from cuda_compilers import COMPILE_MODES

from experiments.cuda_builds import COLUMNS, MODES, NVRTC_AS_TVM, describe_run, measure_builds, report
from measure.cuda.compile_env import COMPILE_MODE_ENV

TVMS_SOURCES = pytest.param(NVRTC_AS_TVM, marks=COMPILE_MODES[1].marks)  # NVRTC on TVM's sources as they are


@pytest.mark.parametrize("mode", [*COMPILE_MODES, TVMS_SOURCES])
def test_two_candidates_build_with_each_compile_mode_and_the_table_gives_their_rate(mode, tmp_path):
    (row,) = measure_builds(["matmul-128"], [mode], candidates=2, rounds=1, work_dir=tmp_path)
    assert (row["workload"], row["mode"], row["candidates"], row["failures"]) == ("matmul-128", mode, 2, "0 of 2")
    assert row["cand/s"] > 0 and row["median build s"] > 0
    compiler = MODES[mode][COMPILE_MODE_ENV]  # the workers' logs said it, and whether the sources were lean
    assert row["compile_path"].startswith(f"CUDA compile: {compiler} ({COMPILE_MODE_ENV}={compiler};")
    table = report([row], describe_run("experiments/cuda_builds.py --candidates 2", workers=2))
    assert "| " + " | ".join(COLUMNS) + " |" in table.splitlines()
    assert f"| matmul-128 | {mode} | 2 | 1 | {row['cand/s']} |" in table
