"""The runtimes a tuned model is compared with, each prepared once and then called on the same
inputs in the same process: PyTorch eager, torch.compile (Inductor), PyTorch under
``torch.autocast`` (bf16), ONNX Runtime (its CPU provider, or on a GPU its CUDA provider with the
inputs and output bound on the device), OpenVINO's CPU plugin (as its users get it, and forced to
fp32), TVM untuned (our lowering, TVM's default schedules) and the tuned model.

Each contender is a function of no arguments that runs one inference and returns its (first)
output, and states the precision it computes in; a runtime that cannot be had (not installed, fails
to export or compile) is reported with why.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from common.error_text import error_line

OPENVINO_DEFAULT = "OpenVINO (default)"
OPENVINO_FP32 = "OpenVINO fp32"
PRECISIONS = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}  # dtype -> the tables' name
_OPENVINO_PRECISIONS = {"f32": "fp32", "f16": "fp16", "bf16": "bf16"}


@dataclass
class Contender:
    name: str
    call: Callable[[], Any] | None  # one inference; None when the runtime is unavailable
    missing: str = ""  # why it is unavailable
    precision: str = "fp32"  # what it computes in ("" when unavailable and not known)
    samples: list[float] = field(default_factory=list)  # seconds per call
    round_medians: list[float] = field(default_factory=list)  # seconds per call, median of each round

    @property
    def median(self) -> float | None:
        return statistics.median(self.samples) if self.samples else None


def _as_numpy(out: Any) -> np.ndarray:
    if isinstance(out, (list, tuple)):
        out = out[0]
    if hasattr(out, "detach"):
        out = out.detach().cpu()
        return (out.float() if str(out.dtype) == "torch.bfloat16" else out).numpy()  # numpy has no bf16
    if hasattr(out, "numpy"):  # a TVM tensor, an ONNX Runtime OrtValue
        return out.numpy()
    return np.asarray(out)


def _why(err: BaseException) -> str:
    """One line: the error, and what caused it where the error only wraps it (OpenVINO's conversion
    failures say "Couldn't get TorchScript module by tracing" over the model's own error)."""
    why = f"{type(err).__name__}: {error_line(err)[:160]}"
    cause = err.__cause__ or err.__context__
    return f"{why} (from {type(cause).__name__}: {error_line(cause)[:120]})" if cause is not None else why


def _prepare(name: str, build: Callable[[], Callable[[], Any]], precision: str = "fp32") -> Contender:
    try:
        return Contender(name, build(), precision=precision)
    except Exception as err:  # noqa: BLE001 - any failure to set a runtime up is reported, not fatal
        return Contender(name, None, _why(err), precision=precision)


def torch_eager(module: Any, inputs: Sequence[Any], precision: str = "fp32") -> Contender:
    import torch

    def build():
        def call():
            with torch.inference_mode():
                return module(*inputs)

        return call

    return _prepare("PyTorch eager", build, precision)


def torch_compiled(module: Any, inputs: Sequence[Any], precision: str = "fp32") -> Contender:
    import torch

    def build():
        compiled = torch.compile(module)

        def call():
            with torch.inference_mode():
                return compiled(*inputs)

        call()  # compiles (minutes for a big model)
        return call

    return _prepare("torch.compile", build, precision)


def torch_autocast(module: Any, inputs: Sequence[Any], dtype: str = "bfloat16") -> Contender:
    """PyTorch eager on an fp32 module under ``torch.autocast``: what PyTorch offers for running a
    model in ``dtype`` (its matmuls and convolutions; the rest stays fp32)."""
    import torch

    precision = PRECISIONS.get(dtype, dtype)

    def build():
        device = inputs[0].device.type

        def call():
            with torch.inference_mode(), torch.autocast(device, dtype=getattr(torch, dtype)):
                return module(*inputs)

        call()  # where autocast cannot run the model, it fails here
        return call

    return _prepare(autocast_name(dtype), build, precision)


def autocast_name(dtype: str) -> str:
    return f"PyTorch {PRECISIONS.get(dtype, dtype)} (autocast)"


@contextmanager
def composed_attention() -> Iterator[None]:
    """MultiheadAttention's fused inference path (aten::_native_multi_head_attention) has no ONNX
    export and no OpenVINO conversion: within this, torch runs its composed form."""
    import torch

    fastpath = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        yield
    finally:
        torch.backends.mha.set_fastpath_enabled(fastpath)


def input_names(inputs: Sequence[Any]) -> list[str]:
    return ["input"] if len(inputs) == 1 else [f"input{i}" for i in range(len(inputs))]


def export_onnx(module: Any, inputs: Sequence[Any], path: Path) -> None:
    """The module as ONNX (opset 17, TorchScript exporter), its attention composed of plain operators."""
    import torch

    with composed_attention(), torch.no_grad():
        torch.onnx.export(
            module,
            tuple(inputs),
            str(path),
            input_names=input_names(inputs),
            output_names=["output"],
            dynamo=False,
            opset_version=17,
        )


def onnx_runtime(
    module: Any, inputs: Sequence[Any], threads: int, directory: Path, precision: str = "fp32"
) -> Contender:
    def build():
        import onnxruntime

        path = directory / "model.onnx"
        if not path.exists():
            export_onnx(module, inputs, path)
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
        options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
        if inputs[0].device.type == "cuda":
            return _on_gpu(onnxruntime, path, options, inputs)
        session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        feed = {name: x.numpy() for name, x in zip(input_names(inputs), inputs, strict=True)}
        return lambda: session.run(None, feed)[0]

    return _prepare("ONNX Runtime", build, precision)


def _on_gpu(onnxruntime: Any, path: Path, options: Any, inputs: Sequence[Any]) -> Callable[[], Any]:
    """A CUDA-provider session reading the inputs where torch holds them and writing on the device."""
    if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
        raise RuntimeError("this onnxruntime has no CUDA provider (pip install onnxruntime-gpu)")
    session = onnxruntime.InferenceSession(str(path), options, providers=["CUDAExecutionProvider"])
    binding = session.io_binding()
    for name, x in zip(input_names(inputs), inputs, strict=True):
        element = np.dtype(str(x.dtype).removeprefix("torch."))
        binding.bind_input(name, "cuda", x.device.index or 0, element, tuple(x.shape), x.data_ptr())
    for output in session.get_outputs():
        binding.bind_output(output.name, "cuda", inputs[0].device.index or 0)

    def call():
        session.run_with_iobinding(binding)
        return binding.get_outputs()[0]

    return call


def openvino(module: Any, inputs: Sequence[Any], threads: int) -> list[Contender]:
    """OpenVINO's CPU plugin on one conversion of ``module``, twice: as its users get it (only the
    thread count set; on a CPU with bf16 it then computes in bf16) and forced to fp32. Each states
    the precision it reports (INFERENCE_PRECISION_HINT)."""
    try:
        import openvino as ov

        with composed_attention():
            converted = ov.convert_model(module, example_input=tuple(inputs))
    except Exception as err:  # noqa: BLE001 - not installed, or the model does not convert: reported
        return [Contender(OPENVINO_FP32, None, _why(err)), Contender(OPENVINO_DEFAULT, None, _why(err), precision="")]
    core, feed = ov.Core(), [x.numpy() for x in inputs]
    threads_only = {"INFERENCE_NUM_THREADS": threads}
    return [
        _openvino_compiled(OPENVINO_FP32, core, converted, feed, {**threads_only, "INFERENCE_PRECISION_HINT": "f32"}),
        _openvino_compiled(OPENVINO_DEFAULT, core, converted, feed, threads_only),
    ]


def _openvino_compiled(name: str, core: Any, converted: Any, feed: list[np.ndarray], config: dict) -> Contender:
    try:
        compiled = core.compile_model(converted, "CPU", config)
        hint = compiled.get_property("INFERENCE_PRECISION_HINT").get_type_name()
        compiled(feed)  # a model can compile and still fail to run (a shape check at inference)
    except Exception as err:  # noqa: BLE001 - reported, not fatal
        # OpenVINO's messages lead with the source line that threw and end with the cause
        return Contender(name, None, f"{type(err).__name__}: {error_line(err, last=True)[:160]}", precision="")
    return Contender(name, lambda: compiled(feed)[0], precision=_OPENVINO_PRECISIONS.get(hint, hint))


def tvm_model(name: str, library: Path, description: Any, inputs: Sequence[Any], precision: str = "fp32") -> Contender:
    """A compiled TVM model called as a user calls it: ``tuner.runtime.compiled_model.CompiledModel`` on the torch
    inputs (passed through DLPack without a copy)."""

    def build():
        from tuner.runtime.compiled_model import CompiledModel

        model = CompiledModel(library, description)
        return lambda: model(*inputs)

    return _prepare(name, build, precision)


def synchronize_each_call(contenders: list[Contender]) -> None:
    """On a GPU every runtime returns once its kernels are queued: each call then waits for the
    device, so that a call's time is its work's."""
    import torch

    for contender in contenders:
        if contender.call is not None:
            contender.call = _synchronized(contender.call, torch.cuda.synchronize)


def _synchronized(call: Callable[[], Any], synchronize: Callable[[], None]) -> Callable[[], Any]:
    def synchronized_call():
        out = call()
        synchronize()
        return out

    return synchronized_call


# Each runtime's worker threads spin for a while after a call before they sleep (OpenMP's, TVM's,
# ONNX Runtime's): the next runtime's threads would compete with them for the cores.
_QUIET_SECONDS = 0.05


def time_interleaved(
    contenders: list[Contender],
    rounds: int = 5,
    seconds_per_round: float = 0.4,
    max_calls: int = 200,
) -> None:
    """Fill each contender's ``samples`` and ``round_medians``: in each round every contender is
    called in turn (after a pause for the previous one's threads to go idle, and one untimed call)
    until it has run ``seconds_per_round`` (at least once), so that drift of a shared machine
    reaches them all alike."""
    for _ in range(rounds):
        for contender in contenders:
            if contender.call is None:
                continue
            time.sleep(_QUIET_SECONDS)
            contender.call()
            spent, samples = 0.0, []
            while (spent < seconds_per_round or not samples) and len(samples) < max_calls:
                start = time.perf_counter()
                contender.call()
                samples.append(time.perf_counter() - start)
                spent += samples[-1]
            contender.samples += samples
            contender.round_medians.append(statistics.median(samples))


def print_two_builds(
    ours: Sequence[Contender], libraries: dict, others: Sequence[Contender], errors: dict, inputs: Sequence[Any]
) -> None:
    """Prints two builds of one model (``ours``, their libraries by contender name) timed beside
    ``others``: each latency and error, the builds' kernels timed inside the model, and the second
    build's time over the first's, by round and overall."""
    for contender in others:
        name = f"{contender.name} ({contender.precision})"
        print(f"{name}: {contender.median * 1e3:.3f} ms, error {errors[contender.name]:.1e}")
    for contender in ours:
        in_model = sum(libraries[contender.name].kernel_times(*inputs).values())
        print(
            f"{contender.name}: {contender.median * 1e3:.3f} ms, kernels in the model {in_model * 1e3:.3f} ms, "
            f"error {errors[contender.name]:.1e}"
        )
    first, second = ours
    by_round = [round(b / a, 3) for a, b in zip(first.round_medians, second.round_medians, strict=True)]
    print(f"{second.name} / {first.name} by round:", by_round)
    print(f"{second.name} / {first.name}: {second.median / first.median:.3f}")


def module_and_inputs(name: str) -> tuple:
    """(module, [inputs]) of a zoo model, an operator of operator_modules.py or a transformers model
    of workloads/hf_models.py."""
    from experiments.operator_modules import OPERATORS
    from workloads.hf_models import HF_MODELS
    from workloads.models import torch_model

    if name in HF_MODELS:
        return HF_MODELS[name]()
    module, example = OPERATORS[name].module_and_example() if name in OPERATORS else torch_model(name)
    return module, [example]


def errors_against_eager(contenders: list[Contender]) -> tuple[np.ndarray, dict[str, float]]:
    """PyTorch eager's output, and each available contender's error against it (``relative_error``)."""
    reference = reference_output(next(c for c in contenders if c.name == "PyTorch eager"))
    return reference, {c.name: relative_error(c.call(), reference) for c in contenders if c.call is not None}


def relative_error(output: Any, reference: np.ndarray) -> float:
    got = _as_numpy(output).astype(np.float64)
    if got.shape != reference.shape:
        return float("inf")
    return float(np.max(np.abs(got - reference)) / max(np.max(np.abs(reference)), 1e-30))


def reference_output(contender: Contender) -> np.ndarray:
    return _as_numpy(contender.call()).astype(np.float64)
