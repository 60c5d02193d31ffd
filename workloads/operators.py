"""Single-operator workloads: the operator families of the DOPpler evaluation, each at shapes taken
from real models (the ``source`` of each says which model and layer). TVM's own operator
definitions (TOPI) describe the computation; ``reference`` recomputes it with NumPy.

fp32 everywhere; operators with a tensor-core path on CUDA (matmul, dense, batch_matmul,
conv2d) are also registered as ``NAME-fp16``: fp16 inputs, fp32 accumulation and output.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import numpy as np
import tvm
from tvm import te, topi

from . import reference as ref
from .registry import register
from .workload import Workload, prim_func_inputs

# (dtype of the inputs) -> (input placeholders, output)
Compute = Callable[[str], tuple[list[te.Tensor], te.Tensor]]


@dataclass(frozen=True)
class OperatorCase:
    family: str
    name: str
    source: str
    compute: Compute
    reference: Callable[..., np.ndarray]
    fp16: bool = False  # also registered as NAME-fp16

    def workload(self, dtype: str = "float32") -> Workload:
        inputs, output = self.compute(dtype)
        suffix = "" if dtype == "float32" else "-fp16"
        description = f"{self.family}, {self.source}, {'fp16 in / fp32 out' if suffix else 'fp32'}"
        return prim_func_workload(
            self.name + suffix, te.create_prim_func([*inputs, output]), description, self.source, self.reference
        )


def prim_func_workload(
    name: str,
    func: tvm.tirx.PrimFunc,
    description: str,
    source: str = "",
    reference: Callable[..., np.ndarray] | None = None,
) -> Workload:
    """Wrap a PrimFunc as a workload whose inputs are the function's buffer arguments."""
    func = func.with_attr("global_symbol", "main")
    mod = tvm.IRModule({"main": func})
    return Workload(
        name=name,
        kind="tir",
        mod=mod,
        inputs=prim_func_inputs(func),
        description=description,
        source=source,
        reference=reference,
    )


# Accumulation and output type for every input dtype: fp16 inputs accumulate in fp32, the
# tensor-core way.
ACCUMULATE = "float32"


# -- the computations -----------------------------------------------------------------------------
def matmul_compute(m: int, n: int, k: int) -> Compute:
    def compute(dtype: str):
        a = te.placeholder((m, k), dtype, name="A")
        b = te.placeholder((k, n), dtype, name="B")
        r = te.reduce_axis((0, k), name="k")
        out = ACCUMULATE
        c = te.compute((m, n), lambda i, j: te.sum(a[i, r].astype(out) * b[r, j].astype(out), axis=r), name="C")
        return [a, b], c

    return compute


def matmul(m: int, n: int, k: int, dtype: str = "float32") -> tvm.tirx.PrimFunc:
    """C[m, n] = A[m, k] @ B[k, n]."""
    inputs, output = matmul_compute(m, n, k)(dtype)
    return te.create_prim_func([*inputs, output])


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


def dense_compute(m: int, n: int, k: int) -> Compute:
    def compute(dtype: str):
        x = te.placeholder((m, k), dtype, name="x")
        w = te.placeholder((n, k), dtype, name="weight")
        return [x, w], topi.nn.dense(x, w, out_dtype=ACCUMULATE)

    return compute


def batch_matmul_compute(b: int, m: int, n: int, k: int) -> Compute:
    def compute(dtype: str):
        x = te.placeholder((b, m, k), dtype, name="a")
        y = te.placeholder((b, n, k), dtype, name="b")
        return [x, y], topi.nn.batch_matmul(x, y, out_dtype=ACCUMULATE)

    return compute


def softmax_compute(shape) -> Compute:
    def compute(dtype: str):
        x = te.placeholder(shape, dtype, name="x")
        return [x], topi.nn.softmax(x, axis=-1)

    return compute


def layer_norm_compute(rows: int, hidden: int) -> Compute:
    def compute(dtype: str):
        x = te.placeholder((rows, hidden), dtype, name="x")
        gamma = te.placeholder((hidden,), dtype, name="gamma")
        beta = te.placeholder((hidden,), dtype, name="beta")
        return [x, gamma, beta], topi.nn.layer_norm(x, gamma, beta, axis=[-1], epsilon=1e-5)

    return compute


