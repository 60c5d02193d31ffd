"""What the tests of our own analytic rules (rows_rule, norm_rule) and of analytic schedules share."""

from __future__ import annotations

import numpy as np
import tvm
from tvm.s_tir import Schedule

from tuner.spaces import metaschedule as msc
from tuner.spaces.analytic import configure_kernel
from tuner.targets import resolve_target


def configured_by_rule(mod: tvm.IRModule, parallel_rows: int) -> Schedule:
    """``mod``'s analytic schedule on this CPU, checked to be a rule's (no tiled plans, ``parallel_rows``
    parallel rows) and to replay from its trace as a database records it and compile replays it."""
    configured = configure_kernel(mod, resolve_target("llvm"))
    assert configured is not None and configured.plans == ()
    assert f"T.parallel({parallel_rows})" in configured.sch.mod.script()
    replayed = msc.schedule_from_json(mod, msc.trace_to_json(configured.sch))
    tvm.ir.assert_structural_equal(replayed.mod, configured.sch.mod)
    return configured.sch


def unscheduled_and_scheduled_outputs(
    mod: tvm.IRModule, scheduled: tvm.IRModule, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """The last output of ``mod`` unscheduled and of its ``scheduled`` form, built for this CPU and run on the
    same random float32 arguments."""
    rng = np.random.default_rng(seed)
    arrays = [rng.standard_normal([int(d) for d in p.shape]).astype("float32") for p in mod["main"].params]
    outputs = []
    for built in (mod, scheduled):
        tensors = [tvm.runtime.tensor(a.copy()) for a in arrays]
        tvm.compile(built, target=resolve_target("llvm"))["main"](*tensors)
        outputs.append(tensors[-1].numpy())
    return outputs[0], outputs[1]
