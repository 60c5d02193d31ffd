"""Tuned models against what a user runs today: for each zoo model and a set of operators, tune with
a stated budget, then time side by side in one process, on the same input with the same threads,
the tuned model, PyTorch eager, torch.compile and ONNX Runtime, with every output checked against
PyTorch's; TVM untuned is the latency tune() measured before tuning (often orders of magnitude
slower: timing it again here would take longer than the rest for the big models). Per kernel: its
latency, FLOPs and bytes, its fraction of this machine's measured limits
(experiments/machine_limits.py) and the time of the matching PyTorch operator.

    .venv/bin/python experiments/vs_frameworks.py                      # the whole zoo and the operators
    .venv/bin/python experiments/vs_frameworks.py --models resnet18 --operators
    .venv/bin/python experiments/vs_frameworks.py --quick              # CI: tiny-resnet, one operator, a few trials
    .venv/bin/python experiments/vs_frameworks.py --retime             # time again what the last run tuned
    python3 experiments/vs_frameworks.py --target cuda --models resnet18 bert-base   # on a GPU host, fp16

On a GPU (``--target cuda``) the models run in fp16 (``--dtype``), every contender on the GPU and
synchronised after each call; the machine's limits are cuBLAS's fp16 GEMM and a device copy.

Writes vs_frameworks.csv, kernels.csv, vs_frameworks.md and vs_frameworks.png into --out. Tuning
work dirs go to OUT/runs/ (a rerun resumes them: nothing is measured twice). Each workload is tuned,
then timed, in fresh processes of their own.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from experiments.common import markdown_table, prepare_comparison, run_step, write_csv  # noqa: E402
from measure.error_text import error_line  # noqa: E402

ZOO = [
    "attention-block",
    "resnet18",
    "squeezenet1.1",
    "mobilenetv2",
    "resnet50",
    "convnext-t",
    "bert-base",
    "llama3-8b-layer",
]
_PREPACKED = "_prepacked"  # the suffix a kernel takes in the model when its weights' layout is rewritten
FRAMEWORKS = ["PyTorch eager", "torch.compile", "ONNX Runtime"]
GEMM_KINDS = ("conv2d", "matmul", "dense")
TUNED_FILE = "tuned.json"  # in a workload's run dir: what its tuning step returned
TIMED_FILE = "timed.json"  # and what its timing step measured, round by round


@dataclass(frozen=True)
class Setting:
    """Where the comparison runs, and in what precision."""

    target: str = "llvm"  # or "cuda"
    dtype: str = "float32"

    @property
    def on_gpu(self) -> bool:
        return self.target == "cuda"

    def args(self) -> list[str]:
        return ["--target", self.target, "--dtype", self.dtype]


def _module_and_example(name: str):
    from experiments.operator_modules import OPERATORS
    from workloads.models import torch_model

    if name in OPERATORS:
        return OPERATORS[name].module_and_example()
    return torch_model(name)


def _placed(module, example, setting: Setting):
    """The module and input as PyTorch runs them in this setting: in its precision, on its device."""
    import torch

    device, dtype = ("cuda" if setting.on_gpu else "cpu"), getattr(torch, setting.dtype)
    # token ids (BERT's input) stay integers
    example = example.to(device=device, dtype=dtype) if example.is_floating_point() else example.to(device=device)
    return module.to(device=device, dtype=dtype), example


# -- tuning, one fresh process per workload --------------------------------------------------------
def tune_step(name: str, trials_per_task: int, work_dir: Path, seed: int, setting: Setting) -> dict:
    from tuner import tune
    from workloads.models import MODELS

    if name in {spec.name for spec in MODELS}:
        model, inputs = name, None
    else:
        module, example = _module_and_example(name)
        model, inputs = module, [example]
    result = tune(
        model,
        target=setting.target,
        example_inputs=inputs,
        dtype=setting.dtype,  # fp16: convolutions and matmuls in half precision, the input stays float32
        trials_per_task=trials_per_task,
        work_dir=work_dir,
        seed=seed,
    )
    return {
        "artifact": str(result.artifact_path),
        "untuned_latency": result.latency_before,
        "trials": result.trials,
        "tuning_seconds": sum(v for k, v in result.seconds.items() if k != "compile and time"),
        "tasks": [
            {
                "name": t.name,
                "launches": t.weight,
                "flops": t.flops,
                "bytes": t.bytes,
                "latency": t.best_latency,
                "trials": t.trials,
            }
            for t in result.tasks
        ],
    }


# -- timing, one fresh process per workload, every contender in it ----------------------------------
def time_workload(name: str, tuned: dict, threads: int, run_dir: Path, quick: bool, setting: Setting) -> dict:
    import torch

    from experiments import frameworks as fw
    from tuner.runtime import CompiledModel, ModelDescription

    torch.set_num_threads(threads)
    module, example = _placed(*_module_and_example(name), setting)
    description = ModelDescription.read(Path(tuned["artifact"]))
    tuned_input = example.to(getattr(torch, description.inputs[0].dtype))  # a mixed-precision model takes float32
    contenders = [
        fw.tvm_model("tuned", Path(tuned["artifact"]), description, tuned_input),
        fw.torch_eager(module, example),
        *([] if quick else [fw.torch_compiled(module, example)]),
        fw.onnx_runtime(module, example, threads, run_dir),
    ]
    if setting.on_gpu:
        fw.synchronize_each_call(contenders)
    eager = next(c for c in contenders if c.name == "PyTorch eager")
    reference = fw.reference_output(eager)
    errors = {c.name: fw.relative_error(c.call(), reference) for c in contenders if c.call is not None}
    # ten short rounds rather than five long ones: a shared VM's thread placement can change during
    # the timing (experiments/cross_core.py), and each round's ratio shows whether it did
    fw.time_interleaved(contenders, rounds=2 if quick else 10, seconds_per_round=0.1 if quick else 0.3)
    in_model = CompiledModel(Path(tuned["artifact"]), description).kernel_times(tuned_input, runs=2 if quick else 10)
    return {
        "latency": {c.name: c.median for c in contenders},
        # each kernel's time inside the model: the tuning timed it alone, its data in cache
        "kernels_in_model": {name.removesuffix(_PREPACKED): seconds for name, seconds in in_model.items()},
        "rounds": {c.name: c.round_medians for c in contenders if c.call},
        "missing": {c.name: c.missing for c in contenders if c.missing},
        "errors": errors,
        "output_scale": float(abs(reference).max()),  # what the errors are relative to
        "torch_ops": torch_op_times(module, example, runs=2 if quick else 5, gpu=setting.on_gpu),
    }


def torch_op_times(module, example, runs: int, gpu: bool = False) -> list[tuple[str, float, float]]:
    """(operator, FLOPs, seconds per call) of PyTorch's GEMM-like operators in eager mode, from its
    profiler: inclusive CPU time, or on a GPU the time of the kernels each launched."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if gpu else [])]
    with torch.inference_mode():
        module(example)
        with profile(activities=activities, with_flops=True) as prof:
            for _ in range(runs):
                module(example)
    wanted = {"aten::conv2d", "aten::addmm", "aten::mm", "aten::bmm", "aten::baddbmm"}
    return [
        (e.name, float(e.flops), (e.device_time_total if gpu else e.cpu_time_total) / 1e6)
        for e in prof.events()
        if e.name in wanted and e.flops
    ]


