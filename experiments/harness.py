"""Helpers shared by the experiment scripts: running a step in a fresh process, timing compiled
artifacts side by side, and writing CSV / markdown tables."""

from __future__ import annotations

import csv
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def host_cpu() -> str:
    """This CPU as a figure's label: its model name and LLVM's name for its core ("AMD EPYC (znver3)"),
    since one model name covers several generations."""
    import tvm

    from common.host import cpu_model

    return f"{cpu_model()} ({tvm.target.codegen.llvm_get_system_cpu()})"


def prepare_comparison(out_dir: str, target_spec: str):
    """Create the output folder and resolve the target; on a CPU, pin TVM's thread pool to the
    target's cores (it defaults to fewer on some machines), for the tuners and the final timing alike."""
    import os

    from tuner.targets import resolve_target

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    target = resolve_target(target_spec)
    if target.kind.name == "llvm":
        os.environ["TVM_NUM_THREADS"] = str(int(target.attrs["num-cores"]))
    return out, target


def step_args(*leading: str, target: str, trials: int, work_dir: Path, seed: int) -> list[str]:
    """The command line of a tuning step (``leading`` first), for ``run_step``."""
    return [*leading, "--target", target, "--trials", str(trials), "--work-dir", str(work_dir), "--seed", str(seed)]


def run_step(script: Path, args: Sequence[str], log: Path, timeout: float | None = None) -> dict:
    """Run ``script --step ...`` in a fresh Python process; it prints one JSON line last. Past
    ``timeout`` seconds the process is killed (subprocess.TimeoutExpired)."""
    started = time.monotonic()
    with open(log, "w") as out:
        command = [sys.executable, str(script), *args]
        proc = subprocess.run(command, stdout=subprocess.PIPE, stderr=out, text=True, cwd=ROOT, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{script.name} {' '.join(args)} failed (exit {proc.returncode}); see {log}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["process_seconds"] = time.monotonic() - started
    return result


def time_side_by_side(
    artifacts: dict[str, str],
    kind: str,
    args: list,
    device: str,
    log: Path,
    processes: int = 3,
    timeout: float | None = None,
) -> dict[str, float]:
    """Time two artifacts ("ours" and "stock") in ``processes`` fresh processes, alternating
    between them within each. On a shared machine the speed of a whole process varies more than
    the differences measured, so the ratio is taken within each process and the median over
    processes is reported. A process past ``timeout`` seconds is killed (subprocess.TimeoutExpired)."""
    request = json.dumps({"artifacts": artifacts, "kind": kind, "args": args, "device": device})
    per_process = []
    for _ in range(processes):
        with open(log, "a") as err:
            out = subprocess.run(
                [sys.executable, __file__, request],
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
                cwd=ROOT,
                check=True,
                timeout=timeout,
            )
        per_process.append(json.loads(out.stdout.strip().splitlines()[-1]))
    result = {name: statistics.median(p[name] for p in per_process) for name in artifacts}
    result["ratio"] = statistics.median(p["ours"] / p["stock"] for p in per_process)
    return result


def time_artifacts_interleaved(
    artifacts: dict[str, str], kind: str, args: list, device: str, rounds: int = 8
) -> dict[str, float]:
    """Median seconds per run of each artifact, timed in alternating rounds in one process so
    that drift of the machine affects all of them alike."""
    import tvm

    from common.model_weights import load_weights
    from measure.workers.run_job import random_arrays

    if device == "cuda":
        from measure.cuda.runtime import runtime_problem

        problem = runtime_problem()  # `import tvm` alone may miss the CUDA runtime: loaded on purpose
        if problem:
            raise RuntimeError(problem)
    dev = tvm.cuda(0) if device == "cuda" else tvm.cpu(0)
    tensors = [tvm.runtime.tensor(a, dev) for a in random_arrays(args)]
    evaluators = {}
    for name, path in artifacts.items():
        lib = tvm.runtime.load_module(path)
        if kind == "relax":
            from tvm.runtime.vm import VirtualMachine

            vm = VirtualMachine(lib, dev)
            evaluator = vm.time_evaluator("main", dev, number=1, repeat=5, min_repeat_ms=50)
            evaluators[name] = (vm, evaluator, tensors + load_weights(path, dev))
        else:
            evaluator = lib.time_evaluator(lib.entry_name, dev, number=1, repeat=5, min_repeat_ms=50)
            evaluators[name] = (lib, evaluator, tensors)
    samples: dict[str, list[float]] = {name: [] for name in artifacts}
    for _ in range(rounds):
        for name, (_, evaluator, arguments) in evaluators.items():
            evaluator(*arguments)  # warm-up round
            samples[name] += list(evaluator(*arguments).results)
    return {name: statistics.median(values) for name, values in samples.items()}


def write_csv(path: Path, rows: list[dict]) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def markdown_table(rows: list[dict], columns: Sequence[str]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        lines.append("| " + " | ".join(str(row[c]) for c in columns) + " |")
    return "\n".join(lines)


def write_results(out: Path, stem: str, summary: str, record: dict) -> None:
    """An experiment's markdown summary and its JSON record, as OUT/STEM.md and OUT/STEM.json (replacing a
    previous run's)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.md").write_text(summary)
    (out / f"{stem}.json").write_text(json.dumps(record, indent=1) + "\n")


def sample_candidates(name: str, target, count: int, seed: int) -> list:
    """``count`` distinct schedules of a built-in workload, sampled from its design space."""
    from costmodel import CandidateFeatures, CostModel
    from measure import MeasureInput
    from tuner.search.task_search import TaskSearch
    from workloads import get_workload

    search = TaskSearch(
        get_workload(name).mod, target, seed=seed, cost_model=CostModel(), features=CandidateFeatures(), group=name
    )
    return [MeasureInput(f"{name}/{c.key}", c.mod) for c in search.propose(count)]


if __name__ == "__main__":  # one timing process of time_side_by_side
    sys.path.insert(0, str(ROOT))
    spec = json.loads(sys.argv[1])
    print(json.dumps(time_artifacts_interleaved(spec["artifacts"], spec["kind"], spec["args"], spec["device"])))