def rms_norm_compute(rows: int, hidden: int) -> Compute:
    def compute(dtype: str):
        x = te.placeholder((rows, hidden), dtype, name="x")
        weight = te.placeholder((hidden,), dtype, name="weight")
        return [x, weight], topi.nn.rms_norm(x, weight, axis=[-1], epsilon=1e-5)

    return compute


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


def bias_activation_compute(shape, bias_shape, activation: str) -> Compute:
    """The epilogue fused after a convolution or linear layer: activation(x + bias)."""

    def compute(dtype: str):
        x = te.placeholder(shape, dtype, name="x")
        bias = te.placeholder(bias_shape, dtype, name="bias")
        added = topi.add(x, bias)
        if activation == "relu":
            return [x, bias], topi.nn.relu(added)
        if activation == "gelu":
            return [x, bias], te.compute(
                shape, lambda *i: 0.5 * added(*i) * (1 + te.erf(added(*i) * 0.7071067811865476)), name="gelu"
            )
        raise ValueError(activation)

    return compute


def swiglu_compute(rows: int, hidden: int) -> Compute:
    """SiLU(gate) * up, the epilogue of a Llama MLP's gate and up projections."""

    def compute(dtype: str):
        gate = te.placeholder((rows, hidden), dtype, name="gate")
        up = te.placeholder((rows, hidden), dtype, name="up")
        y = te.compute((rows, hidden), lambda i, j: gate[i, j] / (1 + te.exp(-gate[i, j])) * up[i, j], name="swiglu")
        return [gate, up], y

    return compute


