"""Element-wise epilogues fused after a convolution or a linear layer: bias + activation, SwiGLU."""

from __future__ import annotations

import numpy as np
from tvm import te, topi

from .. import reference as ref
from .case import Compute, OperatorCase


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


CASES: list[OperatorCase] = [
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
