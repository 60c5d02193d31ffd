"""Shared fixtures: real TVM, real worker processes, small shapes."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


@pytest.fixture(scope="session", autouse=True)
def _user_cache_for_the_session(tmp_path_factory) -> Path:
    """Session fixtures (a shared tuning run) and subprocesses keep their DOP memory (whatever
    follows $TENSOR_TUNER_CACHE_DIR) in a temporary folder, not the real ~/.cache/tensor-tuner."""
    from measure.dop.memory import CACHE_DIR_ENV

    cache = tmp_path_factory.mktemp("user-cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(CACHE_DIR_ENV, str(cache))
        yield cache


@pytest.fixture(autouse=True)
def user_cache(tmp_path_factory, monkeypatch, _user_cache_for_the_session: Path) -> Path:
    """Each test its own user cache: what one test's engine remembers (its DOP) does not reach
    the next test's engine. The machine's calibration (``tuner.spaces.calibration``, a few seconds to
    measure) is a fact of the machine, not state: measured once and handed to every test."""
    from measure.dop.memory import CACHE_DIR_ENV
    from tuner.spaces.calibration import CALIBRATION_FILE

    cache = tmp_path_factory.mktemp("user-cache")
    shared = _user_cache_for_the_session / CALIBRATION_FILE
    if shared.exists():
        shutil.copyfile(shared, cache / CALIBRATION_FILE)
    monkeypatch.setenv(CACHE_DIR_ENV, str(cache))
    yield cache
    if (cache / CALIBRATION_FILE).exists() and not shared.exists():
        shutil.copyfile(cache / CALIBRATION_FILE, shared)


@pytest.fixture(scope="session")
def llvm_target():
    from tuner.targets import resolve_target

    return resolve_target("llvm")


@pytest.fixture(scope="session")
def tuned_matmul(tmp_path_factory) -> TuneResult:  # noqa: F821
    """matmul-128 tuned once for the session (16 trials), shared by tests that only read it."""
    from tuner import tune

    work_dir = tmp_path_factory.mktemp("tuned-matmul")
    return tune(
        "matmul-128", target="llvm", trials=16, work_dir=work_dir, batch_size=8, progress=False, time_untuned=True
    )


@pytest.fixture(scope="session")
def tuned_mlp(tmp_path_factory) -> TuneResult:  # noqa: F821
    """A two-layer perceptron (a Relax model: 16x64 -> 32 -> 8, ReLU between) tuned once for the
    session (8 trials), shared by tests that only run its compiled result."""
    import numpy as np
    from tvm import relax

    from tuner import tune

    rng = np.random.default_rng(0)
    w1, w2 = rng.standard_normal((64, 32)).astype("float32"), rng.standard_normal((32, 8)).astype("float32")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((16, 64), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            hidden = bb.emit(relax.op.nn.relu(relax.op.matmul(x, relax.const(w1))))
            out = bb.emit_output(relax.op.matmul(hidden, relax.const(w2)))
        bb.emit_func_output(out)
    result = tune(bb.get(), trials=8, work_dir=tmp_path_factory.mktemp("tuned-mlp"), batch_size=4, progress=False)
    result.reference = lambda data: np.maximum(data @ w1, 0) @ w2
    return result


@pytest.fixture
def engine(tmp_path: Path, llvm_target):
    from measure import EngineConfig, MeasureEngine

    with MeasureEngine(llvm_target, tmp_path, EngineConfig(build_workers=2)) as eng:
        yield eng


# Test clusters run without Ray's token authentication (they listen on loopback only); Ray drivers
# started by the tests must not look for a token either.
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