# -- the cases --------------------------------------------------------------------------------------
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
    # dense, small batch (one sample) and large batch (a 128-token sequence)
    OperatorCase(
        "dense (small batch)",
        "dense-resnet50-fc",
        "ResNet-50 classifier: 2048 -> 1000, batch 1",
        dense_compute(1, 1000, 2048),
        ref.dense,
    ),
    OperatorCase(
        "dense (small batch)",
        "dense-vgg16-fc6",
        "VGG-16 fc6: 25088 -> 4096, batch 1",
        dense_compute(1, 4096, 25088),
        ref.dense,
    ),
    OperatorCase(
        "dense (small batch)",
        "dense-bert-base-pooler",
        "BERT-base pooler: 768 -> 768, batch 1",
        dense_compute(1, 768, 768),
        ref.dense,
    ),
    OperatorCase(
        "dense (large batch)",
        "dense-bert-base-ffn1",
        "BERT-base FFN up-projection: 768 -> 3072 over 128 tokens",
        dense_compute(128, 3072, 768),
        ref.dense,
        fp16=True,
    ),
    OperatorCase(
        "dense (large batch)",
        "dense-bert-base-ffn2",
        "BERT-base FFN down-projection: 3072 -> 768 over 128 tokens",
        dense_compute(128, 768, 3072),
        ref.dense,
    ),
    OperatorCase(
        "dense (large batch)",
        "dense-bert-base-qkv",
        "BERT-base fused Q/K/V projection: 768 -> 2304 over 128 tokens",
        dense_compute(128, 2304, 768),
        ref.dense,
    ),
    # batch_matmul: attention
    OperatorCase(
        "batch_matmul",
        "batch-matmul-bert-base-qk",
        "BERT-base attention scores Q K^T: 12 heads, 128 tokens, head dim 64",
        batch_matmul_compute(12, 128, 128, 64),
        ref.batch_matmul,
        fp16=True,
    ),
    OperatorCase(
        "batch_matmul",
        "batch-matmul-bert-base-av",
        "BERT-base attention-weighted values (V given transposed): 12 heads, 128 tokens, head dim 64",
        batch_matmul_compute(12, 128, 64, 128),
        ref.batch_matmul,
    ),
    OperatorCase(
        "batch_matmul",
        "batch-matmul-vit-b16-qk",
        "ViT-B/16 attention scores Q K^T: 12 heads, 197 tokens, head dim 64",
        batch_matmul_compute(12, 197, 197, 64),
        ref.batch_matmul,
    ),
    # matmul as in a 7B-class LLM (Llama-2-7B: hidden 4096, MLP 11008), a 32-token prefill chunk and one decode step
    OperatorCase(
        "matmul (LLM)",
        "matmul-llama2-7b-qproj",
        "Llama-2-7B attention q_proj: 4096 -> 4096 over 32 tokens",
        matmul_compute(32, 4096, 4096),
        ref.matmul,
        fp16=True,
    ),
    OperatorCase(
        "matmul (LLM)",
        "matmul-llama2-7b-gate",
        "Llama-2-7B MLP gate_proj: 4096 -> 11008 over 32 tokens",
        matmul_compute(32, 11008, 4096),
        ref.matmul,
        fp16=True,
    ),
    OperatorCase(
        "matmul (LLM)",
        "matmul-llama2-7b-down",
        "Llama-2-7B MLP down_proj: 11008 -> 4096 over 32 tokens",
        matmul_compute(32, 4096, 11008),
        ref.matmul,
        fp16=True,
    ),
    OperatorCase(
        "matmul (LLM)",
        "matmul-llama2-7b-qproj-decode",
        "Llama-2-7B attention q_proj in one decode step: 4096 -> 4096, 1 token",
        matmul_compute(1, 4096, 4096),
        ref.matmul,
        fp16=True,
    ),
    # softmax
    OperatorCase(
        "softmax",
        "softmax-bert-base-attn",
        "BERT-base attention softmax: 12 heads x 128 x 128",
        softmax_compute((12, 128, 128)),
        ref.softmax,
    ),
    OperatorCase(
        "softmax",
        "softmax-vit-b16-attn",
        "ViT-B/16 attention softmax: 12 heads x 197 x 197",
        softmax_compute((12, 197, 197)),
        ref.softmax,
    ),
    OperatorCase(
        "softmax",
        "softmax-llama2-7b-logits",
        "Llama-2-7B next-token distribution over the 32000-token vocabulary",
        softmax_compute((1, 32000)),
        ref.softmax,
    ),
    # layer_norm / rms_norm
    OperatorCase(
        "layer_norm",
        "layernorm-bert-base",
        "BERT-base LayerNorm: 128 tokens x 768",
        layer_norm_compute(128, 768),
        ref.layer_norm,
    ),
    OperatorCase(
        "layer_norm",
        "layernorm-vit-b16",
        "ViT-B/16 LayerNorm: 197 tokens x 768",
        layer_norm_compute(197, 768),
        ref.layer_norm,
    ),
    OperatorCase(
        "rms_norm",
        "rmsnorm-llama2-7b",
        "Llama-2-7B RMSNorm: 32 tokens x 4096",
        rms_norm_compute(32, 4096),
        ref.rms_norm,
    ),
    OperatorCase(
        "rms_norm",
        "rmsnorm-llama2-13b",
        "Llama-2-13B RMSNorm: 32 tokens x 5120",
        rms_norm_compute(32, 5120),
        ref.rms_norm,
    ),
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
    # element-wise fused epilogues
    OperatorCase(
        "epilogue",
        "bias-relu-resnet50-l1",
        "ResNet-50 layer1 conv epilogue: bias + ReLU on 64 ch at 56x56",
        bias_activation_compute((1, 64, 56, 56), (1, 64, 1, 1), "relu"),
        lambda x, b: np.maximum(x + b, 0),
    ),
    OperatorCase(
        "epilogue",
        "bias-gelu-bert-base-ffn",
        "BERT-base FFN epilogue: bias + GELU on 128 tokens x 3072",
        bias_activation_compute((128, 3072), (3072,), "gelu"),
        lambda x, b: ref.gelu(x.astype(np.float64) + b),
    ),
    OperatorCase(
        "epilogue",
        "swiglu-llama2-7b-mlp",
        "Llama-2-7B MLP epilogue: SiLU(gate) * up on 32 tokens x 11008",
        swiglu_compute(32, 11008),
        lambda g, u: ref.silu(g.astype(np.float64)) * u,
    ),
]


def _register(case: OperatorCase) -> None:
    register(case.name, "operator", case.source, family=case.family)(case.workload)
    if case.fp16:
        register(f"{case.name}-fp16", "operator", case.source + " (fp16)", family=case.family)(
            partial(case.workload, "float16")
        )


for _case in CASES:
    _register(_case)


def _square_matmul(size: int):
    return OperatorCase(
        "matmul",
        f"matmul-{size}",
        f"square {size}x{size}x{size} GEMM, the standard benchmark shape",
        matmul_compute(size, size, size),
        ref.matmul,
    )


for _size in (128, 512, 1024):
    _register(_square_matmul(_size))
