"""Row reductions then a row written (layer norms, RMS norms) as parallel rows of vectors
(tuner.spaces.norm_rule): which kernels take it, the schedule it makes, and that the built kernel computes
what the unscheduled one does."""

from __future__ import annotations

import json
import re
import sqlite3

import numpy as np
import pytest
import tvm
from analytic_rules import configured_by_rule
from tvm import te

from tuner import tune
from tuner.database.workdir import ANALYTIC_SEEDS_KEY
from tuner.search.first_candidates import ANALYTIC_SEEDS
from tuner.spaces import metaschedule as msc
from tuner.spaces.analytic import configure_kernel
from tuner.spaces.norm_rule import norm_schedule
from tuner.targets import resolve_target


def _layer_norm(rows: int = 128, columns: int = 768) -> tvm.IRModule:
    """TVM's layer norm as Relax lowers it: a sum, a mean, a sum of squared differences, the row."""
    x = te.placeholder((rows, columns), "float32", name="x")
    gamma = te.placeholder((columns,), "float32", name="gamma")
    beta = te.placeholder((columns,), "float32", name="beta")
    k = te.reduce_axis((0, columns), "k")
    total = te.compute((rows,), lambda i: te.sum(x[i, k], axis=k), name="sum")
    mean = te.compute((rows,), lambda i: total[i] / columns, name="mean")
    k2 = te.reduce_axis((0, columns), "k2")
    squares = te.compute(
        (rows,), lambda i: te.sum((x[i, k2] - mean[i]) * (x[i, k2] - mean[i]), axis=k2), name="var_sum"
    )
    y = te.compute(
        (rows, columns),
        lambda i, j: (x[i, j] - mean[i]) * te.rsqrt(squares[i] / columns + 1e-5) * gamma[j] + beta[j],
        name="layer_norm",
    )
    return tvm.IRModule({"main": te.create_prim_func([x, gamma, beta, y])})


def _residual_rms_norm(batch: int = 1, tokens: int = 50, width: int = 96) -> tvm.IRModule:
    """A residual added, then an RMS norm over the last axis of a 3-D tensor."""
    x = te.placeholder((batch, tokens, width), "float32", name="x")
    r = te.placeholder((batch, tokens, width), "float32", name="r")
    w = te.placeholder((width,), "float32", name="w")
    added = te.compute((batch, tokens, width), lambda b, t, c: x[b, t, c] + r[b, t, c], name="added")
    k = te.reduce_axis((0, width), "k")
    squares = te.compute((batch, tokens), lambda b, t: te.sum(added[b, t, k] * added[b, t, k], axis=k), name="sq")
    y = te.compute(
        (batch, tokens, width),
        lambda b, t, c: added[b, t, c] * te.rsqrt(squares[b, t] / width + 1e-6) * w[c],
        name="rms_norm",
    )
    return tvm.IRModule({"main": te.create_prim_func([x, r, w, y])})


def _column_sums_broadcast(rows: int = 64, columns: int = 64) -> tvm.IRModule:
    """A reduction over the rows (not along them), broadcast back: not a row's reduction."""
    x = te.placeholder((rows, columns), "float32", name="x")
    k = te.reduce_axis((0, rows), "k")
    sums = te.compute((columns,), lambda j: te.sum(x[k, j], axis=k), name="sums")
    y = te.compute((rows, columns), lambda i, j: x[i, j] - sums[j], name="y")
    return tvm.IRModule({"main": te.create_prim_func([x, y])})


def _row_sums(rows: int = 64, columns: int = 208) -> tvm.IRModule:
    x = te.placeholder((rows, columns), "float32", name="x")
    k = te.reduce_axis((0, columns), "k")
    y = te.compute((rows,), lambda i: te.sum(x[i, k], axis=k), name="y")
    return tvm.IRModule({"main": te.create_prim_func([x, y])})


def _run(mod: tvm.IRModule, arrays: list[np.ndarray], out_shape: tuple) -> np.ndarray:
    built = tvm.compile(mod, target=resolve_target("llvm"))
    out = tvm.runtime.tensor(np.full(out_shape, np.nan, "float32"))
    built["main"](*(tvm.runtime.tensor(a) for a in arrays), out)
    return out.numpy()


def test_a_layer_norm_takes_parallel_rows_with_its_reductions_over_vectors():
    sch = norm_schedule(_layer_norm(), lanes=16, cores=2)
    assert sch is not None
    script = sch.mod.script()
    assert script.count("T.parallel(128)") == 1
    # each of the two reductions: its partial results in 4 vectors of 16 lanes (independent chains over the
    # row's 48 vectors), then halved pairwise down to 2 (zeroed and summed each); the row written 16 lanes at a time
    widths = [int(w) for w in re.findall(r"T\.vectorized\((\d+)\)", script)]
    assert widths == 2 * [64, 64, 32, 32, 16, 16, 8, 8, 4, 4, 2, 2] + [16]
    blocks = sch.get_child_blocks(sch.get_sblock("root"))
    row = sch.get(sch.get_loops(blocks[0])[0])
    assert all(sch.get(sch.get_loops(block)[0]).same_as(row) for block in blocks)  # all computed at the row


