"""Why a kernel runs slower in a tuned model than the tuning measured it: the same kernel timed now,
in one process and interleaved, as the tuning times it (its library alone, rebuilt from its record,
called again and again), inside the model on the model's own buffers (called again and again; after
the rest of the model ran; after the caches were flushed), beside the time the tuning recorded.

    .venv/bin/python experiments/in_model_gap.py WORK_DIR KERNEL [KERNEL ...] [--rounds 15]
    .venv/bin/python experiments/in_model_gap.py WORK_DIR KERNEL ... --beside OTHER_WORK_DIR

WORK_DIR is a work dir (its model.so and tuning.db), KERNEL a task's name as the per-kernel table names it
(``fused_matmul4_add31``); a work dir of ``trials=0`` has no record: "recorded" and "alone now" are left out.
With ``--beside``, the same kernels (same names) are also called inside another model's build, in the same
rounds: where a kernel reads alike in both here but not in the two runs' profiles, what differed was the machine
while each run profiled its model, not the model. Where "alone now" is far from "recorded", the machine ran the
same library at another speed when it was tuned (a VM's neighbours): that part of the gap is the machine's, not
the model's. "after the model" against "in the model, again" is what the rest of the model does to the kernel's
data in the caches.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common.host import cpu_model  # noqa: E402
from experiments.harness import markdown_table  # noqa: E402

_COLUMNS = ["kernel", "recorded (us)", "alone now (us)", "in the model, again", "after the model", "flushed"]
_BESIDE = ["in the other model, again", "after the other model"]
AGAIN_CALLS = 10


def _calls(model, inputs) -> list[tuple[str, object, list]]:
    """Every kernel call of one inference: (symbol, function, arguments), the model's own buffers."""
    calls = []

    def instrument(func, symbol, before_run, ret_value, *args):
        if before_run and not symbol.startswith("vm."):
            calls.append((symbol, func, list(args)))
        return 0

    model._vm.set_instrument(instrument)
    try:
        model(*inputs)
    finally:
        model._vm.set_instrument(None)
    return calls


def _alone(work_dir: Path, kernel: str, out_dir: Path) -> tuple[float, callable] | None:
    """The kernel's recorded latency, and a function that times its library as the tuning does; None where
    the work dir recorded nothing for it (a ``trials=0`` run)."""
    from codegen.build import build_kernel
    from measure.workers.run_job import time_kernel
    from tuner.database.database import TuningDatabase
    from tuner.spaces.metaschedule import schedule_from_json

    db = TuningDatabase(work_dir / "tuning.db", read_only=True)
    try:
        ids = [k for k in db.kernel_ids() if db.kernel_name(k) == kernel]
        if not ids:
            raise SystemExit(f"in_model_gap: {work_dir} has no kernel named {kernel}: see its per-kernel table")
        targets = db.targets()
        best = db.best(ids[0], targets[0]) if targets else []
        if not best:
            return None
        record = db.best_verified(ids[0], targets[0]) or best[0]
        mod = schedule_from_json(db.kernel_mod(ids[0]), record.trace).mod
    finally:
        db.close()
    library = str(out_dir / f"{kernel}.so")
    args = build_kernel(mod, record.target, library)["args"]
    return record.latency, lambda: statistics.median(time_kernel(library, args, "cpu", {})["samples"])


def _instrumented(work_dir: Path) -> tuple[object, list, list]:
    """The compiled model of ``work_dir``, random inputs, and the calls of one inference on them."""
    import tuner
    from measure.workers.run_job import random_arrays

    model = tuner.load(work_dir / "model.so")
    inputs = random_arrays([[spec.dtype, list(spec.shape)] for spec in model.inputs])
    return model, inputs, _calls(model, inputs)


def _middle_call(calls: list, kernel: str, work_dir: Path) -> tuple[object, list]:
    own = [c for c in calls if c[0] in (kernel, f"{kernel}_prepacked")]
    if not own:
        raise SystemExit(f"in_model_gap: the model of {work_dir} never calls {kernel}")
    _, func, func_args = own[len(own) // 2]
    return func, func_args


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("work_dir", type=Path)
    parser.add_argument("kernels", nargs="+")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--flush-mb", type=int, default=512, help="bytes written to push the kernel's data out")
    parser.add_argument("--beside", type=Path, help="another model's work dir calling kernels of the same names")
    args = parser.parse_args(argv)

    model, inputs, calls = _instrumented(args.work_dir)
    other = _instrumented(args.beside) if args.beside else None
    flush = np.ones(args.flush_mb * 1024 * 256, dtype=np.float32)

    def timed(func, func_args) -> float:
        start = time.perf_counter()
        func(*func_args)
        return time.perf_counter() - start

    def again(func, func_args) -> float:
        """Called back to back, the first call's warm-up left out. One call between the round's other ways (a
        time_kernel, a flush) read RegNet's convolutions at 1.15-1.32x their library alone; so, 0.93-1.02x."""
        func(*func_args)
        return statistics.median(timed(func, func_args) for _ in range(AGAIN_CALLS))

    rows = []
    with tempfile.TemporaryDirectory() as out_dir:
        for kernel in args.kernels:
            func, func_args = _middle_call(calls, kernel, args.work_dir)
            alone = _alone(args.work_dir, kernel, Path(out_dir))
            ways = {"alone now (us)": alone[1]} if alone else {}
            ways |= {
                "in the model, again": lambda f=func, a=func_args: again(f, a),
                "after the model": lambda f=func, a=func_args: (model(*inputs), timed(f, a))[1],
            }
            if other:  # before the flush, whose 512 MB would leave the other model's call cold
                other_model, other_inputs, other_calls = other
                f2, a2 = _middle_call(other_calls, kernel, args.beside)
                ways[_BESIDE[0]] = lambda f=f2, a=a2: again(f, a)
                ways[_BESIDE[1]] = lambda f=f2, a=a2, m=other_model, i=other_inputs: (m(*i), timed(f, a))[1]
            ways["flushed"] = lambda f=func, a=func_args: (flush.__iadd__(1.0), timed(f, a))[1]
            samples = {way: [] for way in ways}
            for _ in range(args.rounds):
                for way, run in ways.items():
                    samples[way].append(run())
            row = {"kernel": kernel, "recorded (us)": f"{alone[0] * 1e6:.1f}" if alone else "-"}
            row |= {way: f"{statistics.median(s) * 1e6:.1f}" for way, s in samples.items()}
            rows.append(row)
    print(f"CPU: {cpu_model()}; medians of {args.rounds} interleaved rounds\n")
    columns = _COLUMNS[:-1] + (_BESIDE if other else []) + _COLUMNS[-1:]  # in the order they run
    print(markdown_table([{c: row.get(c, "-") for c in columns} for row in rows], columns))


if __name__ == "__main__":
    main()
