"""What the CUDA build tests share: the compile modes, each skipped where this host lacks it."""

from __future__ import annotations

import shutil

import pytest

from measure.cuda.compile_env import NVRTC_INSTALL, nvrtc_missing

COMPILE_MODES = [
    pytest.param("nvcc", marks=pytest.mark.skipif(shutil.which("nvcc") is None, reason="no nvcc here")),
    pytest.param(
        "nvrtc",
        marks=pytest.mark.skipif(nvrtc_missing() is not None, reason=f"{nvrtc_missing()} ({NVRTC_INSTALL})"),
    ),
]
