"""Real kernels that fail in the ways candidates fail: they do not build, build forever, crash, hang,
or compute wrong results. Used to check that every such failure is recorded and tuning goes on."""

from __future__ import annotations

import tvm
from tvm.script import tirx as T


def _module(func) -> tvm.IRModule:
    return tvm.IRModule({"main": func.with_attr("global_symbol", "main")})


def unbuildable() -> tvm.IRModule:
    """Binds a GPU thread on a CPU target: code generation rejects it."""

    @T.prim_func(s_tir=True)
    def main(a: T.Buffer((32,), "float32"), b: T.Buffer((32,), "float32")):
        for i in T.thread_binding(32, thread="threadIdx.x"):
            with T.sblock("b"):
                vi = T.axis.spatial(32, i)
                b[vi] = a[vi] + T.float32(1)

    return _module(main)


def slow_to_build(unroll: int = 200_000) -> tvm.IRModule:
    """A loop unrolled so far that LLVM takes minutes to compile it."""

    @T.prim_func(s_tir=True)
    def main(a: T.Buffer((unroll,), "float32"), b: T.Buffer((unroll,), "float32")):
        for i in T.unroll(unroll):
            with T.sblock("b"):
                vi = T.axis.spatial(unroll, i)
                b[vi] = a[vi] * T.float32(2)

    return _module(main)


def crashing() -> tvm.IRModule:
    """Writes far outside its buffer: the measuring process dies with SIGSEGV."""

    @T.prim_func(s_tir=True)
    def main(a: T.Buffer((16,), "float32"), b: T.Buffer((16,), "float32")):
        b_flat = T.decl_buffer((1,), "float32", data=b.data)
        for i in range(16):
            with T.sblock("b"):
                vi = T.axis.spatial(16, i)
                b_flat[T.int64(1) << T.int64(40) + T.Cast("int64", vi)] = a[vi]

    return _module(main)


def hanging() -> tvm.IRModule:
    """Never returns: a loop whose exit condition is never met."""

    @T.prim_func(s_tir=True)
    def main(a: T.Buffer((1,), "float32"), b: T.Buffer((1,), "float32")):
        with T.sblock("root"):
            i = T.alloc_buffer((1,), "int32", scope="local")
            i[0] = 0
            while i[0] >= 0:
                i[0] = (i[0] + 1) % 7
            b[0] = a[0]

    return _module(main)


def copy(n: int = 64) -> tvm.IRModule:
    """b = a, correctly."""

    @T.prim_func(s_tir=True)
    def main(a: T.Buffer((n,), "float32"), b: T.Buffer((n,), "float32")):
        for i in range(n):
            with T.sblock("b"):
                vi = T.axis.spatial(n, i)
                b[vi] = a[vi]

    return _module(main)


def wrong_copy(n: int = 64) -> tvm.IRModule:
    """Claims to copy a into b but doubles it."""

    @T.prim_func(s_tir=True)
    def main(a: T.Buffer((n,), "float32"), b: T.Buffer((n,), "float32")):
        for i in range(n):
            with T.sblock("b"):
                vi = T.axis.spatial(n, i)
                b[vi] = a[vi] * T.float32(2)

    return _module(main)


def nan_writing(n: int = 64) -> tvm.IRModule:
    """Writes the square root of a negative number (inputs are in [-1, 1]) into its output."""

    @T.prim_func(s_tir=True)
    def main(a: T.Buffer((n,), "float32"), b: T.Buffer((n,), "float32")):
        for i in range(n):
            with T.sblock("b"):
                vi = T.axis.spatial(n, i)
                b[vi] = T.sqrt(a[vi] - T.float32(2))

    return _module(main)


def out_of_memory(n: int = 1 << 40) -> tvm.IRModule:
    """Needs a 4 TiB scratch buffer: its allocation fails when the kernel runs."""

    @T.prim_func(s_tir=True)
    def main(a: T.Buffer((64,), "float32"), b: T.Buffer((64,), "float32")):
        scratch = T.alloc_buffer((n,), "float32")
        for i in range(64):
            with T.sblock("fill"):
                vi = T.axis.spatial(64, i)
                scratch[vi * (n // 64)] = a[vi]
        for i in range(64):
            with T.sblock("b"):
                vi = T.axis.spatial(64, i)
                b[vi] = scratch[vi * (n // 64)]

    return _module(main)


def gpu_out_of_bounds() -> tvm.IRModule:
    """A CUDA kernel that writes far outside its buffer: an illegal memory access on the GPU."""

    @T.prim_func(s_tir=True)
    def main(a: T.Buffer((32,), "float32"), b: T.Buffer((32,), "float32")):
        b_flat = T.decl_buffer((1,), "float32", data=b.data)
        for i in T.thread_binding(32, thread="threadIdx.x"):
            with T.sblock("b"):
                vi = T.axis.spatial(32, i)
                b_flat[(T.int64(1) << T.int64(40)) + T.Cast("int64", vi)] = a[vi]

    return _module(main)


def gpu_copy(n: int = 32, dtype: str = "float32") -> tvm.IRModule:
    """b = a on the GPU, correctly."""

    @T.prim_func(s_tir=True)
    def main(a: T.Buffer((n,), dtype), b: T.Buffer((n,), dtype)):
        for i in T.thread_binding(n, thread="threadIdx.x"):
            with T.sblock("b"):
                vi = T.axis.spatial(n, i)
                b[vi] = a[vi]

    return _module(main)


def gpu_out_of_resources(threads: int = 1024, live: int = 128) -> tvm.IRModule:
    """A CUDA kernel whose launch fails for lack of registers (CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES):
    each of its 1024 threads keeps ``live`` values in registers across a loop (ptxas gives it more
    than 128 registers), and its register limit is lifted (``__maxnreg__(255)`` instead of a launch
    bound), while a block of 1024 threads can have 64 registers each."""

    @T.prim_func
    def main(a: T.Buffer((threads * live,), "float32"), b: T.Buffer((threads * live,), "float32")):
        for tx in T.thread_binding(threads, thread="threadIdx.x"):
            with T.attr(0, "tirx.max_registers", 255):
                acc = T.decl_buffer((live,), "float32", scope="local")
                for j in T.unroll(live):
                    acc[j] = a[j * threads + tx]
                for _ in range(64):
                    for j in T.unroll(live):
                        acc[j] = acc[j] * acc[(j + 1) % live] + T.float32(1)
                for j in T.unroll(live):
                    b[j * threads + tx] = acc[j]

    return _module(main)


def failing_with(message: str, n: int = 64) -> tvm.IRModule:
    """b = a on a CPU, except that every run fails with ``message`` (an assertion in the kernel
    that the inputs, drawn from [-1, 1], never meet): a real failure carrying a chosen text."""

    @T.prim_func(s_tir=True)
    def main(a: T.Buffer((n,), "float32"), b: T.Buffer((n,), "float32")):
        assert a[0] > T.float32(2), message
        for i in range(n):
            with T.sblock("b"):
                vi = T.axis.spatial(n, i)
                b[vi] = a[vi]

    return _module(main)
