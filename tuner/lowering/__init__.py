"""Inference-grade lowering of a Relax model into the fused kernels that are tuned and compiled.

One pipeline (``pipeline``), used by task extraction and by compile, so that the kernels tuned are the
ones compile looks up; ``LoweringOptions`` says which of its passes run.
"""

from .layout_fusion import FuseLayoutIntoConsumers
from .options import LoweringOptions
from .pipeline import fusion_passes, inference_passes, lower_model
from .rewrites import SimplifyImportedGraph

__all__ = [
    "FuseLayoutIntoConsumers",
    "LoweringOptions",
    "SimplifyImportedGraph",
    "fusion_passes",
    "inference_passes",
    "lower_model",
]
