"""The tables and the figure of experiments/vs_frameworks.py: a row per workload (every runtime's
latency and error, the tuned model against the fastest runtime in the comparison's precision), a
row per tuned kernel (its fraction of the machine's limits, the matching PyTorch operator's time),
the summary and the bar chart.

Each runtime states the precision it computed in (``timed["precision"]``): ``tuned / best`` is
against the fastest runtime in the frameworks' precision (fp32 on a CPU), never against one that
computed in less (OpenVINO's default in bf16, PyTorch under autocast); a bf16 run adds
``tuned / best bf16`` against those.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from experiments.frameworks import OPENVINO_DEFAULT
from experiments.harness import markdown_table

GEMM_KINDS = ("conv2d", "matmul", "dense")
REFERENCE = "PyTorch eager"  # whose output every other runtime's is checked against


@dataclass(frozen=True)
class Lineup:
    """The runtimes a run compares the tuned model with, and the precisions it compares in."""

    frameworks: tuple[str, ...]
    precision: str = "fp32"  # the frameworks' ("fp16" on a GPU): what ``tuned / best`` is against
    reduced: str | None = None  # "bf16" in a bf16 run: its contenders in bf16 get ``tuned / best bf16``


def fastest(timed: dict, lineup: Lineup, precision: str) -> str | None:
    """The fastest of the lineup's runtimes that computed in ``precision``."""
    latency, precisions = timed["latency"], timed.get("precision", {})
    ran = [f for f in lineup.frameworks if latency.get(f) and precisions.get(f, lineup.precision) == precision]
    return min(ran, key=latency.get, default=None)


def _ms(seconds: float | None) -> str:
    return f"{seconds * 1e3:.3f}" if seconds else "-"


def _ratio(timed: dict, best: str | None) -> float | None:
    latency = timed["latency"]
    return latency["tuned"] / latency[best] if latency.get("tuned") and best else None


def model_row(name: str, tuned: dict, timed: dict, limits, lineup: Lineup) -> dict:
    latency, errors = timed["latency"], timed["errors"]
    best = fastest(timed, lineup, lineup.precision)
    ratio = _ratio(timed, best)
    floor = arithmetic_floor(tuned, limits.peak_gflops, lambda kernel: kernel_peak_gflops(kernel, limits))
    floor_ratio = floor / latency[best] if floor and best else None
    row = {
        "workload": name,
        "tasks": len(tuned["tasks"]),
        "trials": tuned["trials"],
        "tuning (s)": f"{tuned['tuning_seconds']:.0f}",
        "tuned (ms)": _ms(latency.get("tuned")),
        "TVM untuned (ms)": _ms(tuned.get("untuned_latency")),
        **{f"{f} (ms)": _ms(latency.get(f)) for f in lineup.frameworks},
    }
    if OPENVINO_DEFAULT in lineup.frameworks:
        row[f"{OPENVINO_DEFAULT} in"] = timed.get("precision", {}).get(OPENVINO_DEFAULT) or "-"
    row |= {
        f"best {lineup.precision}": best or "-",
        "tuned / best": f"{ratio:.2f}" if ratio else "-",
        "by round": _ratio_range(timed, best),
    }
    reduced_ratio = _ratio(timed, fastest(timed, lineup, lineup.reduced)) if lineup.reduced else None
    if lineup.reduced:
        row[f"tuned / best {lineup.reduced}"] = f"{reduced_ratio:.2f}" if reduced_ratio else "-"
    row |= {
        "FLOPs at peak / best": f"{floor_ratio:.2f}" if floor_ratio else "-",
        "kernels alone (ms)": _ms(sum(t["launches"] * t["latency"] for t in tuned["tasks"] if t["latency"])),
        "kernels in model (ms)": _ms(sum(timed.get("kernels_in_model", {}).values())),
        # every error beside the scale it is relative to
        **{
            f"{c} error": f"{errors[c]:.1e}" if c in errors else "-"
            for c in ("tuned", *lineup.frameworks)
            if c != REFERENCE
        },
        "of outputs up to": f"{timed['output_scale']:.3g}" if "output_scale" in timed else "-",
        "_ratio": ratio,
        "_reduced_ratio": reduced_ratio,
        "_floor_ratio": floor_ratio,
    }
    return row


