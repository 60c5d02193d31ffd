"""How costly it is, right now, for this machine's threads to share data, and what that does to a
compiled model and to ONNX Runtime, kernel by kernel.

On a shared VM the hypervisor moves the vCPUs between physical cores: for minutes at a time the two
threads of a tuned model can sit where handing data from one to the other costs twice as much (on
this 2-vCPU VM, TVM's fork-join of a tiny parallel loop takes 0.75 us in one placement and 1.5 us in
the other). A kernel whose stages pass data between threads (a Winograd convolution's transforms
and batched GEMM) slows down far more than one that keeps each thread on its own data.

This script alternates, for a while, a fork-join probe, the compiled model, ONNX Runtime on the same
input, and a per-kernel profile of the model; then splits the rounds by the probe into the two
placements and prints both side by side, kernel by kernel:

    .venv/bin/python experiments/cross_core.py MODEL.so [OTHER.so ...] [--onnx MODEL.onnx] [--minutes 8]

Several models (the same network compiled two ways) are timed in each round, in the same placement;
the kernel profile is the first one's.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

_CALLS = 2000  # fork-joins per probe sample


def fork_join_probe(threads: int) -> Callable[[], float]:
    """A function that returns the microseconds one fork-join of TVM's thread pool takes now (best of
    three samples of a parallel loop with one iteration per thread and almost no work)."""
    import tvm
    from tvm import te

    os.environ.setdefault("TVM_NUM_THREADS", str(threads))
    a = te.placeholder((threads, 16), "float32", name="a")
    b = te.compute((threads, 16), lambda i, j: a[i, j] + 1.0, name="b")
    func = te.create_prim_func([a, b]).with_attr("global_symbol", "probe")
    sch = tvm.s_tir.Schedule(func)
    sch.parallel(sch.get_loops(sch.get_sblock("b"))[0])
    library = tvm.compile(sch.mod, target="llvm").mod
    args = [tvm.runtime.tensor(np.zeros((threads, 16), "float32")) for _ in range(2)]
    timer = library.time_evaluator("probe", tvm.cpu(), number=_CALLS, repeat=3)
    return lambda: min(timer(*args).results) * 1e6


def placement_threshold(probe_values: list[float]) -> float | None:
    """The probe value that separates two placements, or None when the values form one group (the
    slowest within 1.5x of the fastest)."""
    low, high = min(probe_values), max(probe_values)
    return (low * high) ** 0.5 if high > 1.5 * low else None


def _onnx_session(path: Path, threads: int) -> Callable[[np.ndarray], object]:
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    return lambda x: session.run(None, {name: x})


def main() -> None:
    import tuner
    from experiments.frameworks import Contender, time_interleaved

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+", help="compiled models of one network (.so with its .json beside it)")
    parser.add_argument("--onnx", help="the same model as ONNX, timed beside it")
    parser.add_argument("--minutes", type=float, default=8.0, help="stop after this long (default 8)")
    parser.add_argument("--rounds-per-placement", type=int, default=15, help="stop once both have this many")
    args = parser.parse_args()

    models = [tuner.load(path) for path in args.models]
    model = models[0]
    threads = int(os.environ["TVM_NUM_THREADS"]) if os.environ.get("TVM_NUM_THREADS") else (os.cpu_count() or 1)
    spec = model.inputs[0]
    x = np.random.default_rng(0).random(spec.shape, dtype=np.float32).astype(spec.dtype)
    contenders = [Contender(path, lambda m=m: m(x)) for path, m in zip(args.models, models, strict=True)]
    if args.onnx:
        onnx = _onnx_session(Path(args.onnx), threads)
        contenders.append(Contender("ONNX Runtime", lambda: onnx(x)))
    probe = fork_join_probe(threads)
    rounds: list[dict] = []
    deadline = time.time() + args.minutes * 60
    while time.time() < deadline:
        probed = probe()
        time_interleaved(contenders, rounds=1, seconds_per_round=0.5)
        medians = [c.round_medians[-1] for c in contenders]
        rounds.append(
            {
                "probe": probed,
                "model": medians[: len(models)],
                "onnx": medians[-1] if args.onnx else None,
                "kernels": model.kernel_times(x, runs=5),
            }
        )
        latencies = " ".join(f"{t * 1e3:.2f}" for t in rounds[-1]["model"])
        print(f"probe {rounds[-1]['probe']:.2f} us  model(s) {latencies} ms", flush=True)
        threshold = placement_threshold([r["probe"] for r in rounds])
        if threshold is not None:
            slow = sum(r["probe"] > threshold for r in rounds)
            if min(slow, len(rounds) - slow) >= args.rounds_per_placement:
                break
        time.sleep(1.0)
    report(rounds, args.models)


def report(rounds: list[dict], names: list[str]) -> None:
    threshold = placement_threshold([r["probe"] for r in rounds])
    if threshold is None:
        print(f"one placement only over {len(rounds)} rounds (probe {min(r['probe'] for r in rounds):.2f} us)")
        groups = {"all": rounds}
    else:
        groups = {
            "cheap sharing": [r for r in rounds if r["probe"] <= threshold],
            "costly sharing": [r for r in rounds if r["probe"] > threshold],
        }

    def median_of(group: list[dict], key: str, index: int | None = None) -> float | None:
        values = [r[key] if index is None else r[key][index] for r in group if r[key] is not None]
        return statistics.median(values) if values else None

    for placement, group in groups.items():
        onnx = median_of(group, "onnx")
        print(
            f"{placement}: {len(group)} rounds, probe {median_of(group, 'probe'):.2f} us"
            + (f", ONNX Runtime {onnx * 1e3:.2f} ms" if onnx else "")
        )
        for index, path in enumerate(names):
            model = median_of(group, "model", index)
            print(f"  {path}: {model * 1e3:.2f} ms" + (f", {model / onnx:.2f} of ONNX Runtime" if onnx else ""))
    print(f"\nkernels of {names[0]}:")
    placements = list(groups)
    kernels = sorted({k for r in rounds for k in r["kernels"]})
    medians = {
        placement: {k: statistics.median(r["kernels"].get(k, 0.0) for r in group) for k in kernels}
        for placement, group in groups.items()
    }
    order = sorted(kernels, key=lambda k: medians[placements[-1]][k] - medians[placements[0]][k], reverse=True)
    print(f"\n| kernel | {' | '.join(f'{p} (us)' for p in placements)} |")
    print(f"|---|{'---:|' * len(placements)}")
    for k in order:
        print(f"| {k} | {' | '.join(f'{medians[p][k] * 1e6:.1f}' for p in placements)} |")


if __name__ == "__main__":
    main()
