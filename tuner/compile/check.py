"""The compiled model against the model's own framework, every time one is built.

Each tuned kernel is checked alone against its unscheduled form while tuning (``TuningLoop``), but a
model can still come out wrong: a lowering that changed the graph, a kernel whose check could not see
the fault. So after compiling, the model runs on its example inputs and its outputs are compared with
what the model's own framework computes: PyTorch for a torch module (and the zoo), ONNX Runtime for
an ONNX file, otherwise the same lowering built with TVM's default schedules.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import tvm

from common.error_text import error_line
from common.model_weights import weights_path
from common.target_kind import is_cuda
from tuner.errors import TunerError
from tuner.runtime.compiled_model import ModelDescription
from workloads import Workload

# Largest |compiled - reference| allowed, relative to the largest |reference|. Correct fp32 models
# built here differ by up to ~2e-4 (fast-math activations, reassociated reductions); a wrong kernel by
# far more (issue 32's MobileNetV2: 1.16).
# bf16 models are checked against their default-schedule build (make_referee), and differ from it more
# than their kernels do: a sum in another order flips a bf16 rounding of an activation here and there,
# and a deep model amplifies it (two correct builds of Hugging Face's ResNet-50: 2.5e-2 apart). A wrong
# schedule gives errors of order 1 (1.16 and 0.68 in issue 32's fp32 MobileNetV2).
TOLERANCE = {"float16": 3e-2, "bfloat16": 1e-1}
FP32_TOLERANCE = 1e-3
DEFAULT_SCHEDULES = "TVM's default schedules"


@dataclass(frozen=True)
class ModelCheck:
    """How the compiled model's outputs compare with the reference's on the example inputs."""

    reference: str  # what computed the expected outputs
    error: float | None  # largest |compiled - expected| over the outputs, relative to ``scale``
    scale: float | None  # largest |expected|
    tolerance: float
    degenerate: str | None = None  # why matching proves nothing about this model
    left_out: dict[str, str] = field(default_factory=dict)  # kernel: why it was built with TVM's default schedule
    lowering_wrong: bool = False  # TVM's default schedules differ too: the fault is not a tuned schedule's
    skipped: str | None = None  # why no check ran
    # bf16: the error against the model's framework in fp32 (bf16's own rounding, said, not judged)
    precision_error: float | None = None
    precision_reference: str = ""

    @property
    def ok(self) -> bool | None:
        if self.error is None:
            return None
        return self.error <= self.tolerance

    def line(self) -> str:
        """One line for the summary's head."""
        if self.skipped:
            return f"end-to-end check: not run ({self.skipped})"
        verdict = "matches" if self.ok else "DIFFERS"
        text = (
            f"end-to-end check: {verdict} {self.reference}: largest error {self.error:.1e} of outputs up to "
            f"{self.scale:.3g} (tolerance {self.tolerance:.0e})"
        )
        if self.precision_error is not None:
            text += f"; against {self.precision_reference} in fp32: {self.precision_error:.1e} (bf16's own rounding)"
        if self.left_out:
            text += f"; {len(self.left_out)} kernel(s) built with TVM's default schedule to match"
        if self.lowering_wrong:
            text += "; TVM's default schedules differ as much: the lowering, not a tuned schedule, is at fault"
        if self.degenerate:
            text += f"\nwarning: the check proves nothing: {self.degenerate}"
        return text

    def as_dict(self) -> dict:
        return asdict(self)


def tolerance_for(workload: Workload) -> float:
    return precision_tolerance(workload.precision)


def precision_tolerance(precision: str | None) -> float:
    """The end-to-end check's tolerance for a model computed in ``precision`` (None: fp32)."""
    return TOLERANCE.get(precision or "float32", FP32_TOLERANCE)


