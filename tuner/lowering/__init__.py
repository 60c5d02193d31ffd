"""Inference-grade lowering of a Relax model into the fused kernels that are tuned and compiled.

One pipeline, used by task extraction and by compile, so that tuned kernels are the ones compile
looks up:

1. inference rewrites on the imported graph: eval-mode batch norms folded into the convolutions
   before them (and the rest decomposed into element-wise arithmetic), constants folded, the
   importers' slow forms replaced (``rewrites``), zero pads folded into the convolutions they feed
   (``pads``), and, with ``fast_math``, exp/erf/tanh/sigmoid/
   softmax computed by vectorisable approximations instead of one libm call per element; with
   ``attention_blocks``, attentions over long sequences a block of queries at a time; on a CPU,
   convolutions computed channels-last (``channels_last``), those 3x3 convolutions of stride 1
   that reuse their weights enough by Winograd's algorithm (``winograd``), and each 1x1 expanding
   convolution with the depthwise convolution after it as one kernel (``inverted_residual``), and
   large matmuls by constant weights by one level of Strassen's algorithm
   (``strassen``); with ``bfloat16``, convolutions and matmuls by weights from bf16 operands (``bf16``);
2. TVM's legalization and operator fusion (element-wise epilogues such as bias, activation and
   residual add fuse into the convolution or matmul that produces them; a pad or concatenation,
   which writes more than it reads, never does: ``pads`` says why);
3. layout-only kernels pulled into the kernels that consume them (``layout_fusion``), pure
   reshapes turned into views;
4. the model's weights marked layout-free, so that MetaSchedule may choose their layout: compile
   then transforms the constants once (``measure.build_job``), not on every call.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

import tvm
from tvm import relax
from tvm.relax import pipeline as relax_pipeline

from measure.bf16_dot import AMX

from ..precision import bf16_unit
from .attention_blocks import AttentionInQueryBlocks
from .bf16 import Bfloat16Products
from .bf16_pool import Bf16MaxPools
from .bf16_rounding import RoundBeforeMoves
from .channel_norms import PerChannelNormsAsProducts
from .channels_last import ChannelsLastConvolutions
from .conv1d import Conv1dAsConv2d
from .inverted_residual import FuseExpandDepthwise
from .layout_free import KeepLayoutFreeWeightsOfReductions
from .layout_fusion import FuseLayoutIntoConsumers
from .pads import FoldPadsIntoConvolutions, KeepGrowingBlocksOutOfEpilogues
from .rewrites import SimplifyImportedGraph
from .row_padding import PadProductRows
from .softmax_rows import SoftmaxByRows
from .strassen import StrassenMatmuls
from .winograd import WinogradConvolutions

__all__ = ["FuseLayoutIntoConsumers", "LoweringOptions", "SimplifyImportedGraph", "lower_model"]


@dataclass(frozen=True)
class LoweringOptions:
    """How a model is lowered; stored with the tuning database, as its kernels depend on it."""

    fold_batch_norm: bool = True
    fast_math: bool = True  # float32 exp/erf/tanh/sigmoid/softmax as polynomial approximations
    fuse_layout: bool = True
    layout_free_weights: bool = True
    channels_last: bool | None = None  # convolutions in NHWC; None: on CPUs, where it is faster
    # 1-D convolutions as 2-D ones one row high, channels-last with them; None: where channels_last is on
    conv1d_as_conv2d: bool | None = None
    winograd: bool | None = None  # channels-last 3x3 convolutions by Winograd's algorithm; None: on CPUs
    # a 1x1 expanding convolution and the depthwise one after it as one kernel; None: on CPUs
    fuse_expand_depthwise: bool | None = None
    # large float32 matmuls by constant weights in 7 half-size products instead of 8; None: on CPUs
    strassen: bool | None = None
    # convolutions and matmuls by constant weights from bf16 operands into fp32 (``dtype="bfloat16"``)
    bfloat16: bool = False
    # attentions whose scores outgrow the caches computed a block of queries at a time: off, as measured
    # slower than whole scores on Whisper's encoder (experiments/README.md, long sequences)
    attention_blocks: bool = False
    # in bf16, activations rounded before the max pools and concatenations that read them (same bits)
    bf16_round_before_moves: bool = True
    # in bf16, max pools of our own: the values' bits compared as 16-bit integers (after the rounding above)
    bf16_max_pools: bool = True
    # channels-last group norms of a channel per group with their sums as products (with channels_last)
    channel_norms_as_products: bool = True
    # layout kernels pulled into attention's fp32 products of two activations too (with fuse_layout): off,
    # BERT-base's scores with the keys' transpose inside ran at 59 GFLOP/s (423 us a layer), 123 us apart
    fuse_layout_into_attention: bool = False
    # on CPUs, softmaxes a row per parallel task (tuner.softmax_rule): MetaSchedule's perfect tiles found
    # none of ViT's 197-long rows' worth vectorising (308 us where DeiT's 198 took 77)
    softmax_by_rows: bool = True
    # in bf16 on AMX, a first convolution reading its padded image in place rather than its patches
    bf16_image_windows: bool = True
    # in bf16 on vdpbf16ps (no AMX), attention's products of two activations bf16 products too (on AMX always)
    bf16_activation_products_avx512: bool = True
    # in bf16 on vdpbf16ps, a first convolution reading its padded image in place as on AMX
    bf16_image_windows_avx512: bool = True
    # float32 products by constant weights over row counts that tile badly (197 tokens) over a few zero rows more
    pad_product_rows: bool = True
    # channels-last through image resizes and sequences reshaped into images (SegFormer's head), with channels_last
    channels_last_resizes: bool = True
    # in bf16, the fused inverted residual (fuse_expand_depthwise) kept, in fp32: its products are too short for bf16's
    bf16_fuse_expand_depthwise: bool = True

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
    "bf16_fuse_expand_depthwise": False,
}


def _on_cpus_by_default(option: bool | None, target: tvm.target.Target | None) -> bool:
    """An option as set, or, left at None, on where the target is a CPU."""
    return option if option is not None else (target is not None and target.kind.name == "llvm")


def _bf16_products(options: LoweringOptions, unit: str | None) -> Bfloat16Products:
    """The bf16 lowering with the options of ``unit`` (AMX's or ``vdpbf16ps``'s)."""
    if unit == AMX:
        return Bfloat16Products(unit, options.bf16_image_windows, activation_products=True)
    return Bfloat16Products(unit, options.bf16_image_windows_avx512, options.bf16_activation_products_avx512)


def _in_fp32_only(options: LoweringOptions) -> LoweringOptions:
    """In bf16, the rewrites that turn products into other float32 kernels (Winograd's, Strassen's) are left
    out, so that those products are bf16 ones; the fused inverted residual only with its own option."""
    if not options.bfloat16:
        return options
    fused = options.fuse_expand_depthwise if options.bf16_fuse_expand_depthwise else False
    return replace(options, winograd=False, fuse_expand_depthwise=fused, strassen=False)


def inference_passes(options: LoweringOptions, target: tvm.target.Target | None = None) -> list[tvm.transform.Pass]:
    options = _in_fp32_only(options)
    passes = []
    if options.fold_batch_norm:
        passes += [relax.transform.FoldBatchnormToConv2D(), relax.transform.DecomposeOpsForInference()]
    # before constants are folded: a broadcast of a weight, once folded, is a constant of its own
    passes.append(SimplifyImportedGraph(fast_math=options.fast_math))
    passes.append(FoldPadsIntoConvolutions())
    if options.attention_blocks:
        passes.append(AttentionInQueryBlocks(fast_math=options.fast_math))
    if options.softmax_by_rows and _on_cpus_by_default(None, target):  # its rule is a CPU design space
        passes.append(SoftmaxByRows())
    if _on_cpus_by_default(options.channels_last, target):
        if _on_cpus_by_default(options.conv1d_as_conv2d, target):
            passes.append(Conv1dAsConv2d())
        # biases must be constants to move past
        passes += [relax.transform.FoldConstant(), ChannelsLastConvolutions(options.channels_last_resizes)]
        if options.channel_norms_as_products:
            passes.append(PerChannelNormsAsProducts())
        if _on_cpus_by_default(options.winograd, target):
            passes.append(WinogradConvolutions())
        if _on_cpus_by_default(options.fuse_expand_depthwise, target):
            passes += [
                relax.transform.FoldConstant(),  # the weights in HWIO
                FuseExpandDepthwise("bfloat16" if options.bfloat16 else "float32"),
                relax.transform.DeadCodeElimination(["main"]),
            ]
    # both take the weights, transposed, as constants
    strassen = _on_cpus_by_default(options.strassen, target)
    pad_rows = options.pad_product_rows and not options.bfloat16 and _on_cpus_by_default(None, target)
    if strassen or pad_rows:
        passes.append(relax.transform.FoldConstant())
    if strassen:
        passes.append(StrassenMatmuls())
    if pad_rows:  # bf16 products pad their own rows
        passes.append(PadProductRows())
    if options.bfloat16:
        passes += [
            relax.transform.FoldConstant(),
            _bf16_products(options, bf16_unit(target)),
        ]
        if options.bf16_round_before_moves:
            passes += [RoundBeforeMoves(), relax.transform.DeadCodeElimination(["main"])]
        if options.bf16_max_pools:
            passes.append(Bf16MaxPools())
    if options.fast_math:
        passes.append(relax.transform.FastMathTransform())
    return [
        *passes,
        relax.transform.RemoveRedundantReshape(),
        relax.transform.FoldConstant(),
        relax.transform.CanonicalizeBindings(),
    ]


def fusion_passes(target: tvm.target.Target, options: LoweringOptions) -> list[tvm.transform.Pass]:
    passes = [
        *relax_pipeline.library_dispatch_passes(target),
        relax.transform.LegalizeOps(),
        relax.transform.AnnotateTIROpPattern(),
        KeepGrowingBlocksOutOfEpilogues(),
        relax.transform.FoldConstant(),
        relax.transform.FuseOps(),
    ]
    if options.fuse_layout:
        passes.append(FuseLayoutIntoConsumers(into_attention=options.fuse_layout_into_attention))
    passes += [
        relax.transform.FuseTIR(),
        relax.transform.RewriteDataflowReshape(),
        relax.transform.DeadCodeElimination(["main"]),
    ]
    if options.layout_free_weights:
        passes += [relax.transform.AttachAttrLayoutFreeBuffers(), KeepLayoutFreeWeightsOfReductions()]
    return passes


def lower_model(mod: tvm.IRModule, target: tvm.target.Target, options: LoweringOptions | None = None) -> tvm.IRModule:
    """``mod`` (an imported model, weights bound as constants) as fused TIR kernels called from Relax."""
    options = options or LoweringOptions()
    with target:
        return tvm.transform.Sequential([*inference_passes(options, target), *fusion_passes(target, options)])(mod)
