"""CUDA candidates built per second on this CPU, with nvcc and with NVRTC.

    .venv/bin/python experiments/cuda_builds.py
    .venv/bin/python experiments/cuda_builds.py --candidates 4 --rounds 1 --workloads matmul-128   # a smoke run

Per workload (default: matmul-1024 in fp32, Llama-2-7B's q_proj in fp16 with tensor cores, a ResNet-50
3x3 convolution), the real search proposes N candidates for ``cuda -arch=sm_90`` once (a tuning run's
first round); each compile mode available here then builds the same candidates with the project's
engine (``MeasureEngine.build``, 2 build workers, the candidates' task as the builds' group): nvcc;
NVRTC as the tuner uses it (its sources without the libcu++ type traits they do not use,
``measure/cuda/nvrtc_source.py``); and NVRTC on TVM's sources as they are (``nvrtc-tvm``). The mode is
forced by ``TVM_CUDA_COMPILE_MODE`` (and ``TENSOR_TUNER_LEAN_NVRTC=0``) and checked in every build
worker's log. Each mode has its engine for the
whole run; per workload, each engine first builds one candidate per worker, untimed (the first build
of a worker imports TVM, the first of a workload may import tensor intrinsics). Modes alternate in
rounds (nvcc, nvrtc, nvrtc-tvm, then the reverse, ...) so that drift of the machine reaches all alike; a round
builds all N candidates of a workload. Reported per workload and mode: candidates per second (N over
the wall time of the round's builds, failures included; the median over rounds), the median build
seconds of one candidate (the worker's own count), and the failures with their errors. Results:
OUT/cuda_builds.md and OUT/cuda_builds.json (a new run replaces them). On a host without a GPU the
builds use the stand-in driver of ``measure/cuda/compile_env.py``; they are real sm_90 cubins.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common.environment import environment  # noqa: E402
from common.host import cpu_model  # noqa: E402
from experiments.harness import markdown_table, sample_candidates, write_results  # noqa: E402
from measure import EngineConfig, MeasureEngine, MeasureInput  # noqa: E402
from measure.cuda.compile_env import (  # noqa: E402
    COMPILE_MODE_ENV,
    NVRTC_INSTALL,
    nvcc_path,
    nvcc_version,
    nvrtc_available,
    nvrtc_version,
)
from measure.cuda.nvrtc_source import LEAN_ENV, LEAN_SOURCES  # noqa: E402

TARGET = "cuda -arch=sm_90"
NVRTC_AS_TVM = "nvrtc-tvm"  # NVRTC compiling TVM's sources as they are (with the type traits they do not use)
WORKLOADS = ("matmul-1024", "matmul-llama2-7b-qproj-fp16", "conv2d-resnet50-l3")
COLUMNS = ("workload", "mode", "candidates", "rounds", "cand/s", "vs nvcc", "median build s", "failures", "errors")


# Each mode's environment: nvcc; NVRTC as the tuner uses it; NVRTC on TVM's sources as they are
MODES = {
    "nvcc": {COMPILE_MODE_ENV: "nvcc"},
    "nvrtc": {COMPILE_MODE_ENV: "nvrtc"},
    NVRTC_AS_TVM: {COMPILE_MODE_ENV: "nvrtc", LEAN_ENV: "0"},
}


def available_modes() -> list[str]:
    """The compile modes this host has, nvcc first."""
    here = {"nvcc": nvcc_path() is not None, "nvrtc": nvrtc_available()}
    return [mode for mode, env in MODES.items() if here[env[COMPILE_MODE_ENV]]]


def describe_run(command: str, workers: int) -> dict:
    """Where and how the builds ran: the command, the date, the CPU, the compilers' versions."""
    nvcc = nvcc_path()
    return {
        "command": command,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "workers": workers,
        "compilers": {"nvcc": nvcc_version(nvcc) if nvcc else None, "nvrtc": nvrtc_version()},
    }


def check_workers_mode(engine: MeasureEngine, mode: str, workers: int) -> None:
    """Every build worker's log says it compiled as ``mode`` does (the lines measure.workers.main writes)."""
    compiler, lean = MODES[mode][COMPILE_MODE_ENV], mode == "nvrtc"
    for i in range(workers):
        log = engine.log_dir / f"builder-{i}.log"
        text = log.read_text() if log.exists() else ""
        if f"CUDA compile mode: {compiler} " not in text or (f"NVRTC sources: {LEAN_SOURCES}" in text) != lean:
            raise RuntimeError(f"{log} does not say the worker compiled as {mode} does:\n{text[-2000:]}")


def round_order(modes: Sequence[str], rounds: int) -> list[list[str]]:
    """The modes of each round: in order, then reversed, and so on (a, b, c, c, b, a, ...)."""
    return [list(modes) if r % 2 == 0 else list(reversed(modes)) for r in range(rounds)]


def timed_build(engine: MeasureEngine, inputs: list[MeasureInput], group: str) -> tuple[float, list]:
    """Seconds to build ``inputs`` (candidates of one task, ``group``: the builds' timeout follows theirs,
    as in a tuning run), and their results (their libraries deleted)."""
    started = time.monotonic()
    built = list(engine.build(inputs, group=group))
    seconds = time.monotonic() - started
    for result in built:
        if result.artifact:
            Path(result.artifact).unlink(missing_ok=True)
    return seconds, built


