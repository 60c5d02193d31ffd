"""The runtimes a tuned model is compared with, each prepared once and then called on the same
input in the same process: PyTorch eager, torch.compile (Inductor), ONNX Runtime (its CPU provider,
or on a GPU its CUDA provider with the input and output bound on the device), TVM untuned (our
lowering, TVM's default schedules) and the tuned model.

Each contender is a function of no arguments that runs one inference and returns its output; a
runtime that cannot be had (not installed, fails to export or compile) is reported with why.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from measure.error_text import error_line


@dataclass
class Contender:
    name: str
    call: Callable[[], Any] | None  # one inference; None when the runtime is unavailable
    missing: str = ""  # why it is unavailable
    samples: list[float] = field(default_factory=list)  # seconds per call
    round_medians: list[float] = field(default_factory=list)  # seconds per call, median of each round

    @property
    def median(self) -> float | None:
        return statistics.median(self.samples) if self.samples else None


def _as_numpy(out: Any) -> np.ndarray:
    if isinstance(out, (list, tuple)):
        out = out[0]
    if hasattr(out, "detach"):
        return out.detach().cpu().numpy()
    if hasattr(out, "numpy"):  # a TVM tensor, an ONNX Runtime OrtValue
        return out.numpy()
    return np.asarray(out)


def _prepare(name: str, build: Callable[[], Callable[[], Any]]) -> Contender:
    try:
        return Contender(name, build())
    except Exception as err:  # noqa: BLE001 - any failure to set a runtime up is reported, not fatal
        return Contender(name, None, f"{type(err).__name__}: {error_line(err)[:160]}")


def torch_eager(module: Any, example: Any) -> Contender:
    import torch

    def build():
        def call():
            with torch.inference_mode():
                return module(example)

        return call

    return _prepare("PyTorch eager", build)


def torch_compiled(module: Any, example: Any) -> Contender:
    import torch

    def build():
        compiled = torch.compile(module)

        def call():
            with torch.inference_mode():
                return compiled(example)

        call()  # compiles (minutes for a big model)
        return call

    return _prepare("torch.compile", build)


def onnx_runtime(module: Any, example: Any, threads: int, directory: Path) -> Contender:
    def build():
        import onnxruntime
        import torch

        path = directory / "model.onnx"
        if not path.exists():
            # MultiheadAttention's fused inference path (aten::_native_multi_head_attention) has no
            # ONNX export: export its composed form
            fastpath = torch.backends.mha.get_fastpath_enabled()
            torch.backends.mha.set_fastpath_enabled(False)
            try:
                with torch.no_grad():
                    torch.onnx.export(
                        module,
                        (example,),
                        str(path),
                        input_names=["input"],
                        output_names=["output"],
                        dynamo=False,
                        opset_version=17,
                    )
            finally:
                torch.backends.mha.set_fastpath_enabled(fastpath)
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
        options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
        if example.device.type == "cuda":
            return _on_gpu(onnxruntime, path, options, example)
        session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        feed = {"input": example.numpy()}
        return lambda: session.run(None, feed)[0]

    return _prepare("ONNX Runtime", build)


def _on_gpu(onnxruntime: Any, path: Path, options: Any, example: Any) -> Callable[[], Any]:
    """A CUDA-provider session reading the input where torch holds it and writing on the device."""
    if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
        raise RuntimeError("this onnxruntime has no CUDA provider (pip install onnxruntime-gpu)")
    session = onnxruntime.InferenceSession(str(path), options, providers=["CUDAExecutionProvider"])
    binding = session.io_binding()
    element = np.dtype(str(example.dtype).removeprefix("torch."))
    binding.bind_input("input", "cuda", example.device.index or 0, element, tuple(example.shape), example.data_ptr())
    binding.bind_output("output", "cuda", example.device.index or 0)

    def call():
        session.run_with_iobinding(binding)
        return binding.get_outputs()[0]

    return call


def tvm_model(name: str, library: Path, description: Any, example: Any) -> Contender:
    """A compiled TVM model called as a user calls it: ``tuner.runtime.CompiledModel`` on the torch
    input (passed through DLPack without a copy)."""

    def build():
        from tuner.runtime import CompiledModel

        model = CompiledModel(library, description)
        return lambda: model(example)

    return _prepare(name, build)


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


def relative_error(output: Any, reference: np.ndarray) -> float:
    got = _as_numpy(output).astype(np.float64)
    if got.shape != reference.shape:
        return float("inf")
    return float(np.max(np.abs(got - reference)) / max(np.max(np.abs(reference)), 1e-30))


def reference_output(contender: Contender) -> np.ndarray:
    return _as_numpy(contender.call()).astype(np.float64)
