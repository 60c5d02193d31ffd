"""Scale-out: build throughput against the number of build workers, on this machine's process
pool and on Ray, and measurement throughput of the Ray path against the local one.

The same sampled schedules are built by
  (a) the local engine with W build processes, and
  (b) a private Ray instance with W CPUs (build tasks, one per CPU),
for W = 1, 2, 4, ... up to the cores; each is warmed up first (workers import TVM once). Then the
same candidates are built and timed end to end by the local engine and by the Ray path (measuring
actors on this machine's GPUs, or one per host on a CPU). Prints a table of candidates per second
with the speed-up over one worker and the Ray/local ratio; writes CSV and markdown.

    python experiments/scaling.py                      # this CPU, 32 candidates
    python experiments/scaling.py --target cuda        # on a GPU machine: measurement on the GPUs too
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common.target_kind import is_cuda  # noqa: E402
from experiments.harness import markdown_table, sample_candidates, write_csv  # noqa: E402
from measure import EngineConfig, MeasureEngine, MeasureInput  # noqa: E402
from measure.cluster.engine import ClusterEngine, ClusterOptions  # noqa: E402

os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # a private instance on this machine: no token file in ~/.ray


def worker_counts(cores: int) -> list[int]:
    counts, count = [], 1
    while count < cores:
        counts.append(count)
        count *= 2
    return counts + [cores]


def rate(count: int, seconds: float) -> float:
    return round(count / seconds, 2)


def local_builds(target, inputs: list[MeasureInput], workers: int, work_dir: Path) -> float:
    with MeasureEngine(target, work_dir, EngineConfig(build_workers=workers)) as engine:
        list(engine.build(inputs[:workers]))  # warm-up: every worker has imported TVM and built once
        started = time.monotonic()
        built = list(engine.build(inputs))
        return time.monotonic() - started if all(b.ok for b in built) else float("nan")


def ray_builds(target, inputs: list[MeasureInput], workers: int, work_dir: Path, gpus: int) -> float:
    with ClusterEngine(target, work_dir, ClusterOptions("local", local_cpus=workers, local_gpus=gpus)) as engine:
        engine.build(inputs[:workers])
        started = time.monotonic()
        built = engine.build(inputs)
        return time.monotonic() - started if all(b.ok for b, _ in built) else float("nan")


def end_to_end(engine, inputs: list[MeasureInput]) -> tuple[float, int]:
    list(engine.measure(inputs[:2], group="warm-up"))
    started = time.monotonic()
    ok = sum(r.ok for r in engine.measure(inputs, group="scaling"))
    return time.monotonic() - started, ok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="llvm")
    parser.add_argument("--workload", default="conv2d-resnet18-l2")
    parser.add_argument("--candidates", type=int, default=32)
    parser.add_argument("--workers", type=int, nargs="*", help="build worker counts (default: 1, 2, 4, ... cores)")
    parser.add_argument("--out", type=Path, default=Path("experiments/results/scaling"))
    args = parser.parse_args()

    from tuner.targets import resolve_target

    target = resolve_target(args.target)
    gpus = _gpu_count() if is_cuda(target) else 0
    inputs = sample_candidates(args.workload, target, args.candidates, seed=1)
    scratch = Path(tempfile.mkdtemp(prefix="scaling-"))
    rows = []
    for workers in args.workers or worker_counts(os.cpu_count() or 1):
        local = local_builds(target, inputs, workers, scratch / f"local-{workers}")
        ray = ray_builds(target, inputs, workers, scratch / f"ray-{workers}", gpus)
        rows.append(
            {
                "stage": "build",
                "workers": workers,
                "local cand/s": rate(len(inputs), local),
                "ray cand/s": rate(len(inputs), ray),
            }
        )
        print(rows[-1], flush=True)
    for row in rows:
        row["local speed-up"] = round(row["local cand/s"] / rows[0]["local cand/s"], 2)
        row["ray speed-up"] = round(row["ray cand/s"] / rows[0]["ray cand/s"], 2)
        row["ray/local"] = round(row["ray cand/s"] / row["local cand/s"], 2)

    with MeasureEngine(target, scratch / "local-e2e") as engine:
        local_seconds, local_ok = end_to_end(engine, inputs)
    with ClusterEngine(target, scratch / "ray-e2e", ClusterOptions("local", local_gpus=gpus)) as engine:
        ray_seconds, ray_ok = end_to_end(engine, inputs)
        measurers = len(engine.measurers())
    measure_row = {
        "stage": f"build + measure ({measurers} measuring actor(s))",
        "workers": os.cpu_count(),
        "local cand/s": rate(local_ok, local_seconds),
        "ray cand/s": rate(ray_ok, ray_seconds),
        "local speed-up": "",
        "ray speed-up": "",
        "ray/local": round(rate(ray_ok, ray_seconds) / rate(local_ok, local_seconds), 2),
    }
    rows.append(measure_row)

    columns = ["stage", "workers", "local cand/s", "ray cand/s", "local speed-up", "ray speed-up", "ray/local"]
    table = markdown_table(rows, columns)
    summary = (
        f"{len(inputs)} schedules of {args.workload} on {target.kind.name} ({os.cpu_count()} cores, {gpus} GPU(s)); "
        "candidates per second, after a warm-up; speed-ups are against one worker of the same path."
    )
    print(summary + "\n\n" + table)
    args.out.mkdir(parents=True, exist_ok=True)
    write_csv(args.out / "scaling.csv", rows)
    (args.out / "scaling.md").write_text(summary + "\n\n" + table + "\n")


def _gpu_count() -> int:
    from measure.nvml import NvmlMonitor

    monitor = NvmlMonitor()
    try:
        return len(monitor.device_names()) if monitor.available else 0
    finally:
        monitor.close()


if __name__ == "__main__":
    main()