def test_the_rows_of_a_3d_norm_are_fused_and_a_shorter_vector_divides_its_row():
    sch = norm_schedule(_residual_rms_norm(width=72), lanes=16, cores=2)
    assert sch is not None
    script = sch.mod.script()
    assert "T.parallel(50)" in script and "T.vectorized(8)" in script and "T.vectorized(16)" not in script


def test_kernels_that_are_not_row_norms_keep_their_design_spaces():
    assert norm_schedule(_row_sums(), lanes=16, cores=2) is None  # no row written after the reduction
    assert norm_schedule(_column_sums_broadcast(), lanes=16, cores=2) is None
    assert norm_schedule(_layer_norm(rows=1), lanes=16, cores=2) is None  # one row: one core
    assert norm_schedule(_layer_norm(columns=198), lanes=16, cores=2) is None  # 198 = 2 x 99: no vector of 4
    annotated = _layer_norm()
    sch = tvm.s_tir.Schedule(annotated)
    sch.annotate(sch.get_sblock("sum"), "schedule_rule", "tuner_softmax")
    assert norm_schedule(sch.mod, lanes=16, cores=2) is None  # a design space of its own


def test_the_analytic_schedule_of_a_layer_norm_is_its_rows_and_computes_the_same():
    mod = _layer_norm()
    scheduled = configured_by_rule(mod, parallel_rows=128)
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((128, 768)) * 3 + 1).astype("float32")
    gamma, beta = rng.standard_normal(768).astype("float32"), rng.standard_normal(768).astype("float32")
    unscheduled = _run(mod, [x, gamma, beta], (128, 768))
    ours = _run(scheduled.mod, [x, gamma, beta], (128, 768))
    mean = x.mean(axis=1, keepdims=True)
    expected = (x - mean) / np.sqrt(((x - mean) ** 2).mean(axis=1, keepdims=True) + 1e-5) * gamma + beta
    np.testing.assert_allclose(unscheduled, expected, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(ours, unscheduled, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("columns", [768, 192, 96, 200])
def test_a_rows_sums_take_independent_chains_and_pairwise_steps_and_compute_the_same(columns):
    # 4 chains over 768 and 192, 2 over 96, one of 8-lane vectors over 200; 16 lanes summed one by one
    # made 16 dependent scalar adds a reduction and a row
    mod = _layer_norm(rows=64, columns=columns)
    sch = norm_schedule(mod, lanes=16, cores=2)
    assembly = tvm.compile(sch.mod, target=resolve_target("llvm")).mod.inspect_source("asm")
    assert assembly.count("\tvaddss\t") <= 8
    rng = np.random.default_rng(2)
    x = (rng.standard_normal((64, columns)) * 3 + 1).astype("float32")
    gamma, beta = rng.standard_normal(columns).astype("float32"), rng.standard_normal(columns).astype("float32")
    mean = x.mean(axis=1, keepdims=True)
    expected = (x - mean) / np.sqrt(((x - mean) ** 2).mean(axis=1, keepdims=True) + 1e-5) * gamma + beta
    np.testing.assert_allclose(_run(sch.mod, [x, gamma, beta], (64, columns)), expected, rtol=1e-4, atol=1e-4)


def test_a_residual_rms_norm_computes_the_same():
    mod = _residual_rms_norm()
    sch = norm_schedule(mod, lanes=16, cores=2)
    assert sch is not None
    rng = np.random.default_rng(1)
    x, r = (rng.standard_normal((1, 50, 96)).astype("float32") for _ in range(2))
    w = rng.standard_normal(96).astype("float32")
    added = x + r
    expected = added / np.sqrt((added**2).mean(axis=-1, keepdims=True) + 1e-6) * w
    np.testing.assert_allclose(_run(sch.mod, [x, r, w], (1, 50, 96)), expected, rtol=1e-5, atol=1e-5)


def test_a_search_measures_the_norm_rules_schedule_first_as_the_kernels_analytic_one(tmp_path):
    mod = _layer_norm()
    rule_key = msc.structural_key(configure_kernel(mod, resolve_target("llvm")).sch.mod)
    tune(mod, trials=8, batch_size=4, work_dir=tmp_path, progress=False)
    with sqlite3.connect(tmp_path / "tuning.db") as db:
        keys = [row[0] for row in db.execute("SELECT candidate FROM records WHERE status = 'ok' ORDER BY id")]
        (seeds,) = db.execute("SELECT value FROM meta WHERE key = ?", (ANALYTIC_SEEDS_KEY,)).fetchone()
    assert rule_key in keys[:ANALYTIC_SEEDS] and len(keys) == 8  # measured first, and the search went on from it
    (seed,) = json.loads(seeds).values()
    assert seed["candidate"] == rule_key and not seed["tiled"]