def measure_builds(
    workloads: Sequence[str],
    modes: Sequence[str],
    candidates: int,
    rounds: int,
    work_dir: Path,
    workers: int = 2,
    seed: int = 1,
) -> list[dict]:
    """One row per workload and mode (see the module's docstring); each row also keeps its raw
    samples and the engine's note on its compile path."""
    from tuner.targets import resolve_target

    target = resolve_target(TARGET)
    engines = {}
    for mode in modes:
        with environment(MODES[mode]):  # the engine hands these to its build workers
            config = EngineConfig(build_workers=workers, remember_dop=False)
            engines[mode] = MeasureEngine(target, work_dir / mode, config)  # never started: no measuring workers
    rows = []
    try:
        for name in workloads:
            inputs = sample_candidates(name, target, candidates, seed)
            print(f"{name}: {len(inputs)} candidates proposed", flush=True)
            for mode, engine in engines.items():
                timed_build(engine, inputs[:workers], name)  # warm-up, untimed
                check_workers_mode(engine, mode, min(workers, len(inputs)))
            samples: dict[str, list[tuple[float, list]]] = {mode: [] for mode in modes}
            for order in round_order(modes, rounds):
                for mode in order:
                    samples[mode].append(timed_build(engines[mode], inputs, name))
                    print(f"  {mode}: {len(inputs) / samples[mode][-1][0]:.2f} cand/s", flush=True)
            rows += [_row(name, mode, samples[mode], engines[mode]) for mode in modes]
    finally:
        for engine in engines.values():
            engine.close()
    by_workload = {(row["workload"], row["mode"]): row for row in rows}
    for row in rows:
        nvcc = by_workload.get((row["workload"], "nvcc"))
        row["vs nvcc"] = round(row["cand/s"] / nvcc["cand/s"], 2) if nvcc and nvcc["cand/s"] else "-"
    return rows


def _row(workload: str, mode: str, samples: list[tuple[float, list]], engine: MeasureEngine) -> dict:
    count = len(samples[0][1])
    built = [b for _, batch in samples for b in batch]
    failed = [b for b in built if not b.ok]
    errors = Counter((b.error or b.status).strip().splitlines()[-1][:200] for b in failed)
    build_seconds = [b.seconds for b in built if b.ok]
    return {
        "workload": workload,
        "mode": mode,
        "candidates": count,
        "rounds": len(samples),
        "cand/s": round(statistics.median(count / seconds for seconds, _ in samples), 2),
        "median build s": round(statistics.median(build_seconds), 3) if build_seconds else "-",
        "failures": f"{len({b.key for b in failed})} of {count}",
        "errors": "; ".join(f"{n}x {text}" for text, n in errors.items()) or "-",
        "round_seconds": [round(seconds, 3) for seconds, _ in samples],
        "compile_path": next((note for note in engine.notes if note.startswith("CUDA compile")), None),
    }


def report(rows: list[dict], meta: dict) -> str:
    """The markdown summary: what was measured where, and the table."""
    versions = ", ".join(f"{mode} {version or 'absent'}" for mode, version in meta["compilers"].items())
    lines = [
        "# CUDA builds per second",
        "",
        f"`{meta['command']}`, {meta['date']}. CPU: {meta['cpu']} ({meta['cores']} cores), "
        f"{meta['workers']} build workers; target `{TARGET}`; compilers: {versions}.",
        "",
        "cand/s: candidates over the wall time of a round's builds (failures included), median over rounds; "
        "median build s: one candidate's build in its worker; vs nvcc: cand/s over nvcc's. nvrtc: NVRTC as the "
        "tuner uses it (sources without the libcu++ type traits they do not use); nvrtc-tvm: NVRTC on TVM's "
        "sources as they are.",
        "",
        markdown_table(rows, COLUMNS),
        "",
        *(f"- {row['workload']}, {row['mode']}: {row['compile_path']}" for row in rows),
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS))
    parser.add_argument("--candidates", type=int, default=32, help="per workload")
    parser.add_argument("--rounds", type=int, default=2, help="builds of every candidate per mode")
    parser.add_argument("--modes", nargs="+", choices=list(MODES), help="default: those available here")
    parser.add_argument("--workers", type=int, default=2, help="build workers")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("experiments/results/cuda_builds"))
    args = parser.parse_args()

    modes = args.modes or available_modes()
    if not modes:
        sys.exit(f"neither nvcc nor NVRTC is installed here: install the CUDA toolkit, or {NVRTC_INSTALL}")
    with tempfile.TemporaryDirectory(prefix="cuda-builds-") as scratch:
        rows = measure_builds(
            args.workloads, modes, args.candidates, args.rounds, Path(scratch), args.workers, args.seed
        )
    meta = describe_run(" ".join(["experiments/cuda_builds.py", *sys.argv[1:]]), args.workers)
    summary = report(rows, meta)
    print(summary)
    write_results(args.out, "cuda_builds", summary, {**meta, "rows": rows})


if __name__ == "__main__":
    main()
