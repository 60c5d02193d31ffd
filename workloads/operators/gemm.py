"""Matrix products: matmul, dense (a linear layer) and batch_matmul (attention)."""

from __future__ import annotations

import tvm
from tvm import te, topi

from .. import reference as ref
from .case import ACCUMULATE, Compute, OperatorCase


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


CASES: list[OperatorCase] = [
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
]


def _square_matmul(size: int):
    return OperatorCase(
        "matmul",
        f"matmul-{size}",
        f"square {size}x{size}x{size} GEMM, the standard benchmark shape",
        matmul_compute(size, size, size),
        ref.matmul,
    )


# the square GEMMs of benchmarks, at no layer of a model: registered as matmul-SIZE, not in CASES
SQUARE_MATMULS = [_square_matmul(size) for size in (128, 512, 1024)]
