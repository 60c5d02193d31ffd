"""The lowering pipeline: the passes that turn an imported Relax model into the fused kernels that are tuned
and compiled, in this order:

1. inference rewrites on the imported graph: eval-mode batch norms folded into the convolutions
   before them (and the rest decomposed into element-wise arithmetic), constants folded, the
   importers' slow forms replaced (``rewrites``), zero pads folded into the convolutions they feed
   (``pads``), and, with ``fast_math``, exp/erf/tanh/sigmoid/
   softmax computed by vectorisable approximations instead of one libm call per element; with
   ``attention_blocks``, attentions over long sequences a block of queries at a time; on a CPU,
   float32 attentions over token counts that tile badly over a few zero tokens more
   (``attention_padding``),
   convolutions computed channels-last (``channels_last``), those 3x3 convolutions of stride 1
   that reuse their weights enough by Winograd's algorithm (``winograd``), and each 1x1 expanding
   convolution with the depthwise convolution after it as one kernel (``inverted_residual``), and
   large matmuls by constant weights by one level of Strassen's algorithm
   (``strassen``); with ``bfloat16``, convolutions and matmuls by weights from bf16 operands (``bf16``; where
   the CPU's bf16 products are calibrated slower than its float32 ones, only the products bound by their
   operands' bytes, the rest lowered as in float32; on a CPU with no bf16 unit, the model lowered as in
   float32: ``bf16.precision``);
2. TVM's legalization and operator fusion (element-wise epilogues such as bias, activation and
   residual add fuse into the convolution or matmul that produces them; a pad or concatenation,
   which writes more than it reads, never does: ``pads`` says why);
3. layout-only kernels pulled into the kernels that consume them (``layout_fusion``), pure
   reshapes turned into views; values a kernel reads broadcast (a gate per channel) computed once, not inlined
   into every element that reads them (``broadcast_values``);
4. the model's weights marked layout-free, so that MetaSchedule may choose their layout: compile
   then transforms the constants once (``codegen.build``), not on every call.
"""

from __future__ import annotations

from dataclasses import replace

import tvm
from tvm import relax
from tvm.relax import pipeline as relax_pipeline

from codegen.amx_dot import STEP_VALUES
from codegen.bf16_dot import AMX
from tuner.lowering.bf16.pool import Bf16MaxPools
from tuner.lowering.bf16.precision import ProductPrecision, lacks_bf16_unit, product_precision
from tuner.lowering.bf16.products import Bfloat16Products
from tuner.lowering.bf16.rounding import RoundBeforeMoves
from tuner.targets import bf16_unit

from .attention_blocks import AttentionInQueryBlocks
from .attention_padding import PadAttentionTokens
from .broadcast_values import ComputeBroadcastValuesOnce
from .channel_norms import PerChannelNormsAsProducts
from .channels_last import ChannelsLastConvolutions
from .column_padding import PadProductColumns
from .conv1d import Conv1dAsConv2d
from .grouped_conv1d import GroupedConv1dChannelsLast
from .inverted_residual import FuseExpandDepthwise
from .layout_free import KeepLayoutFreeWeightsOfReductions
from .layout_fusion import FuseLayoutIntoConsumers
from .numpy_folding import fold_constants
from .options import LoweringOptions
from .pads import FoldPadsIntoConvolutions, KeepGrowingBlocksOutOfEpilogues
from .reshapes import LEGALIZATIONS
from .rewrites import SimplifyImportedGraph
from .row_padding import PadProductRows
from .softmax_rows import SoftmaxByRows
from .strassen import StrassenMatmuls
from .winograd import WinogradConvolutions


def _on_cpus_by_default(option: bool | None, target: tvm.target.Target | None) -> bool:
    """An option as set, or, left at None, on where the target is a CPU."""
    return option if option is not None else (target is not None and target.kind.name == "llvm")


def _bf16_products(options: LoweringOptions, unit: str | None, precision: ProductPrecision | None) -> Bfloat16Products:
    """The bf16 lowering with the options of ``unit`` (AMX's or ``vdpbf16ps``'s)."""
    if unit == AMX:
        return Bfloat16Products(unit, options.bf16_image_windows, activation_products=True, precision=precision)
    return Bfloat16Products(unit, options.bf16_image_windows_avx512, options.bf16_activation_products_avx512, precision)


def _in_fp32_only(options: LoweringOptions) -> LoweringOptions:
    """In bf16, the rewrites that turn products into other float32 kernels (Winograd's, Strassen's) are left
    out, so that those products are bf16 ones; the fused inverted residual only with its own option."""
    fused = options.fuse_expand_depthwise if options.bf16_fuse_expand_depthwise else False
    return replace(options, winograd=False, fuse_expand_depthwise=fused, strassen=False)


