"""The tables of ``experiments/analytic.py`` (analytic.md, kernels.md), made from its records: per model
its builds against each other and the other runtimes, per kernel the analytic model's prediction against
its measurements and its fraction of peak."""

from __future__ import annotations

from pathlib import Path

from experiments.harness import markdown_table

FP32_RUNTIMES = ("PyTorch eager", "torch.compile", "ONNX Runtime", "OpenVINO fp32")
PREDICTION_WITHIN = 0.25  # the bar: predicted within 25% of measured


def write_tables(out: Path, records: list[dict], timing: str) -> None:
    """analytic.md and kernels.md, from every model's record, with the commands that measured them."""
    commands = "; ".join(
        f"`{command}`" for command in dict.fromkeys(r.get("command", "an earlier command") for r in records)
    )
    repredicted = sorted({r["predicted_by"] for r in records if r.get("predicted_by")})
    if repredicted:  # measured earlier, predicted again (``--repredict``)
        commands += f"; predictions of the models measured earlier: {', '.join(repredicted)}"
    rows = [table_row(record) for record in records]
    columns = list(dict.fromkeys(c for row in rows for c in row))  # in the order _row names them
    rows = [{column: row.get(column, "-") for column in columns} for row in rows]  # a runtime that failed: "-"
    kernel_rows, accuracy_rows = [], []
    for record in records:
        searched = [run for run in (*record["few_shot"].values(), record["tuned"]) if run]  # measured them alone
        kernel_rows.extend(_kernel_rows(record, searched))
        accuracy_rows.append(_accuracy(record, searched))
    (out / "analytic.md").write_text(
        f"# No trials against tuned and against other runtimes\n\nEach row on its CPU, {timing}; measured by "
        f"{commands}\n\n{markdown_table(rows, columns)}\n\n"
        f"## The analytic model's predictions (products: predicted within {PREDICTION_WITHIN:.0%})\n\n"
        "The machine speed: the calibration's product timed again beside the kernels' profile in the trials=0 "
        "model, over its calibrated rate (a VM's drifts); the predictions divided by it are at the speed the "
        "machine ran at, as `tune()`'s summary and `tuner report` give them. Records measured before it was "
        "read have none.\n\n"
        f"{markdown_table(accuracy_rows, list(accuracy_rows[0]))}\n\n{_totals(records)}\n"
    )
    (out / "kernels.md").write_text(
        f"# Per kernel: predicted, measured, fraction of peak\n\nMeasured by {commands}\n\n"
        f"{markdown_table(kernel_rows, list(kernel_rows[0]))}\n"
    )


def table_row(record: dict) -> dict:
    model, zero, tuned, timed = record["model"], record["zero"], record["tuned"], record["side_by_side"]
    label = next((name for name in timed if name.startswith("tuned ")), "")  # "tuned N/kernel"
    per_task = int(label.split()[1].split("/")[0]) if label else None
    few = {int(k): v for k, v in record["few_shot"].items()}
    row = {"model": model, "CPU": record["cpu"]}
    return {**row, **_row(zero, tuned, timed, per_task), **_few_columns(few, timed, zero, tuned)}


def _row(zero: dict, tuned: dict | None, timed: dict, per_task: int | None) -> dict:
    row = {
        "trials=0 wall (s)": f"{zero['wall_s']:.0f}",
        "trials=0 (ms)": f"{timed['trials=0']['ms']:.3f}",
        "predicted (ms)": f"{zero['predicted_ms']:.3f}" if zero["predicted_ms"] else "-",
        "tuned (ms)": f"{timed[f'tuned {per_task}/kernel']['ms']:.3f}" if tuned else "-",
        "trials=0 / tuned (via ONNX Runtime)": _through_onnx_runtime(timed, per_task) if tuned else "-",
        "tuning (min)": f"{tuned['tuning_min']:.1f}" if tuned else "-",
        "trials=0 / best fp32 runtime": _against_best_fp32(timed),
        "tuned / best fp32 runtime": _against_best_fp32(timed, f"tuned {per_task}/kernel") if tuned else "-",
    }
    for name, value in timed.items():
        if value["ms"] is not None and not name.startswith("tuned"):
            row[f"{name} / trials=0"] = f"{value['ms'] / timed['trials=0']['ms']:.2f}"
            row[f"{name} error"] = f"{value['error']:.1e}" if value["error"] is not None else "-"
    return row


def _few_columns(few: dict, timed: dict, zero: dict, tuned: dict | None) -> dict:
    """Per few-shot budget: its latency against trials=0's and the tuned one's (through ONNX Runtime), and
    its wall time."""
    row = {}
    reference = timed["trials=0"].get("onnx_runtime_ratio")
    tuned_ratio = next((v.get("onnx_runtime_ratio") for k, v in timed.items() if k.startswith("tuned")), None)
    for per_task, outcome in few.items():
        ratio = timed[f"{per_task}/kernel"].get("onnx_runtime_ratio")
        row[f"{per_task}/kernel (ms)"] = f"{timed[f'{per_task}/kernel']['ms']:.3f}"
        row[f"{per_task}/kernel wall (s)"] = f"{outcome['wall_s']:.0f}"
        row[f"{per_task}/kernel / trials=0"] = f"{ratio / reference:.2f}" if ratio and reference else "-"
        row[f"{per_task}/kernel / tuned"] = f"{ratio / tuned_ratio:.2f}" if ratio and tuned_ratio else "-"
    return row


