"""What ``tune()`` hands back for a model tuned in pieces: the whole as a callable (compiled pieces, the
refused operators in PyTorch between them), each piece's own ``TuneResult``, the check and latency of the
whole. It lives in this process: the pieces' libraries are on disk, one per piece's work dir, but the
PyTorch graph that joins them is not saved, so ``export`` says so in one line."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from tuner.compile.check import ModelCheck
from tuner.errors import TunerError
from tuner.progress import format_latency, format_phases, format_seconds
from tuner.result import TuneResult, task_line
from tuner.targets import describe_target
from workloads import TensorSpec

from .split import Split

__all__ = ["PartitionedModel", "PartitionedResult"]


class PartitionedModel:
    """The whole model: ``model(x)`` takes numpy arrays or torch tensors and returns the same kind, its
    output (a list for several)."""

    def __init__(self, split: Split, name: str):
        self.split = split
        self.name = name

    def outputs(self, *inputs: Any) -> list[Any]:
        """Its outputs as a list of torch tensors, for torch inputs."""
        import torch

        with torch.no_grad():
            return self.split(*inputs)

    def __call__(self, *inputs: Any) -> Any:
        import torch

        as_numpy = not any(isinstance(x, torch.Tensor) for x in inputs)
        out = self.outputs(*[x if isinstance(x, torch.Tensor) else torch.from_numpy(x) for x in inputs])
        out = [x.numpy() for x in out] if as_numpy else out
        return out[0] if len(out) == 1 else out


@dataclass
class PartitionedResult(TuneResult):
    """A ``TuneResult`` of a model tuned in pieces. ``work_dir``, ``database_path`` and ``artifact_path``
    are the run's work dir, which holds a work dir per piece (``pieces[name].work_dir``); ``tasks`` are the
    pieces' kernels, named ``PIECE/KERNEL``; ``latency_after`` is the whole's, PyTorch's part included."""

    pieces: dict[str, TuneResult] = field(default_factory=dict)
    in_pytorch: list[str] = field(default_factory=list)  # the operators that run in PyTorch
    _model: PartitionedModel | None = field(default=None, repr=False)

    @classmethod
    def of(
        cls,
        name: str,
        work_dir: Path,
        pieces: dict[str, TuneResult],
        in_pytorch: list[str],
        model: PartitionedModel,
        examples: Any,
        check: ModelCheck,
        latency: float,
        wall_seconds: float,
    ) -> PartitionedResult:
        seconds: Counter[str] = Counter()
        for piece in pieces.values():
            seconds.update(piece.seconds)
        reasons = [f"{name}: {piece.stop_reason}" for name, piece in pieces.items() if piece.stop_reason]
        return cls(
            model=name,
            kind="relax",
            target=next(iter(pieces.values())).target,
            work_dir=work_dir,
            database_path=work_dir,
            artifact_path=work_dir,
            inputs=[
                TensorSpec(f"input{i}", tuple(x.shape), str(x.dtype).removeprefix("torch."))
                for i, x in enumerate(examples)
            ],
            tasks=[replace(task, name=f"{piece}/{task.name}") for piece, r in pieces.items() for task in r.tasks],
            latency_before=None,
            latency_after=latency,
            trials=sum(piece.trials for piece in pieces.values()),
            wall_seconds=wall_seconds,
            seconds=dict(seconds),
            device_seconds=sum(piece.device_seconds for piece in pieces.values()),
            stop_reason="; ".join(reasons) or None,
            check=check,
            pieces=pieces,
            in_pytorch=in_pytorch,
            _model=model,
        )

    @property
    def not_saved(self) -> str:
        """Why the whole cannot be saved, and what to do instead, in one line."""
        libraries = ", ".join(str(piece.artifact_path) for piece in self.pieces.values())
        return (
            f"{self.model} runs {', '.join(self.in_pytorch)} in PyTorch between its compiled pieces, and that "
            f"whole cannot be saved as one library: keep result.compiled() in this process, or call tune() again "
            f"with work_dir={str(self.work_dir)!r} (it measures nothing twice); each piece's library alone: "
            f"{libraries}"
        )

    @property
    def module(self) -> Any:
        raise TunerError(self.not_saved)

    def export(self, path: str | Path) -> Path:
        raise TunerError(self.not_saved)

    def compiled(self, device: Any = None) -> PartitionedModel:
        """The whole model, ready to run (``PartitionedModel``), on the device its pieces were built for."""
        if device is not None:
            raise TunerError(f"{self.model} is tuned in pieces, which run on the device they were compiled for")
        assert self._model is not None
        return self._model

    def run(self, *inputs: Any, device: Any = None) -> Any:
        return self.compiled(device)(*inputs)

    def summary(self) -> str:
        lines = [
            f"{self.model} on {describe_target(self.target)}, partitioned: {', '.join(self.in_pytorch)} in PyTorch "
            f"between {len(self.pieces)} compiled piece(s); {self.trials} trials in {format_seconds(self.wall_seconds)}"
        ]
        if self.check is not None:
            lines.append(self.check.line())
        lines.append(f"latency {format_latency(self.latency_after)} (the whole: compiled pieces and PyTorch)")
        if self.seconds:
            lines.append("time (the pieces'): " + format_phases(self.seconds, self.device_seconds))
        if self.stop_reason:
            lines.append(f"stopped by {self.stop_reason}")
        for name, piece in self.pieces.items():
            lines.append(f"  {name}: {piece.trials} trials, latency {format_latency(piece.latency_after)}")
            lines += [f"    {task.name} x{task.weight}: {task_line(task)}" for task in piece.tasks]
        lines.append(
            f"work dir {self.work_dir} (a work dir per piece); not saved as one library: result.export says why"
        )
        return "\n".join(lines)
