"""Kernel by kernel against ONNX Runtime: where a compiled fp32 model loses its time to ONNX Runtime's CPU
provider, convolution by convolution and product by product.

    .venv/bin/python experiments/layers_vs_onnxruntime.py hf-regnet \
        --work-dir experiments/results/budget_curve/runs/hf-regnet/analytic/work

One process, ``--rounds`` rounds alternating the two sides: ONNX Runtime's node profile (``enable_profiling``:
each node's time, a fresh session a round) and the work dir's model (its ``model.so``) timed kernel by kernel
inside the model (``CompiledModel.kernel_times``), both on 2 threads by default. Each side is summed by kind,
then every convolution of ours is paired with ONNX Runtime's of the same shape (input channels and size,
window, channels a group, output channels and size) and every product with theirs of the same rows, reduction and
columns (batches counted as rows), its time over theirs the median of the rounds' ratios:
the machine's speed drifts between rounds, not within one. The pairs show which convolutions hold a model
back (HF RegNet on an Emerald Rapids: its first strided grouped convolution at 1.43x, the rest 0.65-1.25x).
Writes OUT/MODEL.md (default OUT: experiments/results/layers_vs_onnxruntime).
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from experiments import frameworks as fw  # noqa: E402
from experiments.harness import host_cpu, markdown_table  # noqa: E402
from experiments.layers_vs_openvino import (  # noqa: E402
    by_kind,
    kernel_kind,
    module_on_threads,
    slowest,
    work_dir_model,
)

PREPACKED_SUFFIX = "_prepacked"
# ONNX Runtime's convolution nodes after its graph rewrites: NCHWc's (named Conv) and a convolution with its
# activation fused (FusedConv)
CONVOLUTION_OPS = ("Conv", "FusedConv")
PRODUCT_OPS = ("MatMul", "FusedMatMul", "Gemm")


def onnxruntime_nodes(path: Path, inputs, threads: int, runs: int, directory: Path) -> tuple[dict, float]:
    """Seconds per inference of each node, keyed (name, op, input shapes, output shape); the latency while
    profiled. A fresh session each call: its profile is written once, when it ends."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.enable_profiling = True
    options.profile_file_prefix = str(directory / "profile")
    session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    feed = {name: x.numpy() for name, x in zip(fw.input_names(inputs), inputs, strict=True)}
    for _ in range(max(5, runs // 2)):
        session.run(None, feed)
    started = time.perf_counter()
    for _ in range(runs):
        session.run(None, feed)
    latency = (time.perf_counter() - started) / runs
    events = json.loads(Path(session.end_profiling()).read_text())
    samples: dict = collections.defaultdict(list)
    for event in events:
        if event.get("cat") != "Node" or not event["name"].endswith("_kernel_time"):
            continue
        shapes = tuple(tuple(next(iter(s.values()))) for s in event["args"].get("input_type_shape", []))
        output = tuple(tuple(next(iter(s.values()))) for s in event["args"].get("output_type_shape", []))
        samples[(event["name"].removesuffix("_kernel_time"), event["args"]["op_name"], shapes, output)].append(
            event["dur"] * 1e-6
        )
    # the last ``runs`` of each node: the warm-up calls are profiled too
    return {key: statistics.median(values[-runs:]) for key, values in samples.items()}, latency


def onnx_shape(op: str, inputs: tuple, output: tuple) -> tuple | None:
    """A node's pairing key: ("convolution", input channels, input size, window, channels a group, output channels,
    output size) of an NCHW convolution, ("product", rows, reduction, columns) of a product; None for others."""
    if len(inputs) < 2 or not output:
        return None
    if op in CONVOLUTION_OPS and len(inputs[0]) == 4 and len(output[0]) == 4:
        image, weight = inputs[0], inputs[1]
        return "convolution", image[1], image[2], weight[2], weight[1], weight[0], output[0][2]
    if op in PRODUCT_OPS:
        return _product_shape(inputs[0], output[0])
    return None


def _product_shape(left: Sequence[int], output: Sequence[int]) -> tuple | None:
    rows = math.prod(output[:-1])
    if not left or math.prod(left[:-1]) != rows:  # the first operand is not the rows' (a transposed one)
        return None
    return "product", rows, left[-1], output[-1]


def our_shapes(model: str) -> dict[str, tuple]:
    """The pairing key (``onnx_shape``) of each NHWC 2-d convolution and each product the model lowers to, by
    kernel name."""
    from experiments.analytic import model_tasks
    from tuner.targets import resolve_target

    shapes = {}
    for task in model_tasks(model, resolve_target("llvm")):
        params = [[int(d) for d in p.shape] for p in task.mod["main"].params]
        image, weight, output = params[0], params[1], params[-1]
        if "conv2d" in task.name and len(image) == len(weight) == len(output) == 4:
            shapes[task.name] = ("convolution", image[3], image[1], weight[0], weight[2], weight[3], output[1])
        elif ("matmul" in task.name or "dense" in task.name) and (shape := _product_shape(image, output)):
            shapes[task.name] = shape
    return shapes


def _label(shape: tuple) -> str:
    if shape[0] == "product":
        return "product {} x {} x {}".format(*shape[1:])
    c, h, k, g, co, ho = shape[1:]
    return f"{c}ch {h}x{h} -> {co}ch {ho}x{ho}, {k}x{k}" + (f", {c // g} groups" if g != c else "")


def paired_kernels(ours: list[dict], theirs: list[dict], shapes: dict[str, tuple]) -> list[dict]:
    """Per convolution or product shape (``onnx_shape``), each side's seconds summed over its kernels of that shape,
    round by round; the rows ordered by what ours loses, largest first."""
    rounds = []
    for our_round, their_round in zip(ours, theirs, strict=True):
        pairs: dict = collections.defaultdict(lambda: [0.0, 0.0])
        for name, seconds in our_round.items():
            shape = shapes.get(name.removesuffix(PREPACKED_SUFFIX))
            if shape is not None:
                pairs[shape][0] += seconds
        for (_, op, inputs, output), seconds in their_round.items():
            shape = onnx_shape(op, inputs, output)
            if shape in pairs:
                pairs[shape][1] += seconds
        rounds.append(pairs)
    rows = []
    for shape in rounds[0]:
        ours_s = [r[shape][0] for r in rounds]
        theirs_s = [r[shape][1] for r in rounds]
        if min(theirs_s) <= 0:
            continue
        ratio = statistics.median(a / b for a, b in zip(ours_s, theirs_s, strict=True))
        gap = statistics.median(ours_s) - statistics.median(theirs_s)
        rows.append((gap, shape, statistics.median(ours_s), statistics.median(theirs_s), ratio))
    rows.sort(key=lambda row: -row[0])
    return [
        {
            "kernel": _label(shape),
            "ours (us)": f"{mine * 1e6:.0f}",
            "ONNX Runtime (us)": f"{theirs * 1e6:.0f}",
            "ours / ONNX Runtime": f"{ratio:.2f}",
        }
        for _, shape, mine, theirs, ratio in rows
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", help="a model of workloads/hf_models.py or the zoo")
    parser.add_argument("--work-dir", type=Path, required=True, help="a `tuner tune` work dir of that model (fp32)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--runs", type=int, default=20, help="inferences a side a round")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--top", type=int, default=15, help="slowest layers listed per side")
    parser.add_argument("--out", type=Path, default=Path("experiments/results/layers_vs_onnxruntime"))
    args = parser.parse_args()

    module, inputs = module_on_threads(args.model, args.threads)
    shapes = our_shapes(args.model)
    model = work_dir_model(args.work_dir)
    ours, theirs, latencies = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.onnx"
        fw.export_onnx(module, inputs, path)
        for index in range(args.rounds):
            ours.append(model.kernel_times(*inputs, runs=args.runs))
            round_dir = Path(tmp) / str(index)
            round_dir.mkdir()
            nodes, latency = onnxruntime_nodes(path, inputs, args.threads, args.runs, round_dir)
            theirs.append(nodes)
            latencies.append(latency)
    last_ours, last_theirs = ours[-1], theirs[-1]
    lines = [
        f"# {args.model} kernel by kernel against ONNX Runtime",
        "",
        f"{host_cpu()}, {args.threads} threads, {args.rounds} rounds of {args.runs} inferences a side; "
        f"`experiments/layers_vs_onnxruntime.py {' '.join(sys.argv[1:])}`",
        "",
        f"Ours: kernels {statistics.median(sum(r.values()) for r in ours) * 1e3:.3f} ms an inference inside the "
        f"model; ONNX Runtime: nodes {statistics.median(sum(r.values()) for r in theirs) * 1e3:.3f} ms, "
        f"{statistics.median(latencies) * 1e3:.3f} ms an inference while profiled (medians of the rounds)",
        "",
        "## Convolutions and products of the same shape",
        "",
        markdown_table(
            paired_kernels(ours, theirs, shapes),
            ["kernel", "ours (us)", "ONNX Runtime (us)", "ours / ONNX Runtime"],
        ),
        "",
        "## By kind (the last round)",
        "",
        markdown_table(by_kind(last_ours, kernel_kind), ["kind", "us", "share"]),
        "",
        markdown_table(by_kind(last_theirs, lambda key: key[1]), ["kind", "us", "share"]),
        "",
        "## Slowest (the last round)",
        "",
        markdown_table(slowest(last_ours, str, args.top), ["layer", "us"]),
        "",
        markdown_table(slowest(last_theirs, lambda key: f"{key[1]} {list(key[2])}", args.top), ["layer", "us"]),
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.model}.md").write_text(text)


if __name__ == "__main__":
    main()
