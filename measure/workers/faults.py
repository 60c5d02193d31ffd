"""Real failures injected into a share of candidates, to prove that tuning survives them.

Switched on by ``TENSOR_TUNER_INJECT_FAULTS`` in the environment of the tuner (its workers inherit
it): ``RATE`` (a fraction of candidates, every kind of fault) or ``KIND,KIND:RATE``. Unset, the
workers' handlers are left as they are: the production path is unchanged. Which candidate fails and how
is decided by the program its artifact is named after, so its build, its measurement and its verification agree.

The faults are real where they happen: a build worker that kills itself with SIGSEGV mid-build
(a compiler crash), a measuring worker that does the same, sleeps past any timeout, or fails to
allocate memory; NaN or wrong output is written into the kernel's output after it ran, so the
tuner's own checks (the NaN check after timing, the comparison against the reference) must find it.
"""

from __future__ import annotations

import hashlib
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

FAULTS_ENV = "TENSOR_TUNER_INJECT_FAULTS"
BUILD_FAULTS = ("build-crash",)
RUN_FAULTS = ("segfault", "hang", "oom", "nan", "wrong")
KINDS = BUILD_FAULTS + RUN_FAULTS
CANDIDATE_PREFIX = "candidate-"  # the engine's name for a candidate's artifact; references and whole programs never are


@dataclass(frozen=True)
class FaultPlan:
    rate: float
    kinds: tuple[str, ...]

    def fault_for(self, artifact: str) -> str | None:
        """The fault this candidate's artifact is to suffer, or None."""
        name = os.path.basename(artifact)
        if not name.startswith(CANDIDATE_PREFIX):
            return None
        program = name.rsplit("-", 1)[0]  # the engine's counter after the program's hash is left out
        digest = hashlib.sha256(f"{os.getppid()}:{program}".encode()).digest()
        if int.from_bytes(digest[:4], "little") / 2**32 >= self.rate:
            return None
        return self.kinds[digest[4] % len(self.kinds)]


def parse_plan(text: str) -> FaultPlan:
    """``"0.2"`` or ``"segfault,hang:0.2"``; raises ValueError naming the mistake."""
    kinds_text, _, rate_text = text.rpartition(":")
    kinds = tuple(k.strip() for k in kinds_text.split(",") if k.strip()) or KINDS
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        raise ValueError(f"{FAULTS_ENV}: unknown fault kind(s) {', '.join(unknown)}; known: {', '.join(KINDS)}")
    try:
        rate = float(rate_text)
    except ValueError:
        raise ValueError(f"{FAULTS_ENV}={text!r}: expected RATE or KIND,KIND:RATE with RATE in [0, 1]") from None
    if not 0 <= rate <= 1:
        raise ValueError(f"{FAULTS_ENV}={text!r}: the rate must be between 0 and 1")
    return FaultPlan(rate, kinds)


def plan_from_env() -> FaultPlan | None:
    text = os.environ.get(FAULTS_ENV, "").strip()
    return parse_plan(text) if text else None


def _crash() -> None:
    os.kill(os.getpid(), signal.SIGSEGV)


def _hang() -> None:
    while True:
        time.sleep(3600)


def _exhaust_memory() -> None:
    np.ones(1 << 44, dtype=np.uint8)  # 16 TiB: the allocation itself fails with MemoryError


_PROCESS_FAULTS = {"build-crash": _crash, "segfault": _crash, "hang": _hang, "oom": _exhaust_memory}


def process_fault(plan: FaultPlan, kinds: tuple[str, ...]) -> Callable[[str], None]:
    """What happens to the process handling a candidate's ``artifact`` before it starts: one of
    ``kinds``' process faults where the plan gives the candidate one, else nothing."""

    def suffer(artifact: str) -> None:
        fault = plan.fault_for(artifact)
        if fault in kinds and fault in _PROCESS_FAULTS:
            _PROCESS_FAULTS[fault]()

    return suffer


def _before(plan: FaultPlan, kinds: tuple[str, ...], handler: Callable) -> Callable:
    suffer = process_fault(plan, kinds)

    def faulty(*args, artifact: str = "", **kwargs):
        suffer(artifact)
        return handler(*args, artifact=artifact, **kwargs)

    return faulty


def corrupt_outputs(plan: FaultPlan) -> Callable[[str, list], None]:
    """The hook ``measure.workers.run_job`` calls after a kernel ran: NaN or a wrong value in its last argument."""

    def corrupt(artifact: str, tensors: list) -> None:
        fault = plan.fault_for(artifact)
        if fault in ("nan", "wrong") and tensors:
            values = tensors[-1].numpy()
            values.reshape(-1)[0] = np.nan if fault == "nan" else values.reshape(-1)[0] + 1000.0
            tensors[-1].copyfrom(values)

    return corrupt


def inject(role: str, handlers: dict[str, Callable], plan: FaultPlan) -> dict[str, Callable]:
    """``handlers`` of a worker of ``role`` with ``plan``'s faults wired in."""
    if role == "build":
        return {**handlers, "build_kernel": _before(plan, BUILD_FAULTS, handlers["build_kernel"])}
    if role == "run":
        from . import owner_job, run_job

        run_job.corrupt_outputs = corrupt_outputs(plan)
        owner_job.before_candidate = process_fault(plan, RUN_FAULTS)  # the queue's candidates, one by one
        wrapped = {op: _before(plan, RUN_FAULTS, handlers[op]) for op in ("time_kernel", "run_kernel")}
        return {**handlers, **wrapped}
    return handlers
