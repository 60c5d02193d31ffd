"""TVMScript parses the same with ``inspect.stack`` made light (codegen/script_parsing.py), which is how the
tensor intrinsics are imported (codegen.tensor_cores.ensure_tensor_intrinsics)."""

import inspect

import pytest
import tvm_ffi
from tvm.script import tirx as T

from codegen.script_parsing import light_frame_stacks


def _stacks(depth: int):
    """inspect.stack() as Python gives it and as it is within light_frame_stacks, ``depth`` calls down."""
    if depth:
        return _stacks(depth - 1)
    whole = inspect.stack()
    with light_frame_stacks():
        light = inspect.stack()
    return whole, light


def test_the_light_stack_has_the_same_frames_and_the_first_three_source_lines():
    whole, light = _stacks(3)
    assert [(f.frame, f.filename, f.function) for f in whole] == [(f.frame, f.filename, f.function) for f in light]
    assert [(f.lineno, f.code_context) for f in whole[1:3]] == [(f.lineno, f.code_context) for f in light[1:3]]
    assert light[0].code_context == ["        light = inspect.stack()\n"]  # the line that asked
    assert all(f.code_context is None for f in light[3:])


def _copy(scale: float):
    @T.prim_func
    def main(a: T.Buffer((8,), "float32"), b: T.Buffer((8,), "float32")):
        for i in range(8):
            b[i] = a[i] * T.float32(scale)

    return main


def test_a_prim_func_parses_the_same_and_the_stack_comes_back():
    original = inspect.stack
    with light_frame_stacks():
        assert inspect.stack is not original
        with light_frame_stacks():  # nested: the outer one still holds when this one ends
            pass
        light = _copy(2.0)
    assert inspect.stack is original
    assert tvm_ffi.structural_equal(light, _copy(2.0)) and not tvm_ffi.structural_equal(light, _copy(3.0))
    with pytest.raises(ValueError), light_frame_stacks():
        raise ValueError("a failed parse")
    assert inspect.stack is original
