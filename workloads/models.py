"""Whole models built locally with random weights: tuning needs shapes, not trained values."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import tvm
from tvm import relax

from .registry import register
from .workload import TensorSpec, Workload


class RelaxGraph:
    """A small helper over Relax's BlockBuilder that emits layers with random weights bound as constants."""

    def __init__(self, seed: int = 0):
        self.bb = relax.BlockBuilder()
        self.rng = np.random.default_rng(seed)

    def weight(self, shape: tuple[int, ...], fan_in: int, dtype: str = "float32") -> relax.Constant:
        values = self.rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)
        return relax.const(values.astype(dtype))

    def conv2d(self, x: relax.Expr, cin: int, cout: int, kernel: int, stride: int = 1, relu: bool = True) -> relax.Expr:
        w = self.weight((cout, cin, kernel, kernel), cin * kernel * kernel)
        y = self.bb.emit(relax.op.nn.conv2d(x, w, strides=stride, padding=kernel // 2))
        y = self.bb.emit(relax.op.add(y, self.weight((1, cout, 1, 1), cout)))
        return self.bb.emit(relax.op.nn.relu(y)) if relu else y

    def dense(self, x: relax.Expr, cin: int, cout: int) -> relax.Expr:
        y = self.bb.emit(relax.op.matmul(x, self.weight((cin, cout), cin)))
        return self.bb.emit(relax.op.add(y, self.weight((cout,), cout)))

    def residual_block(self, x: relax.Expr, cin: int, cout: int, stride: int) -> relax.Expr:
        y = self.conv2d(x, cin, cout, 3, stride)
        y = self.conv2d(y, cout, cout, 3, relu=False)
        shortcut = x if (cin == cout and stride == 1) else self.conv2d(x, cin, cout, 1, stride, relu=False)
        return self.bb.emit(relax.op.nn.relu(relax.op.add(y, shortcut)))

    def build(self, inputs: list[TensorSpec], body: Callable[["RelaxGraph", list[relax.Var]], relax.Expr]) -> tvm.IRModule:
        params = [relax.Var(spec.name, relax.TensorType(spec.shape, spec.dtype)) for spec in inputs]
        with self.bb.function("main", params):
            with self.bb.dataflow():
                out = self.bb.emit_output(body(self, params))
            self.bb.emit_func_output(out)
        return self.bb.get()


def model_workload(name: str, inputs: list[TensorSpec], body: Callable, description: str, seed: int = 0) -> Workload:
    mod = RelaxGraph(seed).build(inputs, body)
    return Workload(name=name, kind="relax", mod=mod, inputs=inputs, description=description)


def _tiny_resnet(g: RelaxGraph, args: list[relax.Var]) -> relax.Expr:
    x = g.conv2d(args[0], 3, 16, 3)
    x = g.residual_block(x, 16, 16, 1)
    x = g.residual_block(x, 16, 32, 2)
    pooled = g.bb.emit(relax.op.mean(x, axis=[2, 3]))
    return g.dense(pooled, 32, 10)


@register("tiny-resnet", "model", "a 2-block residual CNN on 32x32 images (CIFAR-sized), for quick end-to-end runs")
def tiny_resnet() -> Workload:
    return model_workload(
        "tiny-resnet",
        [TensorSpec("x", (1, 3, 32, 32))],
        _tiny_resnet,
        "ResNet-style CNN: 3x3 stem, two basic blocks (16 and 32 channels), global pool, dense; batch 1, fp32",
    )