def matching_torch_time(flops: float, ops: list[tuple[str, float, float]]) -> float | None:
    """Median time of PyTorch's operators whose FLOPs are within 10% of this kernel's (a fused
    kernel counts its epilogue's few operations too)."""
    times = [seconds for _, op_flops, seconds in ops if op_flops and abs(op_flops - flops) <= 0.1 * flops]
    return statistics.median(times) if times else None


# -- tables ---------------------------------------------------------------------------------------
def _ms(seconds: float | None) -> str:
    return f"{seconds * 1e3:.3f}" if seconds else "-"


def model_row(name: str, tuned: dict, timed: dict, limits) -> dict:
    latency = timed["latency"]
    best = min((f for f in FRAMEWORKS if latency.get(f)), key=latency.get, default=None)
    ratio = latency["tuned"] / latency[best] if latency.get("tuned") and best else None
    floor = arithmetic_floor(tuned, limits.peak_gflops)
    floor_ratio = floor / latency[best] if floor and best else None
    row = {
        "workload": name,
        "tasks": len(tuned["tasks"]),
        "trials": tuned["trials"],
        "tuning (s)": f"{tuned['tuning_seconds']:.0f}",
        "tuned (ms)": _ms(latency.get("tuned")),
        "TVM untuned (ms)": _ms(tuned.get("untuned_latency")),
        **{f"{f} (ms)": _ms(latency.get(f)) for f in FRAMEWORKS},
        "tuned / best": f"{ratio:.2f}" if ratio else "-",
        "by round": _ratio_range(timed, best),
        "FLOPs at peak / best": f"{floor_ratio:.2f}" if floor_ratio else "-",
        "kernels alone (ms)": _ms(sum(t["launches"] * t["latency"] for t in tuned["tasks"] if t["latency"])),
        "kernels in model (ms)": _ms(sum(timed.get("kernels_in_model", {}).values())),
        "tuned error": f"{timed['errors'].get('tuned', float('nan')):.1e}",
        "of outputs up to": f"{timed['output_scale']:.3g}" if "output_scale" in timed else "-",
        "_ratio": ratio,
        "_floor_ratio": floor_ratio,
    }
    return row


