"""GPU candidates the search proposes per second on this CPU: MetaSchedule's own draw of a fresh sample
against the draw within the GPU's limits (tuner/spaces/gpu_tiles.py).

    .venv/bin/python experiments/gpu_search.py
    .venv/bin/python experiments/gpu_search.py --workloads matmul-128 --batches 1 --rounds 1   # a smoke run

Per workload (default: matmul-1024, a ResNet-50 3x3 convolution, ResNet-50's classifier at batch 1 and a
MobileNetV2 depthwise convolution in fp32; Llama-2-7B's q_proj and the ResNet-50 convolution in fp16, on
tensor cores), the project's search (``TaskSearch``, the tuner's thread pool) proposes
BATCHES batches of 16 candidates for ``cuda -arch=sm_90`` with nothing measured yet: every candidate a
fresh sample, as in a tuning run's first batch, each one verified by MetaSchedule's postprocessors. The
two draws alternate in rounds (own, within, then within, own, ...), each round a new search with its own
seed. Reported: candidates per second (median over rounds), draws per candidate, and the ratio of the
two; and what that rate makes of a later batch's fresh samples: once the cost model is trained, a batch
of 16 picks its 8 fresh candidates from a pool of 128 fresh samples, at least half of them drawn anew
(64-128 samples at the measured rate). Then mutants: the within-limits candidates mutated as the search
mutates them (MetaSchedule's mutators in their proportions), each mutant replayed and verified with and
without the early check of its tiles (``gpu_tiles.checking``), same mutants both ways. Results: OUT/gpu_search.md and
OUT/gpu_search.json (a new run replaces them). Nothing here needs a GPU: design spaces, sampling and
MetaSchedule's GPU verifier all run on the CPU.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common.environment import environment  # noqa: E402
from common.host import cpu_model  # noqa: E402
from costmodel import CandidateFeatures, CostModel  # noqa: E402
from experiments.harness import markdown_table, write_results  # noqa: E402
from tuner.search.parallel import THREADS  # noqa: E402
from tuner.search.task_search import SearchConfig, TaskSearch  # noqa: E402
from tuner.spaces import metaschedule as msc  # noqa: E402
from tuner.spaces.gpu_tiles import DISABLE_ENV, checking, gpu_limits  # noqa: E402
from tuner.targets import resolve_target  # noqa: E402
from workloads import get_workload  # noqa: E402

TARGET = "cuda -arch=sm_90"
WORKLOADS = (
    "matmul-1024",
    "conv2d-resnet50-l3",
    "dense-resnet50-fc",
    "depthwise-conv2d-mobilenetv2-b16",
    "matmul-llama2-7b-qproj-fp16",
    "conv2d-resnet50-l3-fp16",
)
BATCH = 16
DRAWS = {"own": "0", "within": "1"}  # DISABLE_ENV's value for each draw
POOL = (BATCH // 2 * SearchConfig().fresh_per_pick // 2, BATCH // 2 * SearchConfig().fresh_per_pick)  # drawn anew
COLUMNS = (
    "workload",
    "draw",
    "candidates",
    "rounds",
    "cand/s",
    "vs own",
    "draws/cand",
    "later batch's pool, s",
    "mutants valid",
    "mutants/s",
)


def propose(name: str, draw: str, batches: int, seed: int) -> tuple[float, int, list]:
    """Seconds to propose ``batches`` batches with ``draw``, the draws it took, and the candidates."""
    with environment({DISABLE_ENV: DRAWS[draw]}):
        search = TaskSearch(
            get_workload(name).mod, resolve_target(TARGET), seed, CostModel(), CandidateFeatures(), group=name
        )
        started = time.perf_counter()
        candidates = [c for _ in range(batches) for c in search.propose(BATCH)]
        return time.perf_counter() - started, search.draws, candidates


def mutate(name: str, parents: list, count: int, seed: int) -> dict[str, tuple[float, int]]:
    """The same ``count`` mutants of ``parents`` replayed with and without the early check: seconds, valid."""
    target = resolve_target(TARGET)
    mod = get_workload(name).mod
    context = msc.make_context(mod, target, seed)
    postprocs = msc.postprocessors(context)
    mutators, probs = msc.mutators(context)
    if not parents or not mutators:
        return {}
    rng = np.random.default_rng(seed)
    weights = np.asarray(probs) / sum(probs)
    traces = []
    for _ in range(count):
        parent = parents[int(rng.integers(len(parents)))]
        mutator = mutators[int(rng.choice(len(mutators), p=weights))]
        traces.append(msc.mutate(mutator, parent.schedule.trace, int(rng.integers(1, msc.MAX_SEED))))
    limits = gpu_limits(target)
    results = {}
    for label, check in (("unchecked", False), ("checked", True)):
        started, valid = time.perf_counter(), 0
        for replay_seed, trace in enumerate(traces, 1):
            if trace is not None:
                decide = checking(trace, limits, replay_seed) if check else None
                valid += msc.replay(mod, trace, replay_seed, postprocs, decide=decide) is not None
        results[label] = (time.perf_counter() - started, valid)
    return results


def measure(workloads: list[str], batches: int, rounds: int, mutants: int, seed: int) -> list[dict]:
    rows = []
    for name in workloads:
        samples: dict[str, list[tuple[float, int, int]]] = {draw: [] for draw in DRAWS}
        parents = []
        for r in range(rounds):
            for draw in list(DRAWS) if r % 2 == 0 else list(reversed(DRAWS)):
                seconds, draws, candidates = propose(name, draw, batches, seed + r)
                samples[draw].append((seconds, draws, len(candidates)))
                parents = candidates if draw == "within" else parents
                print(f"[{name}] {draw}: {len(candidates)} candidates in {seconds:.1f} s, {draws} draws", flush=True)
        replays = mutate(name, parents, mutants, seed)
        rate = {draw: statistics.median(n / s for s, _, n in runs) for draw, runs in samples.items()}
        for draw, runs in samples.items():
            replay = replays.get("checked" if draw == "within" else "unchecked")
            rows.append(
                {
                    "workload": name,
                    "draw": draw,
                    "candidates": runs[0][2],
                    "rounds": len(runs),
                    "cand/s": round(rate[draw], 2),
                    "vs own": round(rate[draw] / rate["own"], 2),
                    "draws/cand": round(sum(d for _, d, _ in runs) / sum(n for _, _, n in runs), 1),
                    "later batch's pool, s": "-".join(f"{count / rate[draw]:.1f}" for count in POOL),
                    "mutants valid": f"{replay[1]} of {mutants}" if replay else "-",
                    "mutants/s": round(mutants / replay[0], 1) if replay else "-",
                    "samples": [{"seconds": round(s, 3), "draws": d, "candidates": n} for s, d, n in runs],
                }
            )
    return rows


def report(rows: list[dict], meta: dict) -> str:
    lines = [
        "# GPU candidates proposed per second",
        "",
        f"`{meta['command']}`, {meta['date']}. CPU: {meta['cpu']} ({meta['cores']} cores, {meta['threads']} "
        f"search threads); target `{TARGET}`; {meta['batches']} batches of {BATCH}, nothing measured.",
        "",
        "draw: own = MetaSchedule's draw of each fresh sample, within = the tiles drawn within the GPU's "
        "thread and shared-memory limits. cand/s: verified candidates proposed per second, median over "
        "rounds; draws/cand: samples drawn per candidate proposed; later batch's pool: seconds to draw the "
        f"{POOL[0]}-{POOL[1]} fresh samples a trained model's batch picks its fresh candidates from, at that "
        "rate; mutants: the within-limits candidates "
        "mutated, each mutant replayed and verified (own: as MetaSchedule does; within: its tiles checked "
        "first), valid of those made and replayed per second.",
        "",
        markdown_table(rows, COLUMNS),
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS))
    parser.add_argument("--batches", type=int, default=4, help=f"batches of {BATCH} proposed per round")
    parser.add_argument("--rounds", type=int, default=2, help="searches per draw")
    parser.add_argument("--mutants", type=int, default=128)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("experiments/results/gpu_search"))
    args = parser.parse_args()

    rows = measure(args.workloads, args.batches, args.rounds, args.mutants, args.seed)
    meta = {
        "command": " ".join(["experiments/gpu_search.py", *sys.argv[1:]]),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "threads": THREADS,
        "batches": args.batches,
    }
    summary = report(rows, meta)
    print(summary)
    write_results(args.out, "gpu_search", summary, {**meta, "rows": rows})


if __name__ == "__main__":
    main()
