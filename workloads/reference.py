"""NumPy references for the built-in operators: what each kernel must compute, independent of TVM."""

from __future__ import annotations

import string
from collections.abc import Sequence

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view


def _tuple(value: int | Sequence[int], n: int) -> tuple[int, ...]:
    return tuple(value) if isinstance(value, (tuple, list)) else (value,) * n


def conv(x: np.ndarray, w: np.ndarray, stride=1, padding=0, dilation=1, groups: int = 1) -> np.ndarray:
    """N-d convolution: x is (N, C, *spatial), w is (O, C // groups, *kernel); symmetric padding."""
    nd = x.ndim - 2
    stride, padding, dilation = _tuple(stride, nd), _tuple(padding, nd), _tuple(dilation, nd)
    x = np.pad(x.astype(np.float64), [(0, 0), (0, 0)] + [(p, p) for p in padding])
    kernel = w.shape[2:]
    span = [(k - 1) * d + 1 for k, d in zip(kernel, dilation, strict=True)]
    windows = sliding_window_view(x, span, axis=tuple(range(2, 2 + nd)))
    windows = windows[
        (slice(None), slice(None), *(slice(None, None, s) for s in stride), *(slice(None, None, d) for d in dilation))
    ]
    n, c = x.shape[:2]
    o = w.shape[0]
    out_spatial = windows.shape[2 : 2 + nd]
    windows = windows.reshape(n, groups, c // groups, *out_spatial, *kernel)
    weights = w.astype(np.float64).reshape(groups, o // groups, c // groups, *kernel)
    sp, ks = string.ascii_lowercase[:nd], string.ascii_lowercase[nd : 2 * nd]
    out = np.einsum(f"NGC{sp}{ks},GOC{ks}->NGO{sp}", windows, weights, optimize=True)
    return out.reshape(n, o, *out_spatial)


def conv2d_transpose(x: np.ndarray, w: np.ndarray, stride: int, padding: int, output_padding: int = 0) -> np.ndarray:
    """Transposed 2-d convolution with w of shape (C_in, C_out, kh, kw), as TVM and PyTorch define it."""
    n, c, h, width = x.shape
    kh, kw = w.shape[2:]
    dilated = np.zeros((n, c, (h - 1) * stride + 1, (width - 1) * stride + 1), dtype=np.float64)
    dilated[:, :, ::stride, ::stride] = x
    pad_h, pad_w = kh - 1 - padding, kw - 1 - padding
    dilated = np.pad(dilated, [(0, 0), (0, 0), (pad_h, pad_h + output_padding), (pad_w, pad_w + output_padding)])
    flipped = w[:, :, ::-1, ::-1].transpose(1, 0, 2, 3)
    return conv(dilated, flipped)


def dense(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """x (M, K) times w (N, K) transposed."""
    return x.astype(np.float64) @ w.astype(np.float64).T


def matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return a.astype(np.float64) @ b.astype(np.float64)


def batch_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a (B, M, K) times b (B, N, K) transposed, as TVM's batch_matmul by default."""
    return np.einsum("bmk,bnk->bmn", a.astype(np.float64), b.astype(np.float64))


def softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def layer_norm(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float = 1e-5) -> np.ndarray:
    x = x.astype(np.float64)
    mean = x.mean(axis=-1, keepdims=True)
    var = x.var(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * gamma + beta


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float = 1e-5) -> np.ndarray:
    x = x.astype(np.float64)
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps) * weight


def pool2d(x: np.ndarray, kernel: int, stride: int, padding: int, kind: str, ceil_mode: bool = False) -> np.ndarray:
    """Max or average pooling (padding excluded from neither: averages count padded zeros, as TVM's default)."""
    x = x.astype(np.float64)
    h, w = x.shape[2:]
    extra = [0, 0]
    if ceil_mode:
        for i, size in enumerate((h, w)):
            span = size + 2 * padding - kernel
            extra[i] = (-span) % stride
    fill = -np.inf if kind == "max" else 0.0
    x = np.pad(x, [(0, 0), (0, 0), (padding, padding + extra[0]), (padding, padding + extra[1])], constant_values=fill)
    windows = sliding_window_view(x, (kernel, kernel), axis=(2, 3))[:, :, ::stride, ::stride]
    return windows.max(axis=(-1, -2)) if kind == "max" else windows.mean(axis=(-1, -2))


def global_avg_pool(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float64).mean(axis=(2, 3), keepdims=True)


def gelu(x: np.ndarray) -> np.ndarray:
    from math import erf, sqrt

    return 0.5 * x * (1.0 + np.vectorize(erf)(x / sqrt(2.0)))


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))