def arithmetic_floor(tuned: dict, peak_gflops: float) -> float:
    """The seconds the model's kernels take if every one of them computes at the machine's peak: a
    lower bound on the latency of this lowering, whose kernels do these FLOPs. (Not the roofline's
    memory term: measured alone or in a model, small activations come from cache, faster than the
    copy bandwidth.) A kernel left without a tuned schedule counts too: the model still runs it."""
    return sum(t["launches"] * t["flops"] for t in tuned["tasks"]) / (peak_gflops * 1e9)


def _ratio_range(timed: dict, best: str | None) -> str:
    """The lowest and highest tuned / ``best`` ratio over the rounds (``best``: the fastest framework
    over all of them)."""
    per_round = timed.get("rounds", {})
    if not best or "tuned" not in per_round or best not in per_round:
        return "-"
    ratios = [t / b for t, b in zip(per_round["tuned"], per_round[best], strict=True)]
    low, high = f"{min(ratios):.2f}", f"{max(ratios):.2f}"
    return low if low == high else f"{low}-{high}"


def kernel_rows(name: str, tuned: dict, timed: dict, limits) -> list[dict]:
    total = sum(t["launches"] * t["latency"] for t in tuned["tasks"] if t["latency"])
    rows = []
    for t in tuned["tasks"]:
        latency = t["latency"]
        if not latency:
            continue
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
                "% of peak": f"{t['flops'] / latency / 1e9 / limits.peak_gflops:.0%}",
                "% of roofline": f"{bound / latency:.0%}",
                "bound by": "compute"
                if t["flops"] / (limits.peak_gflops * 1e9) >= t["bytes"] / (limits.copy_gbs * 1e9)
                else "memory",
                "PyTorch op (us)": f"{torch_time * 1e6:.1f}" if torch_time else "-",
                "_gemm": _is_gemm(t["name"]),
                "_peak_fraction": t["flops"] / latency / 1e9 / limits.peak_gflops,
                "_roofline_fraction": bound / latency,
            }
        )
    return rows


def _is_gemm(kernel: str) -> bool:
    return any(kind in kernel for kind in GEMM_KINDS)


def _public(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if not k.startswith("_")} for row in rows]


