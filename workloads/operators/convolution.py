"""Convolutions: conv1d, conv2d, conv3d, depthwise and grouped conv2d, conv2d_transpose."""

from __future__ import annotations

from functools import partial

import tvm
from tvm import te, topi

from .. import reference as ref
from .case import ACCUMULATE, Compute, OperatorCase


def conv_compute(kind: str, data_shape, weight_shape, stride, pad, groups: int = 1) -> Compute:
    def compute(dtype: str):
        data = te.placeholder(data_shape, dtype, name="data")
        weight = te.placeholder(weight_shape, dtype, name="weight")
        out = ACCUMULATE
        if kind == "conv1d":
            y = topi.nn.conv1d_ncw(data, weight, stride, pad, 1, out_dtype=out)
        elif kind == "conv2d":
            y = topi.nn.conv2d_nchw(data, weight, stride, pad, 1, out_dtype=out)
        elif kind == "conv3d":
            y = topi.nn.conv3d_ncdhw(data, weight, stride, pad, 1, 1, out_dtype=out)
        elif kind == "depthwise":
            y = topi.nn.depthwise_conv2d_nchw(data, weight, stride, pad, 1, out_dtype=out)
        elif kind == "group":
            y = topi.nn.group_conv2d_nchw(data, weight, stride, pad, 1, groups, out_dtype=out)
        else:
            raise ValueError(kind)
        return [data, weight], y

    return compute


def conv2d_nchw(
    n: int, c: int, h: int, w: int, k: int, kernel: int, stride: int, pad: int, dtype: str = "float32"
) -> tvm.tirx.PrimFunc:
    """A 2-D convolution in NCHW layout with a KCRS weight."""
    inputs, output = conv_compute("conv2d", (n, c, h, w), (k, c, kernel, kernel), stride, pad)(dtype)
    return te.create_prim_func([*inputs, output])


def conv2d_transpose_compute(data_shape, weight_shape, stride: int, pad: int) -> Compute:
    def compute(dtype: str):
        data = te.placeholder(data_shape, dtype, name="data")
        weight = te.placeholder(weight_shape, dtype, name="weight")
        return [data, weight], topi.nn.conv2d_transpose_nchw(
            data, weight, (stride, stride), (pad, pad), ACCUMULATE, (0, 0)
        )

    return compute


def _conv(kind, name, source, data, weight, stride, pad, groups=1, fp16=False) -> OperatorCase:
    family = {
        "conv1d": "conv1d",
        "conv2d": "conv2d",
        "conv3d": "conv3d",
        "depthwise": "depthwise conv2d",
        "group": "grouped conv2d",
    }[kind]
    reference_groups = data[1] if kind == "depthwise" else groups
    reshape = (lambda w: w.reshape(w.shape[0] * w.shape[1], 1, *w.shape[2:])) if kind == "depthwise" else (lambda w: w)
    return OperatorCase(
        family,
        name,
        source,
        conv_compute(kind, data, weight, stride, pad, groups),
        lambda x, w: ref.conv(x, reshape(w), stride, pad, groups=reference_groups),
        fp16,
    )


