"""``LoweringOptions``: which of the lowering's passes run, grouped by pass; what each does and what it
measured is in docs/lowering.md."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class LoweringOptions:
    """How a model is lowered; stored with the tuning database, as its kernels depend on it.

    Grouped by the pass each option switches. ``None``: on where the target is a CPU.
    """

    # inference rewrites of the imported graph (``rewrites``, ``fast_math``, ``row_padding``, ``column_padding``,
    # ``softmax_rows``, ``attention_padding``, ``attention_blocks``)
    fold_batch_norm: bool = True  # eval-mode batch norms folded into the convolutions before them
    fast_math: bool = True  # float32 exp/erf/tanh/sigmoid/softmax as vectorisable approximations
    pad_product_rows: bool = True  # float32 products by weights over row counts that tile badly, a few zero rows more
    pad_product_columns: bool = True  # ... over column counts no vector divides, a few zero columns more
    softmax_by_rows: bool = True  # on CPUs, softmaxes a row per parallel task
    attention_blocks: bool = False  # attentions whose scores outgrow the caches, a block of queries at a time
    pad_attention_tokens: bool = True  # on CPUs, float32 attentions over token counts that tile badly, padded

    # layouts (``channels_last``, ``conv1d``, ``grouped_conv1d``, ``channel_norms``)
    channels_last: bool | None = None  # convolutions in NHWC
    conv1d_as_conv2d: bool | None = None  # 1-D convolutions as 2-D ones one row high; None: with channels_last
    pad_conv1d_positions: bool = True  # ... over output positions that tile badly, a few zero positions more
    grouped_conv1d_channels_last: bool | None = None  # grouped ones (a positional embedding's) as a kernel of ours
    channels_last_resizes: bool = True  # image resizes and sequences reshaped into images kept channels-last
    channel_norms_as_products: bool = True  # channels-last group norms of a channel per group, sums as products
    group_norms_as_products: bool = True  # ... of several channels per group too (BiT's)

    # algorithms (``winograd``, ``inverted_residual``, ``strassen``)
    winograd: bool | None = None  # channels-last 3x3 convolutions by Winograd's algorithm
    fuse_expand_depthwise: bool | None = None  # a 1x1 expanding convolution and the depthwise one after it, one kernel
    fuse_silu_blocks: bool = True  # ... where their activations are SiLUs too (MobileViT, EfficientNet)
    strassen: bool | None = None  # large float32 matmuls by weights as 7 half-size products instead of 8

    # fusion and weights (``reshapes``, ``layout_fusion``, ``layout_free``)
    bounded_reshapes: bool = True  # reshapes read their input at indices simplified for the output's bounds
    fuse_layout: bool = True  # layout-only kernels pulled into the kernels that consume them
    fuse_layout_into_attention: bool = False  # ... into attention's fp32 products of two activations too
    layout_free_weights: bool = True  # weights' layouts chosen by the schedules, transformed once at compile
    broadcast_values_once: bool = True  # values a kernel reads broadcast (a gate per channel) computed once

    # bfloat16 (``bf16``; ``dtype="bfloat16"``)
    bfloat16: bool = False  # convolutions and matmuls by weights from bf16 operands into fp32
    bf16_round_before_moves: bool = True  # activations rounded before the max pools and concatenations reading them
    bf16_max_pools: bool = True  # max pools of our own, comparing the values' bits as 16-bit integers
    bf16_fuse_expand_depthwise: bool = True  # the fused inverted residual kept, its output in bf16
    bf16_image_windows: bool = True  # on AMX, a first convolution reading its padded image in place
    bf16_image_windows_avx512: bool = True  # the same on vdpbf16ps
    bf16_activation_products_avx512: bool = True  # on vdpbf16ps, attention's products bf16 ones too (always on AMX)
    bf16_where_faster: bool = True  # where bf16 products are calibrated slower, products bound by arithmetic in fp32

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_record(cls, record: dict) -> LoweringOptions:
        """The options a work dir was tuned with; an option it predates is off, as it was then."""
        return cls(**{**_PREDATING_RECORDS, **record})


# Options added after work dirs began recording theirs, with the behaviour those work dirs were tuned with.
_PREDATING_RECORDS = {
    "winograd": False,
    "conv1d_as_conv2d": False,
    "fuse_expand_depthwise": False,
    "strassen": False,
    "bfloat16": False,
    "attention_blocks": False,
    "bf16_round_before_moves": False,
    "bf16_max_pools": False,
    "channel_norms_as_products": False,
    "fuse_layout_into_attention": True,
    "softmax_by_rows": False,
    "bf16_image_windows": False,
    "bf16_activation_products_avx512": False,
    "bf16_image_windows_avx512": False,
    "pad_product_rows": False,
    "channels_last_resizes": False,
    "pad_attention_tokens": False,
    "bf16_fuse_expand_depthwise": False,
    "pad_conv1d_positions": False,
    "fuse_silu_blocks": False,
    "pad_product_columns": False,
    "group_norms_as_products": False,
    "grouped_conv1d_channels_last": False,
    "bounded_reshapes": False,
    "broadcast_values_once": False,
    "bf16_where_faster": False,
}