def summary(models: list[dict], kernels: list[dict], limits, trials_per_task: int) -> str:
    ratios = [r["_ratio"] for r in models if r["_ratio"]]
    floors = [r["_floor_ratio"] for r in models if r["_ratio"] and r["_floor_ratio"]]
    gemm = sorted(k["_peak_fraction"] for k in kernels if k["_gemm"])
    low = [k for k in kernels if k["_roofline_fraction"] < 0.10]
    lines = [
        "# Tuned models against PyTorch, torch.compile and ONNX Runtime",
        "",
        limits.describe(),
        f"Budget: {trials_per_task} trials per task (allocated by the gradient scheduler); `tuning (s)` sums every "
        "session that tuned a work dir. Latencies are medians of interleaved calls in one process, inputs as torch "
        "tensors; `tuned error` is the largest deviation from PyTorch eager's output relative to its largest value, "
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
        markdown_table(_public(models), [k for k in models[0] if not k.startswith("_")])
        if models
        else "(no workload finished)",
        "",
    ]
    if ratios:
        lines.append(
            f"Geometric mean of tuned / best framework: {statistics.geometric_mean(ratios):.2f} over "
            f"{len(ratios)} workloads"
            + (f"; at the FLOPs' peak: {statistics.geometric_mean(floors):.2f}." if len(floors) == len(ratios) else ".")
        )
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


def plot(models: list[dict], timed: dict[str, dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [m["workload"] for m in models]
    series = ["tuned", *FRAMEWORKS]
    fig, ax = plt.subplots(figsize=(max(6, len(names) * 1.2), 4))
    width = 0.8 / len(series)
    for i, name in enumerate(series):
        values = []
        for workload in names:
            latency = timed[workload]["latency"]
            best = min((latency[f] for f in FRAMEWORKS if latency.get(f)), default=None)
            values.append(latency[name] / best if latency.get(name) and best else 0)
        ax.bar([x + i * width for x in range(len(names))], values, width, label=name)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(names))], names, rotation=30, ha="right")
    ax.set_ylabel("latency / best framework")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def _tuned(name: str, run_dir: Path, args: argparse.Namespace) -> dict:
    """The tuning step's outcome: from a fresh tune() (which resumes the work dir), or with
    ``--retime`` from the last one's record."""
    record = run_dir / TUNED_FILE
    if args.retime and record.exists():
        return json.loads(record.read_text())
    step = ["--tune", name, "--work-dir", str(run_dir), "--trials-per-task", str(args.trials_per_task)]
    tuned = run_step(Path(__file__), [*step, "--seed", str(args.seed), *_setting(args).args()], run_dir / "tune.log")
    if record.exists():  # a resumed work dir: its tuning time is that of every session, not only this one
        tuned["tuning_seconds"] += json.loads(record.read_text())["tuning_seconds"]
    record.write_text(json.dumps(tuned) + "\n")
    return tuned


def _setting(args: argparse.Namespace) -> Setting:
    return Setting(args.target, args.dtype or ("float16" if args.target == "cuda" else "float32"))


def _torch_sees_a_gpu() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def _limits(setting: Setting, threads: int):
    from experiments.machine_limits import measure, measure_gpu

    return measure_gpu(setting.dtype) if setting.on_gpu else measure(threads)


