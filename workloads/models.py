"""Built-in models: PyTorch definitions (workloads.zoo) with seeded random weights, imported through
torch.export. Tuning needs shapes, not trained weights, so nothing is downloaded. Every model takes
a batch size and a dtype (float32 or float16); its PyTorch module is kept as the numerical
reference."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import WorkloadError
from .importers import from_torch, import_optional
from .precision import MODEL_DTYPES, in_precision
from .registry import register
from .workload import Workload

DTYPES = MODEL_DTYPES


@dataclass(frozen=True)
class ModelSpec:
    name: str
    source: str
    factory: str  # "module:callable" in workloads.zoo
    input_shape: Callable[[int], tuple[int, ...]]  # batch size -> shape of the one input
    token_ids: int = 0  # > 0: the input is int64 token ids below this


def _image(size: int) -> Callable[[int], tuple[int, ...]]:
    return lambda batch: (batch, 3, size, size)


MODELS = [
    ModelSpec("resnet18", "ResNet-18 (He et al. 2016), ImageNet 224x224", "convnets:resnet18", _image(224)),
    ModelSpec("resnet50", "ResNet-50 (He et al. 2016), ImageNet 224x224", "convnets:resnet50", _image(224)),
    ModelSpec(
        "mobilenetv2", "MobileNetV2 1.0 (Sandler et al. 2018), ImageNet 224x224", "convnets:MobileNetV2", _image(224)
    ),
    ModelSpec(
        "vgg16", "VGG-16 configuration D (Simonyan & Zisserman 2015), ImageNet 224x224", "convnets:VGG16", _image(224)
    ),
    ModelSpec(
        "squeezenet1.1", "SqueezeNet 1.1 (Iandola et al. 2016), ImageNet 224x224", "convnets:SqueezeNet11", _image(224)
    ),
    ModelSpec("convnext-t", "ConvNeXt-T (Liu et al. 2022), ImageNet 224x224", "convnets:ConvNeXtT", _image(224)),
    ModelSpec(
        "bert-base",
        "BERT-base uncased (Devlin et al. 2019), 128 tokens",
        "transformers:BertBase",
        lambda batch: (batch, 128),
        token_ids=30522,
    ),
    ModelSpec(
        "llama3-8b-layer",
        "one Llama-3-8B decoder layer (hidden 4096, 32/8 GQA heads, SwiGLU 14336, RoPE), 128 tokens",
        "transformers:LlamaDecoderLayer",
        lambda batch: (batch, 128, 4096),
    ),
    ModelSpec(
        "attention-block",
        "a diffusion-UNet-style attention block: group norms, 3x3 convolutions, 4-head self-attention over 16x16 = "
        "256 positions of width 64",
        "blocks:AttentionBlock",
        lambda batch: (batch, 64, 16, 16),
    ),
    ModelSpec(
        "tiny-resnet",
        "a 2-stage residual CNN on 32x32 images (CIFAR-sized), for quick end-to-end runs",
        "convnets:tiny_resnet",
        _image(32),
    ),
]


def torch_model(name: str, batch: int = 1) -> tuple[Any, Any]:
    """A built-in model's PyTorch module (eval mode, the seeded weights ``tune`` imports) and an
    example input, for running it in PyTorch itself."""
    spec = next((s for s in MODELS if s.name == name), None)
    if spec is None:
        raise WorkloadError(f"{name!r} is not a built-in model: choose one of {', '.join(s.name for s in MODELS)}")
    return _module_and_example(spec, batch)


def _module_and_example(spec: ModelSpec, batch: int) -> tuple[Any, Any]:
    torch = import_optional("torch", "torch", f"built-in model {spec.name!r} is defined in PyTorch")
    module_name, attr = spec.factory.split(":")
    factory = getattr(importlib.import_module(f"workloads.zoo.{module_name}"), attr)
    torch.manual_seed(0)
    module = factory().eval()
    shape = spec.input_shape(batch)
    generator = torch.Generator().manual_seed(1)
    if spec.token_ids:
        return module, torch.randint(0, spec.token_ids, shape, generator=generator)
    return module, torch.randn(shape, generator=generator)


def build_model(spec: ModelSpec, batch: int = 1, dtype: str = "float32") -> Workload:
    if not isinstance(batch, int) or isinstance(batch, bool) or batch <= 0:
        raise WorkloadError(f"batch size must be a positive integer, got {batch!r}")
    if dtype not in DTYPES:
        raise WorkloadError(f"model dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    torch = import_optional("torch", "torch", f"built-in model {spec.name!r} is defined in PyTorch")
    module, example = _module_and_example(spec, batch)
    with torch.no_grad():
        workload = in_precision(from_torch(module, [example], spec.name + (f"-b{batch}" if batch != 1 else "")), dtype)
    workload.source = spec.source
    workload.description = f"{spec.source}; batch {batch}, {dtype}"
    workload.reference = _torch_reference(module)
    return workload


def _torch_reference(module) -> Callable[..., np.ndarray]:
    """The float32 module's output: the reference for both precisions."""

    def reference(*inputs: np.ndarray) -> np.ndarray:
        import torch

        with torch.no_grad():
            return module(*[torch.from_numpy(np.asarray(x)) for x in inputs]).numpy()

    return reference


for _spec in MODELS:
    register(_spec.name, "model", _spec.source, family="model")(
        lambda batch=1, dtype="float32", _spec=_spec: build_model(_spec, batch, dtype)
    )