def _alone(searched: list[dict]) -> dict[str, float]:
    """Each kernel's analytic schedule measured alone, from the first search that measured it."""
    alone: dict[str, float] = {}
    for run in searched:
        for kernel in run.get("kernels", []):
            if kernel["alone"]:
                alone.setdefault(kernel["name"], kernel["alone"])
    return alone


def _kernel_rows(record: dict, searched: list[dict]) -> list[dict]:
    zero, alone = record["zero"], _alone(searched)
    best = {k["name"]: k["best"] for k in (searched[-1]["kernels"] if searched else [])}
    rows = []
    for kernel in zero["kernels"]:
        in_model, predicted, peak = kernel["in_model"], kernel["predicted"], kernel["peak_gflops"]
        rows.append(
            {
                "model": record["model"],
                "CPU": record["cpu"],
                "kernel": kernel["name"],
                "x": kernel["weight"],
                "product": "yes" if kernel["tiled"] else "",
                "predicted (us)": _us(predicted),
                "in the model (us)": _us(in_model),
                "alone (us)": _us(alone.get(kernel["name"])),
                "searched alone (us)": _us(best.get(kernel["name"])),
                "trials=0 of peak": f"{kernel['flops'] / in_model / 1e9 / peak:.0%}" if in_model and peak else "-",
            }
        )
    return rows


def _products(record: dict) -> list[dict]:
    """A record's predicted products at trials=0."""
    return [k for k in record["zero"]["kernels"] if k["tiled"] and k["predicted"]]


def _within(products: list[dict], measured: dict, speed: float | None = 1.0) -> tuple[int, int] | None:
    """(products predicted within PREDICTION_WITHIN of ``measured``, products measured), the predictions
    divided by ``speed``; None where no speed was read or nothing measured."""
    if not speed:
        return None
    pairs = [(k["predicted"] / speed, measured[k["name"]]) for k in products if measured.get(k["name"])]
    good = sum(abs(p - m) <= PREDICTION_WITHIN * m for p, m in pairs)
    return (good, len(pairs)) if pairs else None


def _of(counts: tuple[int, int] | None) -> str:
    return f"{counts[0]} of {counts[1]}" if counts else "-"


def _in_model(products: list[dict]) -> dict:
    return {k["name"]: k["in_model"] for k in products}


def _accuracy(record: dict, searched: list[dict]) -> dict:
    """How many products the analytic model predicted within PREDICTION_WITHIN, against each measurement,
    and the products' FLOP-weighted fraction of peak at trials=0."""
    zero, products = record["zero"], _products(record)
    timed = [k for k in products if k["in_model"] and k["peak_gflops"]]
    flops = sum(k["flops"] * k["weight"] for k in timed)
    seconds = sum(k["in_model"] * k["weight"] for k in timed)
    in_model = _in_model(products)
    return {
        "model": record["model"],
        "CPU": record["cpu"],
        "products": len(products),
        "machine speed": f"{zero['machine_speed']:.2f}" if zero.get("machine_speed") else "-",
        "within, in the model, at that speed": _of(_within(products, in_model, zero.get("machine_speed"))),
        "within, in the model, at the calibrated speed": _of(_within(products, in_model)),
        "within, alone": _of(_within(products, _alone(searched))),
        "products at trials=0, of peak": f"{flops / seconds / 1e9 / timed[0]['peak_gflops']:.0%}" if timed else "-",
    }


def _totals(records: list[dict]) -> str:
    """Per CPU, the products within the bar in the model: at the machine's speed where it was read."""
    lines = []
    for cpu in dict.fromkeys(record["cpu"] for record in records):
        good = total = at_speed = 0
        for record in (r for r in records if r["cpu"] == cpu):
            products = _products(record)
            counts = _within(products, _in_model(products), record["zero"].get("machine_speed"))
            at_speed += counts is not None
            counts = counts or _within(products, _in_model(products))
            if counts:
                good, total = good + counts[0], total + counts[1]
        if total:
            lines.append(
                f"- {cpu}: {good} of {total} products ({good / total:.0%}) within {PREDICTION_WITHIN:.0%} of their "
                f"time in the model ({at_speed} of its models at the machine's speed, the rest at the calibrated one)"
            )
    return "\n".join(lines)


def _against_best_fp32(timed: dict, build: str = "trials=0") -> str:
    """A build's latency over the fastest fp32 runtime's, timed in the same process, and which it is (the
    other runtimes of an older record: from trials=0's process only)."""
    beside = timed[build].get("beside", timed if build == "trials=0" else {})
    runtimes = [(beside[name]["ms"], name) for name in FP32_RUNTIMES if (beside.get(name) or {}).get("ms")]
    if not runtimes:
        return "-"
    ms, name = min(runtimes)
    return f"{timed[build]['ms'] / ms:.2f} ({name})"


def _us(seconds: float | None) -> str:
    return f"{seconds * 1e6:.1f}" if seconds else "-"


def _through_onnx_runtime(timed: dict, per_task: int | None) -> str:
    zero, tuned = (
        timed["trials=0"].get("onnx_runtime_ratio"),
        timed[f"tuned {per_task}/kernel"].get("onnx_runtime_ratio"),
    )
    return f"{zero / tuned:.2f}" if zero and tuned else "-"