def check_inputs(workload: Workload, seed: int = 0) -> list[np.ndarray]:
    """The inputs the model was imported with, or random ones of its input specs (integer inputs,
    token ids, as zeros: any id is in range)."""
    if workload.examples is not None:
        return [np.asarray(x) for x in workload.examples]
    rng = np.random.default_rng(seed)
    return [
        rng.standard_normal(spec.shape).astype(spec.dtype)
        if np.dtype(spec.dtype).kind == "f"
        else np.zeros(spec.shape, spec.dtype)
        for spec in workload.inputs
    ]


def _perturbed(inputs: Sequence[np.ndarray], seed: int = 1) -> list[np.ndarray] | None:
    """Other inputs of the same kind: new random values, or token ids shifted by one position."""
    rng = np.random.default_rng(seed)
    other = []
    for x in inputs:
        if x.dtype.kind == "f":
            other.append((rng.standard_normal(x.shape) * (float(np.std(x)) or 1.0)).astype(x.dtype))
        else:
            other.append(np.roll(x, 1, axis=-1))
    return None if all(np.array_equal(a, b) for a, b in zip(inputs, other, strict=True)) else other


def widened(array: object) -> np.ndarray:
    """``array`` as float64. A wrong kernel's output can hold garbage bits, signalling NaNs among
    them, whose cast raises numpy's "invalid value" warning; they stay NaN, and ``relative_error``
    counts a NaN as an infinite error."""
    with np.errstate(invalid="ignore"):
        return np.asarray(array, dtype=np.float64)


def as_outputs(value: object) -> list[np.ndarray]:
    """A model's output(s) as a list of float64 arrays."""
    items = value if isinstance(value, list | tuple) else [value]
    return [widened(getattr(v, "numpy", lambda v=v: v)()) for v in items]


def largest_value(arrays: list[np.ndarray]) -> float:
    """The largest magnitude over ``arrays``: the scale an error is relative to."""
    return max((float(np.max(np.abs(a))) for a in arrays if a.size), default=0.0)


def relative_error(outputs: list[np.ndarray], expected: list[np.ndarray]) -> float:
    if len(outputs) != len(expected) or any(o.shape != e.shape for o, e in zip(outputs, expected, strict=True)):
        return float("inf")
    scale = largest_value(expected)
    deviations = [float(np.max(np.abs(o - e))) for o, e in zip(outputs, expected, strict=True) if o.size]
    # each one tested: Python's max() passes over a NaN that is not first
    if not all(np.isfinite(d) for d in deviations):
        return float("inf")
    return max(deviations, default=0.0) / max(scale, 1e-30)


def run_compiled(artifact, workload: Workload, target: tvm.target.Target, inputs: Sequence[np.ndarray]) -> list:
    """The compiled model's outputs on ``inputs``, run in a process of its own (``run_compiled_sets``)."""
    return run_compiled_sets(artifact, workload, target, [inputs])[0]


def run_compiled_sets(
    artifact, workload: Workload, target: tvm.target.Target, input_sets: Sequence[Sequence[np.ndarray]]
) -> list[list[np.ndarray]]:
    """The compiled model's outputs on each of ``input_sets``, run in one process of its own
    (``tuner.runtime.run_model`` says why), from a copy of the library (and a link to its weights): the
    process's start and the weights' load paid once."""
    with tempfile.TemporaryDirectory(prefix="tuner-check-") as scratch:
        library = Path(scratch) / "model.so"
        shutil.copyfile(artifact, library)
        if weights_path(artifact).exists():
            weights_path(library).symlink_to(weights_path(artifact).resolve())
        ModelDescription.of(workload, target).save(library)
        paths = []
        for index, inputs in enumerate(input_sets):
            np.savez(Path(scratch) / f"in{index}.npz", *inputs)
            paths += [f"{scratch}/in{index}.npz", f"{scratch}/out{index}.npz"]
        ran = subprocess.run(
            [sys.executable, "-m", "tuner.runtime.run_model", str(library), *paths],
            capture_output=True,
            text=True,
            check=False,
        )
        if ran.returncode != 0:
            raise TunerError(f"running the compiled model {artifact} failed: {error_line(ran.stderr, last=True)}")
        outputs = []
        for index in range(len(input_sets)):
            with np.load(Path(scratch) / f"out{index}.npz") as saved:
                outputs.append([widened(saved[f"arr_{i}"]) for i in range(len(saved.files))])
        return outputs