def inference_passes(options: LoweringOptions, target: tvm.target.Target | None = None) -> list[tvm.transform.Pass]:
    if options.bfloat16 and options.bf16_where_faster and lacks_bf16_unit(target):
        options = replace(options, bfloat16=False)
    # where bf16 products are the slower ones, products bound by their arithmetic are lowered as in float32
    precision = product_precision(target) if options.bfloat16 and options.bf16_where_faster else None
    bf16_products = options.bfloat16 and precision is None
    if bf16_products:
        options = _in_fp32_only(options)
    passes = []
    if options.fold_batch_norm:
        passes += [relax.transform.FoldBatchnormToConv2D(), relax.transform.DecomposeOpsForInference()]
    # before constants are folded: a broadcast of a weight, once folded, is a constant of its own
    passes.append(SimplifyImportedGraph(fast_math=options.fast_math))
    passes.append(FoldPadsIntoConvolutions())
    if options.pad_attention_tokens and not bf16_products and _on_cpus_by_default(None, target):
        passes.append(PadAttentionTokens(fast_math=options.fast_math))
    if options.attention_blocks:
        passes.append(AttentionInQueryBlocks(fast_math=options.fast_math))
    if options.softmax_by_rows and _on_cpus_by_default(None, target):  # its rule is a CPU design space
        passes.append(SoftmaxByRows())
    if _on_cpus_by_default(options.channels_last, target):
        if _on_cpus_by_default(options.conv1d_as_conv2d, target):
            passes.append(Conv1dAsConv2d(options.pad_conv1d_positions and not bf16_products))
        if not bf16_products and _on_cpus_by_default(options.grouped_conv1d_channels_last, target):
            passes.append(GroupedConv1dChannelsLast())
        # biases must be constants to move past
        passes += [fold_constants(), ChannelsLastConvolutions(options.channels_last_resizes)]
        if options.channel_norms_as_products:
            passes.append(PerChannelNormsAsProducts(options.group_norms_as_products))
        # its transforms' rule is a CPU design space
        if _on_cpus_by_default(options.winograd, target) and (target is None or target.kind.name == "llvm"):
            passes.append(WinogradConvolutions())
        if _on_cpus_by_default(options.fuse_expand_depthwise, target):
            passes += [
                fold_constants(),  # the weights in HWIO
                FuseExpandDepthwise(
                    "bfloat16" if bf16_products else "float32",
                    options.fuse_silu_blocks,
                    # on AMX an expansion of a whole step of channels is a bf16 product of its own
                    STEP_VALUES if bf16_products and bf16_unit(target) == AMX else None,
                ),
                relax.transform.DeadCodeElimination(["main"]),
            ]
    # both take the weights, transposed, as constants
    strassen = _on_cpus_by_default(options.strassen, target)
    pad_rows = options.pad_product_rows and not bf16_products and _on_cpus_by_default(None, target)
    pad_columns = options.pad_product_columns and not bf16_products and _on_cpus_by_default(None, target)
    if strassen or pad_rows or pad_columns:
        passes.append(fold_constants())
    if strassen:
        passes.append(StrassenMatmuls())
    if pad_rows:  # bf16 products pad their own rows
        passes.append(PadProductRows())
    if pad_columns:
        passes.append(PadProductColumns())
    if options.bfloat16:
        passes += [
            fold_constants(),
            _bf16_products(options, bf16_unit(target), precision),
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
        fold_constants(),
        relax.transform.CanonicalizeBindings(),
    ]


def fusion_passes(target: tvm.target.Target, options: LoweringOptions) -> list[tvm.transform.Pass]:
    passes = [
        *relax_pipeline.library_dispatch_passes(target),
        relax.transform.LegalizeOps(LEGALIZATIONS if options.bounded_reshapes else None),
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
    if options.broadcast_values_once:
        passes.append(ComputeBroadcastValuesOnce())
    if options.layout_free_weights:
        passes += [relax.transform.AttachAttrLayoutFreeBuffers(), KeepLayoutFreeWeightsOfReductions()]
    return passes


def lower_model(mod: tvm.IRModule, target: tvm.target.Target, options: LoweringOptions | None = None) -> tvm.IRModule:
    """``mod`` (an imported model, weights bound as constants) as fused TIR kernels called from Relax."""
    options = options or LoweringOptions()
    with target:
        return tvm.transform.Sequential([*inference_passes(options, target), *fusion_passes(target, options)])(mod)
