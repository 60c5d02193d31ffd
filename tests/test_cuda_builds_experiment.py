"""experiments/cuda_builds.py: each compile mode builds the same sampled candidates through the
engine, its build workers say they used it, and the table has a rate for it."""

from __future__ import annotations

import pytest
from cuda_compilers import COMPILE_MODES

from experiments.cuda_builds import COLUMNS, describe_run, measure_builds, report


@pytest.mark.parametrize("mode", COMPILE_MODES)
def test_two_candidates_build_with_each_compile_mode_and_the_table_gives_their_rate(mode, tmp_path):
    (row,) = measure_builds(["matmul-128"], [mode], candidates=2, rounds=1, work_dir=tmp_path)
    assert (row["workload"], row["mode"], row["candidates"], row["failures"]) == ("matmul-128", mode, 2, "0 of 2")
    assert row["cand/s"] > 0 and row["median build s"] > 0
    assert row["compile_path"].startswith(f"CUDA compile: {mode} (TVM_CUDA_COMPILE_MODE={mode};")
    table = report([row], describe_run("experiments/cuda_builds.py --candidates 2", workers=2))
    assert "| " + " | ".join(COLUMNS) + " |" in table.splitlines()
    assert f"| matmul-128 | {mode} | 2 | 1 | {row['cand/s']} |" in table