CASES: list[OperatorCase] = [
    # conv1d (NCW): speech front ends
    _conv(
        "conv1d",
        "conv1d-wav2vec2-l0",
        "wav2vec 2.0 base feature encoder conv 0: 1->512 ch, kernel 10, stride 5, 1 s of 16 kHz audio",
        (1, 1, 16000),
        (512, 1, 10),
        5,
        0,
    ),
    _conv(
        "conv1d",
        "conv1d-wav2vec2-l1",
        "wav2vec 2.0 base feature encoder conv 1: 512->512 ch, kernel 3, stride 2",
        (1, 512, 3199),
        (512, 512, 3),
        2,
        0,
    ),
    _conv(
        "conv1d",
        "conv1d-whisper-base-conv1",
        "Whisper base encoder conv1: 80 mel bins -> 512 ch, kernel 3, 30 s of audio",
        (1, 80, 3000),
        (512, 80, 3),
        1,
        1,
    ),
    # conv2d (NCHW): ResNet-50 at 224x224
    _conv(
        "conv2d",
        "conv2d-resnet50-stem",
        "ResNet-50 stem: 7x7 stride 2, 3->64 ch at 224x224",
        (1, 3, 224, 224),
        (64, 3, 7, 7),
        2,
        3,
    ),
    _conv(
        "conv2d",
        "conv2d-resnet50-l1",
        "ResNet-50 layer1 bottleneck 3x3: 64->64 ch at 56x56",
        (1, 64, 56, 56),
        (64, 64, 3, 3),
        1,
        1,
        fp16=True,
    ),
    _conv(
        "conv2d",
        "conv2d-resnet50-l3",
        "ResNet-50 layer3 bottleneck 3x3: 256->256 ch at 14x14",
        (1, 256, 14, 14),
        (256, 256, 3, 3),
        1,
        1,
        fp16=True,
    ),
    _conv(
        "conv2d",
        "conv2d-resnet50-l4-1x1",
        "ResNet-50 layer4 bottleneck 1x1 expansion: 512->2048 ch at 7x7",
        (1, 512, 7, 7),
        (2048, 512, 1, 1),
        1,
        0,
    ),
    _conv(
        "conv2d",
        "conv2d-resnet18-l2",
        "ResNet-18 layer2 3x3: 128->128 ch at 28x28",
        (1, 128, 28, 28),
        (128, 128, 3, 3),
        1,
        1,
    ),
    # conv3d (NCDHW): video and volumetric networks
    _conv(
        "conv3d",
        "conv3d-r3d18-l3",
        "R3D-18 (video ResNet, 16x112x112 clips) layer3 3x3x3: 256->256 ch at 4x14x14",
        (1, 256, 4, 14, 14),
        (256, 256, 3, 3, 3),
        1,
        1,
    ),
    _conv(
        "conv3d",
        "conv3d-r3d18-l4",
        "R3D-18 layer4 3x3x3: 512->512 ch at 2x7x7",
        (1, 512, 2, 7, 7),
        (512, 512, 3, 3, 3),
        1,
        1,
    ),
    _conv(
        "conv3d",
        "conv3d-unet3d-enc1",
        "3D U-Net encoder level 1 3x3x3: 32->64 ch at 32x32x32",
        (1, 32, 32, 32, 32),
        (64, 32, 3, 3, 3),
        1,
        1,
    ),
    # depthwise conv2d: MobileNetV2 at 224x224
    _conv(
        "depthwise",
        "depthwise-conv2d-mobilenetv2-b1",
        "MobileNetV2 block 1 depthwise 3x3: 32 ch at 112x112",
        (1, 32, 112, 112),
        (32, 1, 3, 3),
        1,
        1,
    ),
    _conv(
        "depthwise",
        "depthwise-conv2d-mobilenetv2-b4",
        "MobileNetV2 block 4 depthwise 3x3: 144 ch at 56x56",
        (1, 144, 56, 56),
        (144, 1, 3, 3),
        1,
        1,
    ),
    _conv(
        "depthwise",
        "depthwise-conv2d-mobilenetv2-b16",
        "MobileNetV2 block 16 depthwise 3x3: 960 ch at 7x7",
        (1, 960, 7, 7),
        (960, 1, 3, 3),
        1,
        1,
    ),
    # grouped conv2d: several group counts
    _conv(
        "group",
        "group-conv2d-alexnet-conv2",
        "AlexNet (original, two GPUs) conv2: 96->256 ch in 2 groups, 5x5 at 27x27",
        (1, 96, 27, 27),
        (256, 48, 5, 5),
        1,
        2,
        groups=2,
    ),
    _conv(
        "group",
        "group-conv2d-regnetx400mf-s3",
        "RegNetX-400MF stage 3: 160 ch in 10 groups of 16, 3x3 at 14x14",
        (1, 160, 14, 14),
        (160, 16, 3, 3),
        1,
        1,
        groups=10,
    ),
    _conv(
        "group",
        "group-conv2d-resnext50-l1",
        "ResNeXt-50 32x4d layer1: 128 ch in 32 groups, 3x3 at 56x56",
        (1, 128, 56, 56),
        (128, 4, 3, 3),
        1,
        1,
        groups=32,
    ),
    _conv(
        "group",
        "group-conv2d-resnext50-l3",
        "ResNeXt-50 32x4d layer3: 512 ch in 32 groups, 3x3 at 14x14",
        (1, 512, 14, 14),
        (512, 16, 3, 3),
        1,
        1,
        groups=32,
    ),
    # conv2d_transpose: DCGAN generator (64x64 images)
    OperatorCase(
        "conv2d_transpose",
        "conv2d-transpose-dcgan-g2",
        "DCGAN generator layer 2: 512->256 ch, 4x4 stride 2, 4x4 -> 8x8",
        conv2d_transpose_compute((1, 512, 4, 4), (512, 256, 4, 4), 2, 1),
        partial(ref.conv2d_transpose, stride=2, padding=1),
    ),
    OperatorCase(
        "conv2d_transpose",
        "conv2d-transpose-dcgan-g3",
        "DCGAN generator layer 3: 256->128 ch, 4x4 stride 2, 8x8 -> 16x16",
        conv2d_transpose_compute((1, 256, 8, 8), (256, 128, 4, 4), 2, 1),
        partial(ref.conv2d_transpose, stride=2, padding=1),
    ),
    OperatorCase(
        "conv2d_transpose",
        "conv2d-transpose-dcgan-g4",
        "DCGAN generator layer 4: 128->64 ch, 4x4 stride 2, 16x16 -> 32x32",
        conv2d_transpose_compute((1, 128, 16, 16), (128, 64, 4, 4), 2, 1),
        partial(ref.conv2d_transpose, stride=2, padding=1),
    ),
]
