"""The measurement engine against serial, isolated measurement, on one pre-built set of candidates.

Real schedules of a conv2d and a matmul (sampled from MetaSchedule's design space) are built
once; then the same artifacts are timed
  (a) serially: each candidate alone, nothing else running (twice, to show the noise floor), and
  (b) by the engine: the DOP controller chooses how many are timed at once, checks a sample of
      each parallel window serially and backs off when the numbers drift.
Prints throughput (candidates per second), (b)'s median and worst relative error against (a),
the ranking agreement (top-5 overlap, Kendall tau, same top-1) and the fraction of wall time the
device spent inside timed calls; writes a CSV, a markdown table and the DOP log.

    python experiments/measurement_engine.py                         # this CPU, 40 candidates each
    python experiments/measurement_engine.py --target cuda --candidates 64
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from costmodel.quality import kendall_tau  # noqa: E402
from experiments.harness import markdown_table, sample_candidates, write_csv  # noqa: E402
from measure import EngineConfig, MeasureEngine, TimingConfig  # noqa: E402
from measure.dop.controller import DopController  # noqa: E402
from measure.types import BuildResult, MeasureResult  # noqa: E402

WORKLOADS = ["conv2d-resnet18-l2", "matmul-512"]


def copies(builds: list[BuildResult], tag: str) -> list[BuildResult]:
    """The engine deletes an artifact once it is timed: each pass gets its own copy."""
    out = []
    for built in builds:
        path = f"{built.artifact}.{tag}.so"
        shutil.copyfile(built.artifact, path)
        out.append(BuildResult(built.key, built.status, artifact=path, args=built.args, seconds=built.seconds))
    return out


def timed_pass(
    engine: MeasureEngine, builds: list[BuildResult], serial: bool
) -> tuple[dict[str, MeasureResult], float]:
    started = time.monotonic()
    results = {r.key: r for r in engine.measure_built(builds, serial=serial)}
    return results, time.monotonic() - started


def compare(reference: dict[str, MeasureResult], other: dict[str, MeasureResult], keys: list[str]) -> dict:
    ref = [reference[k].latency for k in keys]
    got = [other[k].latency for k in keys]
    errors = [abs(g - r) / r for r, g in zip(ref, got, strict=True)]
    top = lambda values: {keys[i] for i in sorted(range(len(keys)), key=values.__getitem__)[:5]}  # noqa: E731
    return {
        "median_error": statistics.median(errors),
        "worst_error": max(errors),
        "top5_overlap": len(top(ref) & top(got)),
        "kendall_tau": kendall_tau(ref, got),
        "same_top1": min(keys, key=lambda k: reference[k].latency) == min(keys, key=lambda k: other[k].latency),
    }


def row(
    label: str,
    keys: list[str],
    results: dict[str, MeasureResult],
    wall: float | None,
    serial_wall: float,
    accuracy: dict | None,
) -> dict:
    """One line of the table; ``wall`` None for a subset of a pass (its accuracy only)."""
    timed = sum(results[k].timed_seconds for k in keys)
    accuracy = accuracy or {}
    return {
        "pass": label,
        "candidates": len(keys),
        "wall_s": round(wall, 2) if wall else "",
        "per_s": round(len(keys) / wall, 2) if wall else "",
        "speedup": round(serial_wall / wall, 2) if wall else "",
        "median_err_%": round(100 * accuracy["median_error"], 2) if accuracy else "",
        "worst_err_%": round(100 * accuracy["worst_error"], 1) if accuracy else "",
        "top5": accuracy.get("top5_overlap", ""),
        "tau": round(accuracy["kendall_tau"], 3) if accuracy.get("kendall_tau") is not None else "",
        "top1": accuracy.get("same_top1", ""),
        "device_busy_%": round(100 * timed / wall, 1) if wall else "",
    }


def plot_decisions(decisions: list[dict], path: Path) -> None:
    """DOP per window, and the largest error its serial checks found."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.5))
    windows = [d["batch"] for d in decisions]
    ax.step(windows, [d["dop"] for d in decisions], where="post", label="DOP")
    ax.set_xlabel("measurement window")
    ax.set_ylabel("candidates timed at once")
    errors = ax.twinx()
    checked = [d for d in decisions if d["max_error"] is not None]
    errors.plot(
        [d["batch"] for d in checked],
        [100 * d["max_error"] for d in checked],
        "o",
        color="tab:red",
        label="worst error",
    )
    errors.set_ylabel("worst error of the serial checks (%)")
    fig.legend(loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="llvm")
    parser.add_argument("--candidates", type=int, default=40, help="per workload")
    parser.add_argument("--max-dop", type=int, default=None)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--max-repeats", type=int, default=None, help="samples per candidate at most (default: the engine's)"
    )
    parser.add_argument(
        "--flush",
        choices=["auto", "on", "off"],
        default="auto",
        help="flush caches before each sample (auto: on a GPU only)",
    )
    parser.add_argument("--out", type=Path, default=Path("experiments/results/measurement_engine"))
    args = parser.parse_args()

    from tuner.targets import describe_target, resolve_target

    target = resolve_target(args.target)
    args.out.mkdir(parents=True, exist_ok=True)
    work = args.out / "work"
    shutil.rmtree(work, ignore_errors=True)
    timing = TimingConfig()
    timing = replace(
        timing,
        flush_cache={"auto": None, "on": True, "off": False}[args.flush],
        max_repeats=args.max_repeats or timing.max_repeats,
    )
    config = EngineConfig(max_dop=args.max_dop, timing=timing)
    with MeasureEngine(target, work, config) as engine:
        inputs = [c for name in WORKLOADS for c in sample_candidates(name, target, args.candidates, args.seed)]
        print(f"{len(inputs)} candidates on {describe_target(target)}; building ...", file=sys.stderr)
        started = time.monotonic()
        builds = [b for b in engine.build(inputs) if b.ok]
        build_wall = time.monotonic() - started
        print(
            f"built {len(builds)} in {build_wall:.1f} s; timing serially (twice) and with the engine ...",
            file=sys.stderr,
        )
        serial, serial_wall = timed_pass(engine, copies(builds, "a"), serial=True)
        again, again_wall = timed_pass(engine, copies(builds, "a2"), serial=True)
        engine.dop = DopController(engine.dop.max_dop, config.dop_error_threshold, config.dop_check_fraction)
        parallel, parallel_wall = timed_pass(engine, copies(builds, "b"), serial=False)
        decisions = [d.as_dict() for d in engine.dop_decisions]
        print("building and measuring from source in one go, as tuning does ...", file=sys.stderr)
        started = time.monotonic()
        end_to_end = sum(r.ok for r in engine.measure(inputs))
        end_to_end_wall = time.monotonic() - started
    keys = sorted(
        k for k in serial if serial[k].ok and again.get(k) and again[k].ok and parallel.get(k) and parallel[k].ok
    )
    rows = [
        row("(a) serial", keys, serial, serial_wall, serial_wall, None),
        row("(a') serial again", keys, again, again_wall, serial_wall, compare(serial, again, keys)),
        row("(b) engine", keys, parallel, parallel_wall, serial_wall, compare(serial, parallel, keys)),
    ]
    for name in WORKLOADS:
        subset = [k for k in keys if k.startswith(name + "/")]
        rows.append(
            row(f"(b) engine, {name} only", subset, parallel, None, serial_wall, compare(serial, parallel, subset))
        )
    columns = list(rows[0])
    table = markdown_table(rows, columns)
    dops = [d["dop"] for d in decisions]
    summary = (
        f"{describe_target(target)}; {len(keys)} candidates ({args.candidates} sampled per workload), "
        f"built once in {build_wall:.1f} s; engine DOP per window: {dops} "
        f"(max {engine.dop.max_dop}); errors are against (a). Building and measuring in one go "
        f"({end_to_end} measured) took {end_to_end_wall:.1f} s against {build_wall:.1f} s of building plus "
        f"{parallel_wall:.1f} s of measuring apart: {max(0.0, build_wall + parallel_wall - end_to_end_wall):.1f} s "
        "overlapped."
    )
    print(summary)
    print(table)
    write_csv(args.out / "measurement_engine.csv", rows)
    (args.out / "measurement_engine.md").write_text(summary + "\n\n" + table + "\n")
    (args.out / "dop_decisions.json").write_text(json.dumps(decisions, indent=1))
    plot_decisions(decisions, args.out / "dop.png")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
