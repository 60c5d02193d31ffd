"""Which models people bring import, lower, tune, compile and match PyTorch: one row per model, and
where one stops, the stage and the one-line reason.

    .venv/bin/python experiments/model_coverage.py --out /tmp/coverage                     # every HF model
    .venv/bin/python experiments/model_coverage.py --models hf-gpt2 hf-llama --trials-per-task 2
    .venv/bin/python experiments/model_coverage.py --table --out experiments/results/model_coverage   # the table again
    python3 experiments/model_coverage.py --models hf-llama --target cuda --out /tmp/coverage-gpu    # on a GPU

The models are built from Hugging Face transformers' own definitions (workloads/hf_models.py: default
or few-layer configs, random weights, nothing downloaded; the `hf` extra), each at a fixed shape.
Each runs in a fresh process of its own, stage by stage: build (PyTorch), import (torch.export and
TVM's importer), lower (the tuner's passes, its tasks counted), tune (``--trials-per-task``, compiled,
the tuner's own end-to-end check included), compare (outputs on the example inputs and on second
random ones against PyTorch: max|out - ref| / max|ref|; "wrong" above ``--tolerance``; "unchecked"
where the reference cannot tell: all zeros, constant, or blind to its input). The step's stderr is
what a user's terminal would show: lines of TVM's own logging found there are counted
(``leaked_log_lines``). Results go to OUT/coverage.jsonl as each model finishes (a rerun skips
those already there) and OUT/coverage.md (``--table`` writes it again from coverage.jsonl: rows merged from
another run, in HF_MODELS' order).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common.error_text import error_line  # noqa: E402
from experiments.correctness import TOLERANCE, _build, _compare, _degenerate, _other_input, _outputs  # noqa: E402
from experiments.harness import markdown_table, run_step  # noqa: E402

STAGES = ("build", "import", "lower", "tune", "compare")
STEP_TIMEOUT = 3600.0  # seconds a model may take, all stages together
# TVM's C++ log lines ("[16:02:11] /project/src/...cc:64: Warning: ...") and its "BlockBuilder destroyed ..."
TVM_LOG_LINE = re.compile(r"^\[\d\d:\d\d:\d\d\] \S+\.(cc|h):\d+:|BlockBuilder destroyed")


# -- one model, in a process of its own ---------------------------------------------------------------
def coverage_step(name: str, trials_per_task: int, work_dir: Path, tolerance: float, target_text: str = "llvm") -> dict:
    """Take ``name`` through the stages; the record says how far it got."""
    import torch

    from tuner import tune
    from tuner.quiet import native_logs_quiet
    from tuner.targets import resolve_target
    from tuner.tasks.extraction import extract_tasks, load_model, lower_workload

    record: dict = {"name": name, "stage": "build"}
    started = time.monotonic()

    def failed(err: BaseException) -> dict:
        line = f"{type(err).__name__}: {error_line(err)}"
        return {**record, "status": "failed", "error_line": line, "seconds": time.monotonic() - started}

    try:
        module, inputs, _, descriptions = _build({"kind": "hf", "name": name})
        record["description"] = descriptions[0]
        others = [_other_input(x, 1000 + i) for i, x in enumerate(inputs)]
        with torch.no_grad():
            refs, refs2 = _outputs(module(*inputs)), _outputs(module(*others))
        target = resolve_target(target_text)
        with native_logs_quiet():  # as tune() is: TVM's log lines go to a file, not the terminal
            record["stage"] = "import"
            workload = load_model(module, inputs)
            record["stage"] = "lower"
            record["tasks"] = len(extract_tasks(workload, target, lower_workload(workload, target)))
        record["stage"] = "tune"
        tuning = time.monotonic()
        result = tune(
            workload,
            target=target,
            trials_per_task=trials_per_task,
            batch_size=trials_per_task,  # every kernel gets its trials
            work_dir=work_dir,
            progress=False,
        )
        record["tune_seconds"] = time.monotonic() - tuning
        record["own_check"] = result.check.line() if result.check else None
        record["fell_back"] = {t.name: t.fell_back for t in result.tasks if t.fell_back}
        record["stage"] = "compare"
        outs, outs2 = _outputs(result.run(*inputs)), _outputs(result.run(*others))
    except Exception as err:  # noqa: BLE001 - every failure is a row of the table
        return failed(err)
    if len(outs) != len(refs):
        line = f"the compiled model returned {len(outs)} outputs, PyTorch {len(refs)}"
        return {**record, "status": "wrong", "error": float("inf"), "error_line": line}
    error = max(_compare(o, r) for o, r in zip(outs + outs2, refs + refs2, strict=True))
    degenerate = "; ".join(why for r, r2 in zip(refs, refs2, strict=True) if (why := _degenerate(r, r2)))
    status = "wrong" if error > tolerance else "unchecked" if degenerate else "match"
    return {
        **record,
        "stage": "done",
        "status": status,
        "error": error,
        "scale": max(float(r.abs().max()) for r in refs),
        "degenerate": degenerate,
        "seconds": time.monotonic() - started,
    }


# -- the driver ----------------------------------------------------------------------------------------
def run_model(name: str, args: argparse.Namespace, out: Path) -> dict:
    """The model's record, from a fresh process; its stderr is kept as the user would have seen it."""
    run_dir = out / "runs" / name
    run_dir.mkdir(parents=True, exist_ok=True)
    log = run_dir / "step.log"
    step = ["--step", name, "--trials-per-task", str(args.trials_per_task), "--work-dir", str(run_dir / "work")]
    step += ["--tolerance", str(args.tolerance), "--target", args.target]
    try:
        record = run_step(Path(__file__), step, log, timeout=STEP_TIMEOUT)
    except subprocess.TimeoutExpired:
        record = {"name": name, "status": "failed", "stage": "?", "error_line": f"timed out after {STEP_TIMEOUT:.0f} s"}
    except Exception:  # noqa: BLE001 - a process killed by a signal, a segfault, an abort
        last = error_line(log.read_text(errors="replace"), last=True)[:300] if log.exists() else ""
        record = {"name": name, "status": "failed", "stage": "?", "error_line": f"process died: {last}"}
    stderr = log.read_text(errors="replace").splitlines() if log.exists() else []
    record["leaked_log_lines"] = sum(bool(TVM_LOG_LINE.search(line)) for line in stderr)
    if not args.keep_work:  # a model's libraries and database run to hundreds of MB: keep its logs only
        for path in (run_dir / "work").glob("*"):
            if path.name != "logs":
                shutil.rmtree(path) if path.is_dir() else path.unlink()
    return record


