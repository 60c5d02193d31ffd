"""Recognising CUDA errors in TVM's messages, and which of them leave a CUDA context unusable.

TVM names the CUDA error on the first line of its message and may append the kernel's whole
CUDA source after it ("CUDALaunch Error: CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", then the grid,
then the source), or names it mid-message ("CUDA Runtime Error: cudaErrorIllegalAddress (700):
an illegal memory access was encountered"). The line that names the error is the one to keep.
"""

from __future__ import annotations

import re

# A CUDA error as the driver API (CUDA_ERROR_*), the runtime API (cudaError*) or TVM's wrappers name it.
_NAMED = re.compile(r"CUDA_ERROR_[A-Z_]+|cudaError[A-Za-z]+|CUDALaunch Error|CUDA Runtime Error|CUDA error")
# The runtime API's descriptions of errors that leave the context unusable, when no name is given.
_STICKY_DESCRIPTIONS = (
    "illegal memory access",
    "misaligned address",
    "illegal instruction",
    "unspecified launch failure",
    "device-side assert",
)
# Errors after which the context still works: the launch never happened, or an allocation failed.
_RECOVERABLE = (
    "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES",
    "cudaErrorLaunchOutOfResources",
    "CUDA_ERROR_OUT_OF_MEMORY",
    "cudaErrorMemoryAllocation",
    "CUDA_ERROR_INVALID_VALUE",
    "cudaErrorInvalidValue",
    "cudaErrorInvalidConfiguration",
    "CUDA_ERROR_NOT_FOUND",
)


def cuda_error_line(message: str) -> str | None:
    """The line of ``message`` that names a CUDA error, or None if it names none."""
    for line in message.splitlines():
        if _NAMED.search(line) or any(text in line.lower() for text in _STICKY_DESCRIPTIONS):
            return line.strip()
    return None


def poisons_the_context(message: str) -> bool:
    """Whether a CUDA error in ``message`` leaves the process's CUDA context unusable (every later
    call fails): any CUDA error but those known to leave it working."""
    line = cuda_error_line(message)
    return line is not None and not any(name in line for name in _RECOVERABLE)
