"""Pooling: max pooling and global average pooling."""

from __future__ import annotations

from functools import partial

from tvm import te, topi

from .. import reference as ref
from .case import Compute, OperatorCase


def pool_compute(shape, kernel: int, stride: int, pad: int, kind: str, ceil_mode: bool = False) -> Compute:
    def compute(dtype: str):
        x = te.placeholder(shape, dtype, name="x")
        y = topi.nn.pool2d(x, [kernel, kernel], [stride, stride], [1, 1], [pad] * 4, kind, ceil_mode=ceil_mode)
        return [x], y

    return compute


def global_avg_pool_compute(shape) -> Compute:
    def compute(dtype: str):
        x = te.placeholder(shape, dtype, name="x")
        return [x], topi.nn.adaptive_pool(x, (1, 1), "avg")

    return compute


CASES: list[OperatorCase] = [
    # pooling
    OperatorCase(
        "pooling",
        "maxpool-resnet50",
        "ResNet-50 stem max pool 3x3 stride 2: 64 ch at 112x112",
        pool_compute((1, 64, 112, 112), 3, 2, 1, "max"),
        partial(ref.pool2d, kernel=3, stride=2, padding=1, kind="max"),
    ),
    OperatorCase(
        "pooling",
        "maxpool-vgg16-b1",
        "VGG-16 block 1 max pool 2x2 stride 2: 64 ch at 224x224",
        pool_compute((1, 64, 224, 224), 2, 2, 0, "max"),
        partial(ref.pool2d, kernel=2, stride=2, padding=0, kind="max"),
    ),
    OperatorCase(
        "pooling",
        "maxpool-squeezenet11-1",
        "SqueezeNet 1.1 max pool 3x3 stride 2 (ceil mode): 64 ch at 111x111",
        pool_compute((1, 64, 111, 111), 3, 2, 0, "max", ceil_mode=True),
        partial(ref.pool2d, kernel=3, stride=2, padding=0, kind="max", ceil_mode=True),
    ),
    OperatorCase(
        "pooling",
        "avgpool-resnet50-global",
        "ResNet-50 global average pool: 2048 ch at 7x7",
        global_avg_pool_compute((1, 2048, 7, 7)),
        ref.global_avg_pool,
    ),
]
