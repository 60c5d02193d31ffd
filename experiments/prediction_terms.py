"""The analytic model's terms against the products' times in the models, on every CPU's records: how much of a
product's weights' stream to count on top of its arithmetic.

    git show 59d191d^:experiments/results/analytic/analytic.json > /tmp/records.json
    .venv/bin/python experiments/prediction_terms.py hf-bert resnet18 hf-regnet --records /tmp/records.json

A record of ``analytic.py`` keeps each kernel's prediction and its time in the model, not the prediction's terms,
and another CPU's calibration is not here to predict it again (``analytic.py --repredict`` does this CPU's). So
the models' kernels are lowered again here (each tiled product's plan efficiency, bytes and weights:
``prediction.plan_efficiency``, ``bytes_moved``, ``weight_bytes``) and each CPU's recorded predictions of them
decomposed by least squares into arithmetic, other bytes, weights and a launch, four rates per CPU: exact where
the record was predicted with every term added (the records as they were before ``WEIGHTS_HIDDEN``, commit
59d191d: hence the command above) on a machine that plans as this one does (the fit's residual is printed per
CPU). Recombined with a share of the shorter of the arithmetic and the weights' stream hidden behind
the other (``prediction.WEIGHTS_HIDDEN``), each CPU's products within 25% of their time in the model (at the
machine's speed where the record read it) are counted. fp32 records only (a bf16 product's arithmetic has terms
of its own). Writes OUT/prediction_terms.md (default OUT: experiments/results/prediction_terms).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from experiments.analytic_tables import PREDICTION_WITHIN as WITHIN  # noqa: E402
from experiments.harness import markdown_table  # noqa: E402


def kernel_terms(models: list[str]) -> dict[tuple[str, str], tuple[float, float, float]]:
    """(model, kernel) -> (FLOPs over its plan's efficiency, its bytes other than weights, its weights' bytes),
    for each tiled fp32 product of ``models`` lowered as tune() lowers them for this machine."""
    from experiments.analytic import model_tasks
    from tuner.spaces import metaschedule as msc
    from tuner.spaces.analytic import configure_kernel
    from tuner.spaces.machine import MachineFacts
    from tuner.spaces.prediction import bytes_moved, plan_efficiency
    from tuner.targets import resolve_target

    target = resolve_target("llvm")
    facts = MachineFacts.of(target)
    terms = {}
    for model in models:
        for task in model_tasks(model, target):
            configured = configure_kernel(task.mod, target)
            if configured is None or not configured.plans:
                continue
            weights = msc.weight_bytes(task.mod)
            work = task.flops / plan_efficiency(configured.plans, facts)
            terms[(model, task.name)] = (work, bytes_moved(task.mod, configured) - weights, weights)
    return terms


def cpu_rows(records: list[dict], cpu: str, terms: dict) -> np.ndarray:
    """Rows (work, other bytes, weights, predicted, in the model at the machine's speed) of ``cpu``'s records."""
    rows = []
    for record in records:
        if record["cpu"] != cpu:
            continue
        speed = record["zero"].get("machine_speed") or 1.0
        for kernel in record["zero"]["kernels"]:
            term = terms.get((record["model"], kernel["name"]))
            if term and kernel["tiled"] and kernel["predicted"] and kernel["in_model"]:
                rows.append((*term, kernel["predicted"], kernel["in_model"] * speed))
    return np.array(rows).reshape(-1, 5)


def fit_terms(rows: np.ndarray) -> tuple[np.ndarray, float]:
    """Each row's recorded prediction as its arithmetic, other bytes, weights and launch (seconds, one column
    each), fitted by least squares on relative error; and the fit's median relative residual."""
    design = np.column_stack([rows[:, 0], rows[:, 1], rows[:, 2], np.ones(len(rows))])
    predicted = rows[:, 3]
    scale = 1 / predicted
    rates, *_ = np.linalg.lstsq(design * scale[:, None], predicted * scale, rcond=None)
    parts = design * rates
    return parts, float(np.median(np.abs(parts.sum(axis=1) / predicted - 1)))


def recombined(parts: np.ndarray, hidden: float) -> np.ndarray:
    """Predictions with ``hidden`` of the shorter of the arithmetic and the weights' stream hidden behind the other."""
    compute, others, weights, launch = parts.T
    return compute + weights - hidden * np.minimum(compute, weights) + others + launch


def within(predicted: np.ndarray, measured: np.ndarray) -> int:
    return int(np.sum(np.abs(predicted / measured - 1) <= WITHIN))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+")
    parser.add_argument("--hidden", type=float, nargs="+", default=[0.0, 0.5, 1.0])
    parser.add_argument("--records", type=Path, default=Path("experiments/results/analytic/analytic.json"))
    parser.add_argument("--out", type=Path, default=Path("experiments/results/prediction_terms"))
    args = parser.parse_args()
    records = [r for r in json.loads(args.records.read_text()) if r["model"] in args.models]
    terms = kernel_terms(args.models)
    table = []
    for cpu in dict.fromkeys(r["cpu"] for r in records):
        rows = cpu_rows(records, cpu, terms)
        if not len(rows):
            continue
        parts, residual = fit_terms(rows)
        row = {"CPU": cpu, "products": len(rows), "fit's median residual": f"{residual:.1%}"}
        row["recorded"] = within(rows[:, 3], rows[:, 4])
        for hidden in args.hidden:
            row[f"{hidden:g} hidden"] = within(recombined(parts, hidden), rows[:, 4])
        table.append(row)
    text = markdown_table(table, list(table[0])) if table else "no records of these models\n"
    args.out.mkdir(parents=True, exist_ok=True)
    command = " ".join(["experiments/prediction_terms.py", *sys.argv[1:]])
    header = f"# Products within {WITHIN:.0%} of their time in the model, by the weights' stream hidden\n\n"
    (args.out / "prediction_terms.md").write_text(f"{header}Measured by `{command}`.\n\n{text}")
    print(text)


if __name__ == "__main__":
    main()