def no_device_here(target: tvm.target.Target) -> str | None:
    if is_cuda(target) and not tvm.cuda(0).exist:
        return "no GPU on this host to run the model on"
    return None


@dataclass
class Referee:
    """The expected outputs on the check's inputs, and how much a match would prove."""

    name: str
    inputs: list[np.ndarray]
    expected: list[np.ndarray]
    tolerance: float
    degenerate: str | None = None
    framework: list[np.ndarray] | None = None  # the framework's outputs on ``inputs`` where it is not the referee

    @property
    def scale(self) -> float:
        return largest_value(self.expected)

    def error(self, outputs: list[np.ndarray]) -> float:
        return relative_error(outputs, self.expected)

    def matches(self, outputs: list[np.ndarray]) -> bool:
        return self.error(outputs) <= self.tolerance


def reference_label(workload: Workload) -> str:
    """What computes the model's own outputs, as the check line names it."""
    return workload.reference_name or "the model's reference"


def make_referee(
    workload: Workload, run_untuned: Callable[[list[list[np.ndarray]]], list[list[np.ndarray]]]
) -> Referee:
    """The reference of ``workload`` (its framework's, else ``run_untuned``: the default-schedule
    build, run on each of a list of input sets) on its check inputs, with the reason a match would
    prove nothing, if there is one. Whether the output depends on the input is asked of the reference on
    other inputs too (``_perturbed``). A bf16 model is checked against its own lowering built with the
    default schedules: against its framework in fp32 it differs by bf16's rounding (0.2 of the output on a
    ResNet-50, as OpenVINO's bf16 does), which would hide a wrong schedule rather than find it. The
    default-schedule build runs its kernels as unscheduled loops (ResNet-50 in bf16: seconds a run), so
    it runs on the check's inputs only, and the framework answers the question of the other inputs."""
    inputs = check_inputs(workload)
    other = _perturbed(inputs)
    sets = [inputs] if other is None else [inputs, other]
    framework = None if workload.reference is None else [as_outputs(workload.reference(*xs)) for xs in sets]
    if not checks_against_default_schedules(workload):
        referee = Referee(reference_label(workload), inputs, framework[0], tolerance_for(workload))
        referee.degenerate = _degenerate(referee, framework)
        return referee
    untuned = run_untuned(sets if framework is None else [inputs])
    answers = framework or untuned
    aside = None if framework is None else framework[0]
    referee = Referee(DEFAULT_SCHEDULES, inputs, untuned[0], tolerance_for(workload), framework=aside)
    referee.degenerate = _degenerate(referee, answers)
    return referee


def checks_against_default_schedules(workload: Workload) -> bool:
    """Whether ``make_referee`` takes the default-schedule build as the reference: a model with no framework
    to compare with, or one computed in bf16."""
    return workload.reference is None or workload.precision == "bfloat16"


def _degenerate(referee: Referee, answers: list[list[np.ndarray]]) -> str | None:
    """Why a match of ``referee``'s outputs would prove nothing, if it would not; ``answers``: one reference's
    outputs on the check's inputs and, where the model's inputs have others, on those."""
    scale = referee.scale
    if scale < 1e-6:
        return f"the model's output is all (near) zero (largest |value| {scale:.1e}): give it weights or inputs that " \
            "make its output of order 1"  # fmt: skip
    spread = max((float(np.ptp(e)) for e in referee.expected if e.size), default=0.0)
    if spread <= 1e-6 * scale:
        return "the model's output is constant"
    if len(answers) > 1 and relative_error(answers[1], answers[0]) <= 1e-6:
        return "the model's output does not depend on its input"
    return None