def arithmetic_floor(tuned: dict, peak_gflops: float, peak_of: Callable[[str], float] | None = None) -> float:
    """The seconds the model's kernels take if every one of them computes at the machine's peak (of
    its own precision, with ``peak_of(kernel name)``): a lower bound on the latency of this lowering,
    whose kernels do these FLOPs. (Not the roofline's memory term: measured alone or in a model, small
    activations come from cache, faster than the copy bandwidth.) A kernel left without a tuned
    schedule counts too: the model still runs it."""
    peak_of = peak_of or (lambda _name: peak_gflops)
    return sum(t["launches"] * t["flops"] / (peak_of(t.get("name", "")) * 1e9) for t in tuned["tasks"])


def _ratio_range(timed: dict, best: str | None) -> str:
    """The lowest and highest tuned / ``best`` ratio over the rounds (``best``: the fastest framework
    over all of them)."""
    per_round = timed.get("rounds", {})
    if not best or "tuned" not in per_round or best not in per_round:
        return "-"
    ratios = [t / b for t, b in zip(per_round["tuned"], per_round[best], strict=True)]
    low, high = f"{min(ratios):.2f}", f"{max(ratios):.2f}"
    return low if low == high else f"{low}-{high}"


def matching_torch_time(flops: float, ops: list[tuple[str, float, float]]) -> float | None:
    """Median time of PyTorch's operators whose FLOPs are within 10% of this kernel's (a fused
    kernel counts its epilogue's few operations too)."""
    times = [seconds for _, op_flops, seconds in ops if op_flops and abs(op_flops - flops) <= 0.1 * flops]
    return statistics.median(times) if times else None


def kernel_peak_gflops(kernel: str, limits) -> float:
    """The peak of the kernel's own precision: a bf16 product's (tuner.lowering.bf16.products) is the bf16 dot
    product's, where this machine has one."""
    bf16 = getattr(limits, "bf16_peak_gflops", None)
    return bf16 if bf16 and "bf16_" in kernel else limits.peak_gflops


def kernel_rows(name: str, tuned: dict, timed: dict, limits) -> list[dict]:
    total = sum(t["launches"] * t["latency"] for t in tuned["tasks"] if t["latency"])
    rows = []
    for t in tuned["tasks"]:
        latency = t["latency"]
        if not latency:
            continue
        peak = kernel_peak_gflops(t["name"], limits)
        bound = limits.bound_seconds(t["flops"], t["bytes"])
        in_model = timed.get("kernels_in_model", {}).get(t["name"])
        # a Winograd kernel's FLOPs are its own, fewer than those of the PyTorch op it replaces
        matched = _is_gemm(t["name"]) and "winograd" not in t["name"]
        torch_time = matching_torch_time(t["flops"], timed["torch_ops"]) if matched else None
        rows.append(
            {
                "workload": name,
                "kernel": t["name"],
                "launches": t["launches"],
                "share": f"{t['launches'] * latency / total:.0%}",
                "latency (us)": f"{latency * 1e6:.1f}",
                "in model (us)": f"{in_model * 1e6 / t['launches']:.1f}" if in_model else "-",
                "GFLOP/s": f"{t['flops'] / latency / 1e9:.1f}",
                "GB/s": f"{t['bytes'] / latency / 1e9:.2f}",
                "% of peak": f"{t['flops'] / latency / 1e9 / peak:.0%}",
                "% of roofline": f"{bound / latency:.0%}",
                "bound by": "compute"
                if t["flops"] / (peak * 1e9) >= t["bytes"] / (limits.copy_gbs * 1e9)
                else "memory",
                "PyTorch op (us)": f"{torch_time * 1e6:.1f}" if torch_time else "-",
                "_gemm": _is_gemm(t["name"]),
                "_peak_fraction": t["flops"] / latency / 1e9 / peak,
                "_roofline_fraction": bound / latency,
            }
        )
    return rows


def _is_gemm(kernel: str) -> bool:
    return any(kind in kernel for kind in GEMM_KINDS)


def public(rows: list[dict]) -> list[dict]:
    """The rows without their private (``_``) fields, as the CSV files and tables show them."""
    return [{k: v for k, v in row.items() if not k.startswith("_")} for row in rows]


def columns(rows: list[dict]) -> list[str]:
    return [k for k in rows[0] if not k.startswith("_")]


