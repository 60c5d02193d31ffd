"""The bf16 intrinsics' PrimFuncs on disk: parsed once, loaded by the next process, parsed again when unreadable."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import tvm
from bf16_builds import needs_bf16

from codegen.bf16_dot import AVX512, _intrinsic, intrinsic_name
from codegen.intrinsic_cache import cached_intrinsic, entry_path

ROOT = Path(__file__).resolve().parent.parent


def _parsed():
    return _intrinsic(2, 1, 8, AVX512, False)


def _not_parsed():
    raise AssertionError("parsed again although the cache holds the intrinsic")


def test_an_intrinsic_parsed_once_is_loaded_the_same_from_the_cache():
    name = intrinsic_name(2, 1, 8, AVX512)
    parsed = cached_intrinsic(name, _parsed)
    assert entry_path(name).is_file()
    loaded = cached_intrinsic(name, _not_parsed)
    for before, after in zip(parsed, loaded, strict=True):
        tvm.ir.assert_structural_equal(before, after)


def test_an_unreadable_entry_is_parsed_and_written_again():
    name = intrinsic_name(2, 1, 8, AVX512)
    entry_path(name).parent.mkdir(parents=True, exist_ok=True)
    entry_path(name).write_text('{"description": "not TVM')
    description, _ = cached_intrinsic(name, _parsed)
    tvm.ir.assert_structural_equal(description, _parsed()[0])
    tvm.ir.assert_structural_equal(cached_intrinsic(name, _not_parsed)[0], description)


@needs_bf16
def test_a_process_that_loads_the_intrinsics_from_the_cache_computes_the_product_numpy_computes():
    # the first process parses and writes the entry; the second may not parse: it loads it, builds and checks
    script = """
import sys
import numpy as np
from bf16_builds import bf16_array, built_tiled, dense_module, run_built
from codegen import bf16_dot
from tuner.lowering.bf16.kernels import pack_dense_weight
if sys.argv[1] == "load":
    bf16_dot._intrinsic = lambda *args: sys.exit("parsed although the cache holds the intrinsic")
m, n, k = 12, 64, 34
data, weight = bf16_array((m, k), 1), bf16_array((k, n), 2)
out = run_built(built_tiled(dense_module(m, n, k), "gemm", 3, 2), [data, pack_dense_weight(weight)], (m, n))
np.testing.assert_allclose(out, data.astype(np.float32) @ weight.astype(np.float32), rtol=1e-5, atol=1e-4)
"""
    env = {**os.environ, "PYTHONPATH": f"{ROOT}:{ROOT / 'tests'}"}
    for step in ("parse", "load"):
        subprocess.run([sys.executable, "-c", script, step], check=True, timeout=300, env=env)
        assert entry_path(intrinsic_name(3, 2, 17, AVX512)).is_file()


def test_entries_of_other_code_are_removed_when_this_code_writes_its_first():
    name = intrinsic_name(2, 1, 8, AVX512)
    stale = entry_path(name).parent.parent / "0123456789abcdef"
    stale.mkdir(parents=True)
    (stale / f"{name}.json").write_text("{}")
    cached_intrinsic(name, _parsed)
    assert not stale.exists() and entry_path(name).is_file()
