"""Correctness suite: tune many small random PyTorch graphs (experiments/random_graphs.py), Hugging
Face architectures (workloads/hf_models.py) and the built-in zoo, and check every compiled output
against PyTorch's.

    .venv/bin/python experiments/correctness.py --graphs 40 --models all --zoo --out /tmp/corr
    .venv/bin/python experiments/correctness.py --graphs 4 --per-bundle 4 --seeds 1 --trials-per-task 1 --out /tmp/c
    .venv/bin/python experiments/correctness.py --graphs 50 --dtype bfloat16 --seeds 1 --out /tmp/corr-bf16
    .venv/bin/python experiments/correctness.py --graphs 100 --seeds 1 --trials-per-task 0 --out /tmp/corr-0

Random graphs are tuned ``--per-bundle`` at a time (one module, one input and one output per graph:
TVM's start-up costs ~20 s per tune() call). A graph of a bundle that comes out wrong, or every
graph of a bundle that crashes, is then tuned again alone (``--no-isolate``: not), so that its
record names its own kernels and a crash is pinned on the graph that causes it.

Each tune() runs, with its comparison, in a fresh process (``common.run_step``), in a work dir of its
own under OUT/runs/ (a rerun resumes it). Compiled outputs are compared with PyTorch on the example
inputs and on a second random input: error = max|out - ref| / max|ref| per output (the largest over
outputs and inputs); wrong if above ``--tolerance`` (1e-4, fp32); unchecked (degenerate) if the
reference is all zeros or constant or does not change with the input. In bf16 each record also
holds PyTorch autocast's own error on the same inputs (``autocast_error``: what bf16 alone does to
that graph): an error above the tolerance within 1.5x of it is bf16's rounding, a match; the summary
says where ours is above autocast's. One JSON line per graph or model goes to
OUT/results.jsonl as soon as it is known; a rerun skips what it already holds.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common.error_text import error_line  # noqa: E402
from experiments.harness import prepare_comparison, run_step  # noqa: E402

TOLERANCE = 1e-4
BF16_TOLERANCE = 3e-2  # the tuner's own end-to-end tolerance in bf16: its inputs are rounded to 8 bits
# above the tolerance, an error within this factor of PyTorch autocast's own is bf16's (the issue's
# measure against OpenVINO's default): an average over a graph's output cancels to below its terms
BF16_OWN_FACTOR = 1.5


def tolerance_of(args: argparse.Namespace) -> float:
    if args.tolerance is not None:
        return args.tolerance
    return BF16_TOLERANCE if args.dtype == "bfloat16" else TOLERANCE


STATUSES = ("match", "wrong", "unchecked", "crashed")


@dataclass(frozen=True)
class Job:
    """One tune() call: ``kind`` "graphs" (random graphs ``seeds`` bundled), "hf" or "zoo"."""

    kind: str
    name: str
    graph_seeds: tuple[int, ...] = field(default_factory=tuple)

    def args(self) -> list[str]:
        return ["--step", json.dumps({"kind": self.kind, "name": self.name, "graphs": list(self.graph_seeds)})]


def graph_name(seed: int) -> str:
    return f"graph-{seed}"


# -- the step: one tune() call and its comparison, in a process of its own --------------------------
def _build(job: dict) -> tuple[Any, list, list[str], list[str]]:
    """(module, inputs, the names of its outputs' owners, their descriptions)."""
    if job["kind"] == "graphs":
        from experiments.random_graphs import bundle, describe

        module, inputs = bundle(job["graphs"])
        return module, inputs, [graph_name(s) for s in job["graphs"]], [describe(s) for s in job["graphs"]]
    if job["kind"] == "hf":
        from workloads.hf_models import HF_MODELS

        module, inputs = HF_MODELS[job["name"]]()
        return module, inputs, [job["name"]], [f"transformers {type(module.model).__name__}"]
    from workloads.models import MODELS, torch_model  # the zoo model's module and input, as vs_frameworks.py

    module, example = torch_model(job["name"])
    source = next(s.source for s in MODELS if s.name == job["name"])
    return module, [example], [job["name"]], [source]


def _outputs(out: Any) -> list:
    return list(out) if isinstance(out, tuple | list) else [out]


def verdict(error: float, tolerance: float, autocast_error: float | None, degenerate: bool) -> str:
    """``wrong`` above the tolerance, unless (in bf16) within ``BF16_OWN_FACTOR`` of PyTorch
    autocast's own error on the same inputs: bf16's rounding, not the build's."""
    bf16s_own = autocast_error is not None and error <= BF16_OWN_FACTOR * autocast_error
    if error > tolerance and not bf16s_own:
        return "wrong"
    return "unchecked" if degenerate else "match"


def autocast_outputs(module: Any, *input_sets: list) -> list[list]:
    """PyTorch's own bf16 outputs (``torch.autocast``, in fp32) on each set of inputs: how far bf16
    alone moves the outputs of this module, beside which a bf16 build's error is read."""
    import torch

    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        return [[o.float() for o in _outputs(module(*inputs))] for inputs in input_sets]


def _other_input(x: Any, seed: int) -> Any:
    """A second input like ``x``: new random values (integers within ``x``'s range; a constant
    integer tensor such as an all-ones attention mask stays as it is)."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    if x.is_floating_point():
        return torch.randn(x.shape, generator=generator, dtype=x.dtype)
    low, high = int(x.min()), int(x.max())
    return x.clone() if low == high else torch.randint(low, high + 1, x.shape, generator=generator, dtype=x.dtype)


def _compare(got: Any, ref: Any) -> float:
    """max|got - ref| / max|ref|, as vs_frameworks.py measures (inf where not finite or mis-shaped)."""
    import numpy as np

    from experiments.frameworks import relative_error

    got = np.asarray(got.detach().cpu().numpy() if hasattr(got, "detach") else got)  # a GPU model: torch on cuda
    if not np.all(np.isfinite(got)):
        return float("inf")
    error = relative_error(got, ref.detach().numpy().astype(np.float64))
    return error if np.isfinite(error) else float("inf")


def _degenerate(ref: Any, ref2: Any) -> str:
    """Why the reference output cannot tell a right compiled output from a wrong one ('' if it can)."""
    scale = float(ref.abs().max())
    if scale < 1e-6:
        return "reference all zeros"
    if float(ref.max() - ref.min()) <= 1e-6 * scale:
        return "reference constant"
    if float((ref - ref2).abs().max()) <= 1e-6 * scale:
        return "reference does not change with the input"
    return ""


def check_step(
    job: dict, seed: int, trials_per_task: int, work_dir: Path, tolerance: float, dtype: str = "float32"
) -> list[dict]:
    """Tune the job's module, run it on its inputs and on second ones, and compare with PyTorch: one
    record per graph (random graphs) or one for the model."""
    import torch

    started = time.monotonic()
    module, inputs, owners, descriptions = _build(job)
    base = [
        {"name": n, "kind": job["kind"], "seed": seed, "description": d}
        for n, d in zip(owners, descriptions, strict=True)
    ]
    others = [_other_input(x, 1000 + i) for i, x in enumerate(inputs)]
    with torch.no_grad():
        refs, refs2 = _outputs(module(*inputs)), _outputs(module(*others))
    autocast = autocast_outputs(module, inputs, others) if dtype == "bfloat16" else None
    try:
        from tuner import tune

        model = job["name"] if job["kind"] == "zoo" else module
        result = tune(
            model,
            example_inputs=None if job["kind"] == "zoo" else inputs,
            target="llvm",
            trials_per_task=trials_per_task,
            dtype=dtype,
            # every kernel gets its trials: the point is to try schedules everywhere (0: analytic schedules only)
            batch_size=trials_per_task or None,
            work_dir=work_dir,
            seed=seed,
            progress=False,
        )
        outs, outs2 = _outputs(result.run(*inputs)), _outputs(result.run(*others))
    except Exception as err:  # noqa: BLE001 - every failure is a result of the suite
        line = f"{type(err).__name__}: {error_line(err)}"
        return [{**b, "status": "crashed", "error_line": line, "seconds": time.monotonic() - started} for b in base]
    tasks = result.tasks
    kernels = {
        "kernels": len(tasks),
        "unverified": sum(t.verified is not True for t in tasks),
        "failed_verification": [t.name for t in tasks if t.verified is False],
        "fell_back": {t.name: t.fell_back for t in tasks if t.fell_back},
        "own_check": result.check.line() if result.check else None,
    }
    if len(outs) != len(refs):
        line = f"the compiled model returned {len(outs)} outputs, PyTorch {len(refs)}"
        return [{**b, "status": "wrong", "error": float("inf"), "error_line": line, **kernels} for b in base]
    # a bundle's graph i owns output i; a model owns them all
    groups = [[i] for i in range(len(refs))] if job["kind"] == "graphs" else [list(range(len(refs)))]
    records = []
    for record, group in zip(base, groups, strict=True):
        errors = [_compare(outs[i], refs[i]) for i in group]
        errors2 = [_compare(outs2[i], refs2[i]) for i in group]
        degenerate = [why for i in group if (why := _degenerate(refs[i], refs2[i]))]
        error = max(errors + errors2)
        if autocast is not None:
            pairs = zip(autocast, (refs, refs2), strict=True)
            record = {**record, "autocast_error": max(_compare(o[i], r[i]) for o, r in pairs for i in group)}
        status = verdict(error, tolerance, record.get("autocast_error"), bool(degenerate))
        records.append(
            {
                **record,
                "status": status,
                "error": error,
                "errors": errors,
                "errors_second_input": errors2,
                "scale": max(float(refs[i].abs().max()) for i in group),
                "degenerate": "; ".join(degenerate),
                **kernels,
                # the kernels of a graph tuned alone (or of a model) name where to look
                **({"kernel_names": [t.name for t in tasks]} if status == "wrong" else {}),
                "seconds": time.monotonic() - started,
            }
        )
    return records


# -- the driver -------------------------------------------------------------------------------------
def _jobs(args: argparse.Namespace) -> list[Job]:
    seeds = list(range(args.graphs))
    jobs = [
        Job("graphs", f"graphs-{chunk[0]}-{chunk[-1]}", tuple(chunk))
        for chunk in (seeds[i : i + args.per_bundle] for i in range(0, len(seeds), args.per_bundle))
    ]
    if args.models:
        from workloads.hf_models import HF_MODELS

        names = list(HF_MODELS) if args.models == ["all"] else args.models
        unknown = [n for n in names if n not in HF_MODELS]
        if unknown:
            raise SystemExit(f"unknown HF models {unknown}: choose from {' '.join(HF_MODELS)} or all")
        jobs += [Job("hf", n) for n in names]
    if args.zoo is not None:
        from workloads import list_workloads

        zoo = [e.name for e in list_workloads() if e.category == "model"]
        jobs += [Job("zoo", n) for n in (args.zoo or zoo)]
    return jobs


def run_job(job: Job, seed: int, args: argparse.Namespace, out: Path) -> list[dict]:
    """The job's records, from a fresh process; a process that dies is recorded as crashed."""
    run_dir = out / "runs" / f"{job.name}-seed{seed}"
    run_dir.mkdir(parents=True, exist_ok=True)
    step = [*job.args(), "--seed", str(seed), "--trials-per-task", str(args.trials_per_task)]
    step += ["--work-dir", str(run_dir / "work"), "--tolerance", str(tolerance_of(args)), "--dtype", args.dtype]
    try:
        return run_step(Path(__file__), step, run_dir / "step.log")["records"]
    except Exception as err:  # noqa: BLE001 - a process killed by a signal, a segfault, an abort
        log = (run_dir / "step.log").read_text(errors="replace") if (run_dir / "step.log").exists() else ""
        line = f"process died: {error_line(err)}; last line of its log: {error_line(log, last=True)[:300]}"
        owners = [graph_name(s) for s in job.graph_seeds] or [job.name]
        return [{"name": n, "kind": job.kind, "seed": seed, "status": "crashed", "error_line": line} for n in owners]


def _record(results: Path, record: dict, done: set) -> None:
    with open(results, "a") as f:
        f.write(json.dumps(record) + "\n")
    done.add((record["name"], record["seed"]))
    error = f" error {record['error']:.2e}" if record.get("error") is not None else ""
    why = f": {record['error_line']}" if record.get("error_line") else ""
    print(f"{record['name']} (seed {record['seed']}): {record['status']}{error}{why}", flush=True)


def _final(records: list[dict]) -> list[dict]:
    """One record per (name, seed): the last written (a graph tuned alone replaces its bundle's)."""
    last = {(r["name"], r["seed"]): r for r in records}
    return list(last.values())


def _against_autocast(final: list[dict]) -> list[str]:
    """In bf16: the largest error beside PyTorch autocast's on the same graphs, and where ours is above."""
    paired = [r for r in final if r.get("autocast_error") is not None and r.get("error") is not None]
    if not paired:
        return []
    ours, theirs = max(paired, key=lambda r: r["error"]), max(r["autocast_error"] for r in paired)
    # below fp32's own rounding a graph has no bf16 operation to compare (autocast leaves pools alone)
    floor = 1e-6
    above = sorted(
        (r["error"] / max(r["autocast_error"], floor), r["name"])
        for r in paired
        if r["error"] > max(r["autocast_error"], floor)
    )
    worst = f", at most {above[-1][0]:.2f}x ({above[-1][1]})" if above else ""
    return [
        f"bf16: largest error {ours['error']:.2e} ({ours['name']}); PyTorch autocast's largest {theirs:.2e}; "
        f"ours above autocast's on {len(above)} of {len(paired)}{worst}"
    ]


def summary(records: list[dict]) -> str:
    final = _final(records)
    graphs = {r["name"] for r in final if r["kind"] == "graphs"}
    models = {r["name"] for r in final if r["kind"] != "graphs"}
    counts = {s: sum(r["status"] == s for r in final) for s in STATUSES}
    lines = [
        f"graphs tried: {len(graphs)}, models tried: {len(models)}, checks (graph or model x seed): {len(final)}",
        ", ".join(f"{s}: {counts[s]}" for s in STATUSES),
    ]
    lines += _against_autocast(final)
    for r in sorted(final, key=lambda r: (STATUSES.index(r["status"]), r["name"], r["seed"])):
        if r["status"] == "match":
            continue
        detail = r.get("error_line") or r.get("degenerate") or ""
        error = f" error {r['error']:.2e} (scale {r.get('scale', 0):.3g})" if r.get("error") is not None else ""
        kernels = f"; kernels {r['kernel_names']}" if r.get("kernel_names") else ""
        lines.append(f"- {r['status']}: {r['name']} seed {r['seed']}{error} {detail}{kernels}".rstrip())
        if r.get("description"):
            lines.append(f"    {r['description']}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--graphs", type=int, default=0, help="random graphs: seeds 0..N-1")
    parser.add_argument("--per-bundle", type=int, default=10, help="random graphs per tune() call")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2], help="tuning seeds")
    parser.add_argument("--trials-per-task", type=int, default=2)
    parser.add_argument("--models", nargs="*", default=[], help="workloads/hf_models.py models, or all")
    parser.add_argument("--zoo", nargs="*", default=None, help="built-in zoo models (no names: all of them)")
    parser.add_argument(
        "--tolerance",
        type=float,
        help=f"largest relative error of a match (default {TOLERANCE:g}; bf16 {BF16_TOLERANCE:g})",
    )
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"), help="tune(dtype=...)")
    parser.add_argument("--no-isolate", action="store_true", help="do not tune a failing bundle's graphs alone")
    parser.add_argument("--out", default="experiments/results/correctness")
    parser.add_argument("--step", help=argparse.SUPPRESS)  # internal: one tune() call and its comparison
    parser.add_argument("--seed", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--work-dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.step:
        records = check_step(
            json.loads(args.step), args.seed, args.trials_per_task, Path(args.work_dir), tolerance_of(args), args.dtype
        )
        print(json.dumps({"records": records}))
        return
    out, _ = prepare_comparison(args.out, "llvm")  # pins TVM's threads to the target's cores
    results = out / "results.jsonl"
    previous = (
        [json.loads(line) for line in results.read_text().splitlines() if line.strip()] if results.exists() else []
    )
    done = {(r["name"], r["seed"]) for r in previous}
    written: list[dict] = list(previous)
    for job in _jobs(args):
        for seed in args.seeds:
            owners = [graph_name(s) for s in job.graph_seeds] or [job.name]
            if all((n, seed) in done for n in owners):
                continue
            records = run_job(job, seed, args, out)
            for record in records:
                _record(results, record, done)
            written += records
            if job.kind != "graphs" or args.no_isolate or len(job.graph_seeds) == 1:
                continue
            crashed = all(r["status"] == "crashed" for r in records)
            again = [r for r in records if r["status"] == "wrong" or (crashed and r["status"] == "crashed")]
            for record in again:
                graph = int(record["name"].removeprefix("graph-"))
                alone = run_job(Job("graphs", f"graph-{graph}", (graph,)), seed, args, out)
                for r in alone:
                    r["in_bundle"] = {"bundle": job.name, "status": record["status"], "error": record.get("error")}
                    _record(results, r, done)
                written += alone
    text = summary(written)
    (out / "summary.txt").write_text(text + "\n")
    print("\n" + text)


if __name__ == "__main__":
    main()
