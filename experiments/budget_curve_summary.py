"""``budget_curve.py``'s models in one table: what the budget bought each, against the best fp32 runtime
timed beside it, and whether the call returned within 10% of the budget it was given."""

from __future__ import annotations

import json
from pathlib import Path

from experiments import frameworks as fw
from experiments.harness import markdown_table

FP32_RUNTIMES = ("PyTorch eager", "torch.compile", "ONNX Runtime", fw.OPENVINO_FP32)
SUMMARY_FILE = "summary.md"
BUDGET_SLACK = 0.10  # the bar: a wall-clock budget is kept when the call returns within 10% of it


def best_fp32(latency: dict) -> str:
    return min((n for n in FP32_RUNTIMES if latency.get(n)), key=lambda n: latency[n])


def write_summary(out: Path) -> str:
    """OUT/summary.md from every model's curve under ``out``; returns its text."""
    curves = [json.loads(p.read_text()) for p in sorted(out.glob("*.json"))]
    curves = [curve for curve in curves if "timing" in curve]
    rows = [summary_row(curve) for curve in curves if curve.get("dtype", "float32") == "float32"]
    low = [
        summary_row(curve, against=fw.OPENVINO_DEFAULT)
        for curve in curves
        if curve.get("dtype", "float32") != "float32"
    ]
    text = (
        "# Minutes of tuning against the best fp32 runtime, per model\n\n"
        "Each model tuned from the analytic start with the clock alone ending the call (`tune(..., "
        "stop=Objectives(seconds=60 * minutes))`); every latency over the best fp32 runtime's (PyTorch eager, "
        "torch.compile, ONNX Runtime, OpenVINO fp32) timed in the same process, median over the timing "
        'processes. "returned after": the call\'s wall time (lowering, search, final choice, compile and '
        'check); "process": the tuning process\'s, import and model construction included. Per-model '
        "tables: MODEL.md.\n\n" + (markdown_table(rows, list(rows[0])) if rows else "no model measured yet") + "\n"
    )
    if low:
        text += (
            "\n## In bf16, against OpenVINO's default precision\n\n"
            'The same, tuned and compiled with `tune(..., dtype="bfloat16")` (`--dtype bfloat16`: bf16 operands, '
            "fp32 accumulators); every latency over OpenVINO's default (bf16 where the CPU has bf16 units) timed "
            "in the same process. Per-model tables: MODEL-bfloat16.md.\n\n" + markdown_table(low, list(low[0])) + "\n"
        )
    (out / SUMMARY_FILE).write_text(text)
    return text


def summary_row(curve: dict, against: str | None = None) -> dict:
    """One curve's row; its ratios are to the best fp32 runtime, or to the runtime ``against`` names
    (each still taken within one timing process: the ratios to the best fp32 runtime, divided)."""
    timing, minutes = curve["timing"], curve["minutes"]
    run = curve["tune"].get("analytic") or next(iter(curve["tune"].values()))
    best = best_fp32(timing["latency"])
    at_budget = _checkpoint(curve, minutes)
    returned = run["ended"] - run["started"]
    reference = timing["ratio"].get(against, 0.0) if against else 1.0

    def ratio(label: str | None) -> str:
        value = timing["ratio"].get(label) if label else None
        return f"{value / reference:.2f}" if value and reference else "-"

    return {
        "model": curve["model"],
        "CPU": curve["cpu"],
        "kernels": run["tasks"],
        "budget": f"{minutes:g} min",
        "returned after (process)": f"{returned:.0f} s ({run['process_seconds']:.0f} s)",
        "within 10%": "yes" if returned <= 60 * minutes * (1 + BUDGET_SLACK) else "no",
        "trials": run["trials"],
        "trials=0": ratio("trials=0"),
        "3 min": ratio(_checkpoint(curve, 3.0)),
        "at the budget": ratio(at_budget),
        **(
            {"OpenVINO (default)": _latency(timing, fw.OPENVINO_DEFAULT), "best fp32": ratio(best) + f" ({best})"}
            if against
            else {"best fp32": f"{best} {_latency(timing, best)}", "OpenVINO (default)": ratio(fw.OPENVINO_DEFAULT)}
        ),
        "error at the budget": f"{timing['errors'][at_budget]:.1e}" if at_budget in timing["errors"] else "-",
    }


def _latency(timing: dict, label: str) -> str:
    value = timing["latency"].get(label)
    return f"{value * 1e3:.2f} ms" if value else "-"


def _checkpoint(curve: dict, minute: float) -> str | None:
    """The label of the analytic start's checkpoint at ``minute``, where the curve has one."""
    return next(
        (
            label
            for label, point in curve["checkpoints"].items()
            if point["minute"] == minute and "start" not in label and label in curve["timing"]["ratio"]
        ),
        None,
    )
