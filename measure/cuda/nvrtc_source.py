"""CUDA sources that NVRTC compiles without the libcu++ header they do not use.

TVM's CUDA code generator starts every source with a block for NVRTC alone (``#ifdef __CUDACC_RTC__``)
that includes libcu++'s ``<cuda/std/type_traits>`` and aliases eight of its traits into ``namespace std``.
Parsing that header is most of an NVRTC compile: 0.83 s of each on a 2-core Xeon, where a small kernel
alone compiles in 0.03 s and an fp16 tensor-core candidate whole in 0.22 s instead of 1.0 s. The
kernels TVM generates name none of the traits, so :func:`without_unused_type_traits` drops the include
and the aliases wherever the rest of the source does not name them; the kernels' machine code is the
same byte for byte (what goes are libcu++'s own constants, which nothing reads).

:func:`use_lean_nvrtc_sources` puts that in front of TVM's NVRTC path, in the process that builds
(a build worker: ``measure.workers.main``), with :func:`nvrtc_options` (a model's module of several kernels
optimised on every core); nvcc's path is TVM's own, untouched.
"""

from __future__ import annotations

import os
import re

from .compile_env import COMPILE_MODE_ENV

COMPILE_CALLBACK = "tvm_callback_cuda_compile"  # the global function TVM's CUDA codegen compiles through
LEAN_SOURCES = "without the libcu++ type traits they do not use"  # what a build worker's log says
LEAN_ENV = "TENSOR_TUNER_LEAN_NVRTC"  # "0": NVRTC compiles TVM's sources as they are, to compare

# The include and the aliases after it, as TVM's codegen writes them (the aliases are the group)
_TRAITS_BLOCK = re.compile(
    r"[ \t]*#include <cuda/std/type_traits>[ \t]*\n"
    r"[ \t]*namespace std \{[ \t]*\n"
    r"((?:[ \t]*using cuda::std::\w+;[ \t]*\n)+)"
    r"[ \t]*\}[ \t]*\n"
)
_ALIAS = re.compile(r"using cuda::std::(\w+);")
_KERNEL = re.compile(r'extern "C" __global__ void (?:__\w+__\([^)]*\) )*(\w+)\(')  # its name, after attributes
SPLIT_COMPILE = "--split-compile=0"  # NVVM optimises a module's functions in parallel, on every core


def without_unused_type_traits(code: str) -> str:
    """``code`` without TVM's NVRTC-only include of ``<cuda/std/type_traits>`` and its aliases in
    ``namespace std``, where nothing else in it names one of them (else ``code`` as it is)."""
    block = _TRAITS_BLOCK.search(code)
    if block is None:
        return code
    rest = code[: block.start()] + code[block.end() :]
    if re.search(rf"\b(?:{'|'.join(_ALIAS.findall(block.group(1)))})\b", rest):
        return code
    return rest


def nvrtc_options(code: str) -> list[str] | None:
    """NVRTC's options beyond TVM's for ``code``: a model's module of several kernels is optimised on every
    core (``--split-compile=0``; the kernels' machine code is the same: ResNet-18's 20 kernels in fp16 in
    4.5 s instead of 5.8 on two cores); a candidate's one kernel has nothing to split."""
    return [SPLIT_COMPILE] if len(set(_KERNEL.findall(code))) > 1 else None


def use_lean_nvrtc_sources() -> bool:
    """Compile this process's CUDA code through :func:`without_unused_type_traits` where the compile
    path is NVRTC (``$TVM_CUDA_COMPILE_MODE``, read at each compile as TVM's callback reads it); TVM's
    own callback stays where ``LEAN_ENV`` is "0". Whether it was put in front."""
    if os.environ.get(LEAN_ENV) == "0":
        return False
    import tvm_ffi
    from tvm.support import nvcc  # registers TVM's callback first: ours then replaces it

    def compile_cuda(code: str, *_target) -> bytearray:
        if os.environ.get(COMPILE_MODE_ENV, "nvrtc").lower() == "nvrtc":
            lean = without_unused_type_traits(code)
            return nvcc.compile_cuda(lean, target_format="cubin", compiler="nvrtc", options=nvrtc_options(lean))
        return nvcc.tvm_callback_cuda_compile(code)

    tvm_ffi.register_global_func(COMPILE_CALLBACK, compile_cuda, override=True)
    return True