def _precision_text(lineup: Lineup) -> str:
    text = (
        f"`tuned / best`: against the fastest runtime that computed in {lineup.precision} (`best "
        f"{lineup.precision}`); each runtime's precision is its own: "
    )
    if OPENVINO_DEFAULT in lineup.frameworks:
        text += (
            f"`{OPENVINO_DEFAULT}` is OpenVINO as its users get it (only the thread count set), in the "
            f"precision it reports (`{OPENVINO_DEFAULT} in`: bf16 on a CPU with bf16 dot products), counted as "
            f"{lineup.precision} only where it reports {lineup.precision}; `OpenVINO fp32` is forced to fp32 "
            "(INFERENCE_PRECISION_HINT f32). "
        )
    if lineup.reduced:
        text += (
            f"`tuned / best {lineup.reduced}`: against the fastest runtime in {lineup.reduced} (PyTorch eager under "
            f"torch.autocast, OpenVINO's default where it reports {lineup.reduced}). "
        )
    return text + "Every error is against PyTorch eager's output in fp32. "


def _means(models: list[dict], lineup: Lineup) -> list[str]:
    ratios = [r["_ratio"] for r in models if r["_ratio"]]
    floors = [r["_floor_ratio"] for r in models if r["_ratio"] and r["_floor_ratio"]]
    lines = []
    if ratios:
        lines.append(
            f"Geometric mean of tuned / best {lineup.precision} framework: {statistics.geometric_mean(ratios):.2f} "
            f"over {len(ratios)} workloads"
            + (f"; at the FLOPs' peak: {statistics.geometric_mean(floors):.2f}." if len(floors) == len(ratios) else ".")
        )
    reduced = [r["_reduced_ratio"] for r in models if r["_reduced_ratio"]]
    if reduced:
        lines.append(
            f"Geometric mean of tuned / best {lineup.reduced} runtime: {statistics.geometric_mean(reduced):.2f} "
            f"over {len(reduced)} workloads."
        )
    return lines


def summary(models: list[dict], kernels: list[dict], limits, trials_per_task: int, lineup: Lineup) -> str:
    gemm = sorted(k["_peak_fraction"] for k in kernels if k["_gemm"])
    low = [k for k in kernels if k["_roofline_fraction"] < 0.10]
    lines = [
        "# Tuned models against " + ", ".join(f for f in lineup.frameworks),
        "",
        limits.describe(),
        f"Budget: {trials_per_task} trials per task (allocated by the gradient scheduler); `tuning (s)` sums every "
        "session that tuned a work dir. Latencies are medians of interleaved calls in one process, inputs as torch "
        "tensors (numpy arrays for ONNX Runtime and OpenVINO), the same threads for every runtime; "
        + _precision_text(lineup)
        + "An error is the largest deviation from PyTorch eager's output relative to its largest value, "
        "`of outputs up to` (an error beside an output of 1e-21 proves nothing). "
        "`by round`: the ratio in each of the 10 interleaved rounds; where it spreads, the VM's vCPUs moved during "
        "the timing to where sharing data between threads costs more (see `experiments/cross_core.py`). "
        "`FLOPs at peak / best`: the model's kernels' FLOPs at the machine's peak against the best framework, the "
        "lowest ratio this lowering can reach here; the FLOPs are the kernels' own (Winograd's and Strassen's "
        "kernels do fewer than the direct forms the frameworks compute). "
        "`kernels alone`: the tuned kernels' times as the tuning measured them (each alone, its data in cache), "
        "added up; `kernels in model`: the same kernels timed inside the model (`CompiledModel.kernel_times`; "
        "Python runs between the kernels then, which slows short ones).",
        "",
        markdown_table(public(models), columns(models)) if models else "(no workload finished)",
        "",
        *_means(models, lineup),
    ]
    if gemm:
        lines.append(
            f"Convolutions and matmuls: median {statistics.median(gemm):.0%} of peak over {len(gemm)} kernels."
        )
    lines.append(
        f"Kernels below 10% of their roofline bound: {len(low)} of {len(kernels)}"
        + (": " + ", ".join(f"{k['workload']}/{k['kernel']}" for k in low) if low else ".")
    )
    lines += ["", "Per kernel: kernels.csv.", ""]
    return "\n".join(lines)


def plot(models: list[dict], timed: dict[str, dict], path: Path, lineup: Lineup) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [m["workload"] for m in models]
    series = ["tuned", *lineup.frameworks]
    fig, ax = plt.subplots(figsize=(max(6, len(names) * 1.2), 4))
    width = 0.8 / len(series)
    for i, name in enumerate(series):
        values = []
        for workload in names:
            latency = timed[workload]["latency"]
            best = fastest(timed[workload], lineup, lineup.precision)
            values.append(latency[name] / latency[best] if latency.get(name) and best else 0)
        ax.bar([x + i * width for x in range(len(names))], values, width, label=name)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(names))], names, rotation=30, ha="right")
    ax.set_ylabel(f"latency / best {lineup.precision} framework")
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
