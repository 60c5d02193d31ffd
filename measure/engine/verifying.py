"""Checking a candidate's output against its kernel's unscheduled form: both built, the reference run once
on the CPU (its outputs kept per reference), the candidate run on the same arguments and compared. A mixin
of ``MeasureEngine``, whose ``build`` and runner pool (``_runners``) these calls use."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import tvm

from measure.contract import EngineConfig, device_kind, host_target
from measure.timeouts import AdaptiveTimeout
from measure.types import BuildResult, MeasureInput, VerifyResult
from measure.workers.worker import WorkerCrashed, WorkerError, WorkerTimeout

from .building import REFERENCE_KEY
from .kept_builds import remove_artifact
from .runners import RunnerPool

log = logging.getLogger("tensor_tuner.measure")


class CandidateChecks:
    """``MeasureEngine``'s checks of candidates' outputs (see the module's docstring)."""

    target: tvm.target.Target
    config: EngineConfig
    device: str
    run_timeout: AdaptiveTimeout
    _artifact_dir: Path
    _runners: RunnerPool
    build: Callable[..., Iterator[BuildResult]]  # the engine's: candidates built in its pool of build workers

    def verify(
        self, reference: tvm.IRModule, candidate: tvm.IRModule, rtol: float, group: str | None = None
    ) -> VerifyResult:
        """Check the candidate's output against the unscheduled function's on random inputs
        (``group`` as in ``measure``)."""
        ref_target = host_target(self.target)
        # not the candidates' adaptive timeout (10x their median build): the unscheduled reference can take
        # far longer to build than they do, and a verification that cannot build falls back to TVM's default
        # schedule (a bf16 convolution 40x slower than its tuned one)
        timeout = self.config.reference_timeout
        (ref,) = self.build([MeasureInput(REFERENCE_KEY, reference)], True, ref_target, timeout)
        (cand,) = self.build([MeasureInput("candidate", candidate)], True, timeout=timeout)
        try:
            for built in (ref, cand):
                if not built.ok:
                    return VerifyResult(None, f"could not build the {built.key} to compare: {built.error}")
            return self.compare_built(ref, cand, device_kind(ref_target), rtol)
        finally:
            for built in (ref, cand):
                if built.artifact:
                    remove_artifact(built.artifact)

    def compare_built(
        self, reference: BuildResult, candidate: BuildResult, reference_device: str, rtol: float
    ) -> VerifyResult:
        """Run a built candidate on the arguments its built reference was run on, and compare."""
        try:
            expected = self._reference_outputs(reference, reference_device, candidate.args)
        except WorkerTimeout:
            return VerifyResult(
                None,
                f"its unscheduled kernel takes over {self.config.reference_timeout:.0f} s on the CPU, too long to "
                "check against",
                worth_retrying=False,
            )
        except (WorkerError, WorkerCrashed) as err:
            return VerifyResult(None, f"could not run the unscheduled kernel to compare: {err}")
        try:
            outcome = self._runners.call_alone(
                "compare_outputs",
                self.run_timeout.value * 10,
                candidate=candidate.artifact,
                candidate_device=self.device,
                reference_outputs=str(expected),
                args=candidate.args,
                rtol=rtol,
            )
        except (WorkerError, WorkerTimeout, WorkerCrashed) as err:
            return VerifyResult(False, f"running the candidate to compare failed: {err}")
        return VerifyResult(bool(outcome["ok"]), outcome["detail"])

    def _reference_outputs(self, reference: BuildResult, reference_device: str, args: Sequence) -> Path:
        """The file of what the reference wrote (``run_job.reference_outputs``), run once per reference."""
        digest = hashlib.sha256(Path(reference.artifact).read_bytes()).hexdigest()[:16]
        path = self._artifact_dir / "references" / f"{digest}-{reference_device}.npz"
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            ran = self._runners.call_alone(
                "reference_outputs",
                self.config.reference_timeout,
                reference=reference.artifact,
                reference_device=reference_device,
                args=args,
                path=str(path),
            )
            log.info("ran the unscheduled kernel to check candidates against in %.1f s", ran["seconds"])
        return path