def table(records: list[dict]) -> str:
    rows = [
        {
            "model": r["name"],
            "architecture": (r.get("description") or "").removeprefix("transformers "),
            "result": r["status"] if r["status"] != "failed" else f"failed at {r['stage']}",
            "tasks": r.get("tasks", ""),
            "tune (s)": f"{r['tune_seconds']:.0f}" if r.get("tune_seconds") else "",
            "error": f"{r['error']:.1e}" if r.get("error") is not None else "",
            "TVM log lines shown": r.get("leaked_log_lines", ""),
            "why": (r.get("error_line") or r.get("degenerate") or "").replace("|", "/")[:160],
        }
        for r in records
    ]
    counts = {s: sum(r["status"] == s for r in records) for s in ("match", "unchecked", "wrong", "failed")}
    head = (
        f"{len(records)} models: " + ", ".join(f"{n} {s}" for s, n in counts.items()) + f"; TVM log lines on the "
        f"terminal: {sum(r.get('leaked_log_lines', 0) for r in records)}"
    )
    columns = ["model", "architecture", "result", "tasks", "tune (s)", "error", "TVM log lines shown", "why"]
    return head + "\n\n" + markdown_table(rows, columns)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", default=None, help="workloads/hf_models.py names (default: all)")
    parser.add_argument("--trials-per-task", type=int, default=1)
    parser.add_argument("--tolerance", type=float, default=TOLERANCE, help=f"default {TOLERANCE:g} (fp32)")
    parser.add_argument("--target", default="llvm", help="'llvm' (this CPU, the default) or 'cuda'")
    parser.add_argument("--out", default="experiments/results/model_coverage")
    parser.add_argument("--keep-work", action="store_true", help="keep each model's work dir (its library, database)")
    parser.add_argument(
        "--table", action="store_true", help="rewrite OUT/coverage.md from OUT/coverage.jsonl, run nothing"
    )
    parser.add_argument("--step", help=argparse.SUPPRESS)  # internal: one model, in its own process
    parser.add_argument("--work-dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.step:
        work_dir = Path(args.work_dir)
        print(json.dumps(coverage_step(args.step, args.trials_per_task, work_dir, args.tolerance, args.target)))
        return
    from workloads.hf_models import HF_MODELS

    names = args.models or list(HF_MODELS)
    unknown = [n for n in names if n not in HF_MODELS]
    if unknown:
        raise SystemExit(f"unknown models {unknown}: choose from {' '.join(HF_MODELS)}")
    out = Path(args.out).resolve()  # the steps run from the repository root
    out.mkdir(parents=True, exist_ok=True)
    results = out / "coverage.jsonl"
    earlier = [json.loads(line) for line in results.read_text().splitlines()] if results.exists() else []
    done = {record["name"]: record for record in earlier}
    for name in names:
        if name in done or args.table:
            continue
        record = run_model(name, args, out)
        with open(results, "a") as f:
            f.write(json.dumps(record) + "\n")
        done[name] = record
        print(f"{name}: {record['status']} ({record.get('stage')}) {record.get('error_line', '')}".rstrip(), flush=True)
    text = table([done[n] for n in names if n in done])  # --table: the models with a row
    (out / "coverage.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
