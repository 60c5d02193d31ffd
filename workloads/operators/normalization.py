"""Softmax and the normalizations: layer_norm, rms_norm."""

from __future__ import annotations

from tvm import te, topi

from .. import reference as ref
from .case import Compute, OperatorCase


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


CASES: list[OperatorCase] = [
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
]