def main() -> None:
    from experiments.operator_modules import OPERATORS

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", default=None, help=f"zoo models (default: {' '.join(ZOO)})")
    parser.add_argument(
        "--operators", nargs="*", default=None, help=f"operators (with no names: all of {' '.join(OPERATORS)})"
    )
    parser.add_argument("--trials-per-task", type=int, default=64)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", default=None, help="default: experiments/results/vs_frameworks (/cuda on a GPU)")
    parser.add_argument("--target", choices=["llvm", "cuda"], default="llvm", help="this CPU, or the GPU in fp16")
    parser.add_argument("--dtype", default=None, help="the models' precision (default: float32, float16 on cuda)")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="tiny-resnet and one operator, 4 trials per task, short timing, no torch.compile",
    )
    parser.add_argument(
        "--retime",
        action="store_true",
        help="time again what earlier runs tuned (OUT/runs/NAME/tuned.json) without running tune() again",
    )
    parser.add_argument("--tune", help=argparse.SUPPRESS)  # internal: the tuning step of one workload
    parser.add_argument("--time", help=argparse.SUPPRESS)  # internal: the timing step of one workload
    parser.add_argument("--work-dir", help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    setting = _setting(args)
    if setting.on_gpu and not _torch_sees_a_gpu():
        parser.error("--target cuda compares on a GPU: torch sees none here (a GPU host with torch built with CUDA)")
    if args.tune:
        print(json.dumps(tune_step(args.tune, args.trials_per_task, Path(args.work_dir), args.seed, setting)))
        return
    if args.time:
        run_dir = Path(args.work_dir)
        tuned = json.loads((run_dir / TUNED_FILE).read_text())
        timed = time_workload(args.time, tuned, args.threads, run_dir, args.quick, setting)
        (run_dir / TIMED_FILE).write_text(json.dumps(timed) + "\n")  # each round's latencies, kept for a closer look
        print(json.dumps(timed))
        return
    default_out = "experiments/results/vs_frameworks" + ("/cuda" if setting.on_gpu else "")
    if args.quick:
        args.models, args.operators, args.trials_per_task = ["tiny-resnet"], ["op-softmax-bert"], 4
        default_out += "/quick"
    args.out = args.out or default_out
    # neither given: the zoo and every operator; one given: only that; --operators without names: every operator
    models = args.models if args.models is not None else (ZOO if args.operators is None else [])
    operators = (
        (args.operators or list(OPERATORS))
        if args.operators is not None
        else ([] if args.models is not None else list(OPERATORS))
    )
    out, target = prepare_comparison(args.out, setting.target)
    threads = int(target.attrs["num-cores"]) if not setting.on_gpu else (os.cpu_count() or 1)
    limits = _limits(setting, threads)
    print(json.dumps(limits.as_dict()), flush=True)
    model_rows, all_kernels, timed_all, failures = [], [], {}, []
    for name in [*models, *operators]:
        run_dir = out / "runs" / name
        run_dir.mkdir(parents=True, exist_ok=True)
        try:
            tuned = _tuned(name, run_dir, args)
            # each workload timed in a process of its own: runtimes loaded for earlier workloads (their
            # thread pools, their memory) must not weigh on later ones
            quick = ["--quick"] if args.quick else []
            timing = ["--time", name, "--work-dir", str(run_dir), "--threads", str(threads), *quick, *setting.args()]
            timed = run_step(Path(__file__), timing, run_dir / "time.log")
        except Exception as err:  # noqa: BLE001 - one workload failing must not lose the others' numbers
            print(f"{name}: failed, left out of the tables: {err}", flush=True)
            failures.append(f"{name}: {error_line(err)}")
            continue
        timed_all[name] = timed
        model_rows.append(model_row(name, tuned, timed, limits))
        all_kernels += kernel_rows(name, tuned, timed, limits)
        for framework, why in timed["missing"].items():
            print(f"{name}: {framework} unavailable: {why}", flush=True)
        print(
            markdown_table(_public(model_rows[-1:]), [k for k in model_rows[-1] if not k.startswith("_")]), flush=True
        )
        write_csv(out / "vs_frameworks.csv", _public(model_rows))  # after every workload: nothing measured is lost
        write_csv(out / "kernels.csv", _public(all_kernels))
    (out / "limits.json").write_text(json.dumps(limits.as_dict(), indent=1) + "\n")
    failed = "".join(f"- failed: {line}\n" for line in failures)
    (out / "vs_frameworks.md").write_text(summary(model_rows, all_kernels, limits, args.trials_per_task) + failed)
    if model_rows:
        plot(model_rows, timed_all, out / "vs_frameworks.png")
    print((out / "vs_frameworks.md").read_text())


if __name__ == "__main__":
    main()
