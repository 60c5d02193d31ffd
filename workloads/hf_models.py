"""Hugging Face transformers models built from their own definitions, for the correctness suite
(experiments/correctness.py) and the comparison with other runtimes (experiments/vs_frameworks.py:
the full-size ResNet-50, DeiT-S, DistilBERT and MobileNetV2): default or slightly reduced configs
(fewer layers where the default is deep), random weights fixed by a seed, nothing downloaded.
Each builder returns an eval-mode module whose forward returns a plain tensor or a tuple of
tensors, and its example inputs (batch 1). Vision models take images; text models token ids (and
an all-ones attention mask; encoder-decoders also decoder token ids); speech models a waveform or
log-mel features. Decoder language models keep their key/value cache on, as users build them.

Convnets' batch norms are calibrated on random images so that outputs are of order 1: running
statistics reset and averaged (``momentum=None``) over three forward passes of ``randn(2, 3, H, W)``
with the batch norms in train mode (the rest of the model stays in eval mode: no dropout, no
stochastic depth), then frozen.

``transformers`` takes seconds to import, so it is imported inside the builders.

    .venv/bin/python workloads/hf_models.py [NAME ...]   # each builder in PyTorch and torch.export
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

SEQUENCE = 128  # tokens of the text models
WEIGHT_SEED = 0
INPUT_SEED = 1


class HFOutput(nn.Module):
    """A transformers model called with its inputs by keyword, returning the named output fields:
    one tensor for one field, else a tuple."""

    def __init__(self, model: nn.Module, keys: Sequence[str], fields: Sequence[str]):
        super().__init__()
        self.model, self.keys, self.fields = model, tuple(keys), tuple(fields)

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        out = self.model(**dict(zip(self.keys, inputs, strict=True)))
        values = tuple(out[field] for field in self.fields)
        return values[0] if len(values) == 1 else values


def calibrate_batch_norms(model: nn.Module, height: int, width: int, passes: int = 3) -> nn.Module:
    """Set every batch norm's running statistics to those of the activations of random images."""
    norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    model.eval()
    for norm in norms:
        if norm.affine and float(norm.weight.detach().abs().mean()) < 0.1:
            # some models initialise a batch norm's scale like a conv's weights (MobileViT: normal, std 0.02), or
            # at zero (a residual branch's last norm): that scales the activations down by 50x per norm
            norm.reset_parameters()
        norm.reset_running_stats()
        norm.momentum = None  # a cumulative average over the passes
        norm.train()
    generator = torch.Generator().manual_seed(WEIGHT_SEED + 100)
    with torch.no_grad():
        for _ in range(passes if norms else 0):
            model(torch.randn(2, 3, height, width, generator=generator))
    return model.eval()


def _seeded(build: Callable[[], nn.Module]) -> nn.Module:
    """``build()`` under a fixed global seed (transformers initialises weights with the global RNG),
    leaving the caller's RNG state as it was."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(WEIGHT_SEED)
        return build().eval()


def vision(
    model_class: str,
    config_class: str,
    size: int | tuple[int, int] = 224,
    fields: Sequence[str] = ("last_hidden_state",),
    **config: Any,
) -> Callable[[], tuple[nn.Module, list[torch.Tensor]]]:
    """A builder of an image model taking ``pixel_values`` of ``size``."""
    height, width = (size, size) if isinstance(size, int) else size

    def build() -> tuple[nn.Module, list[torch.Tensor]]:
        import transformers

        def make() -> nn.Module:
            cfg = getattr(transformers, config_class)(**config)
            model = getattr(transformers, model_class)(cfg)
            return calibrate_batch_norms(model, height, width)

        module = HFOutput(_seeded(make), ["pixel_values"], fields).eval()
        example = torch.randn(1, 3, height, width, generator=torch.Generator().manual_seed(INPUT_SEED))
        return module, [example]

    return build


def text(
    model_class: str,
    config_class: str,
    fields: Sequence[str] = ("last_hidden_state",),
    mask: bool = True,
    decoder_tokens: int = 0,
    **config: Any,
) -> Callable[[], tuple[nn.Module, list[torch.Tensor]]]:
    """A builder of a text model taking ``input_ids`` (``SEQUENCE`` tokens) and an all-ones
    ``attention_mask``; an encoder-decoder also ``decoder_input_ids`` (``decoder_tokens`` of them)."""

    def build() -> tuple[nn.Module, list[torch.Tensor]]:
        import transformers

        def make() -> nn.Module:
            cfg = getattr(transformers, config_class)(**config)
            return getattr(transformers, model_class)(cfg)

        model = _seeded(make)
        vocab = model.config.vocab_size
        generator = torch.Generator().manual_seed(INPUT_SEED)
        ids = torch.randint(0, vocab, (1, SEQUENCE), generator=generator)
        keys, inputs = ["input_ids"], [ids]
        if mask:
            keys.append("attention_mask")
            inputs.append(torch.ones(1, SEQUENCE, dtype=torch.int64))
        if decoder_tokens:
            keys.append("decoder_input_ids")
            inputs.append(torch.randint(0, vocab, (1, decoder_tokens), generator=generator))
        return HFOutput(model, keys, fields).eval(), inputs

    return build


def speech(
    model_class: str,
    config_class: str,
    key: str,
    shape: tuple[int, ...],
    fields: Sequence[str] = ("last_hidden_state",),
    decoder_tokens: int = 0,
    part: str = "",
    **config: Any,
) -> Callable[[], tuple[nn.Module, list[torch.Tensor]]]:
    """A builder of a speech model taking one float input ``key`` of ``shape`` (a waveform, or log-mel
    features) of order 1; an encoder-decoder also ``decoder_input_ids`` (``decoder_tokens`` of them);
    ``part`` names a submodule to take alone (``"encoder"``)."""

    def build() -> tuple[nn.Module, list[torch.Tensor]]:
        import transformers

        def make() -> nn.Module:
            cfg = getattr(transformers, config_class)(**config)
            model = getattr(transformers, model_class)(cfg)
            return getattr(model, part) if part else model

        model = _seeded(make)
        generator = torch.Generator().manual_seed(INPUT_SEED)
        keys, inputs = [key], [torch.randn(*shape, generator=generator)]
        if decoder_tokens:
            keys.append("decoder_input_ids")
            inputs.append(torch.randint(0, model.config.vocab_size, (1, decoder_tokens), generator=generator))
        return HFOutput(model, keys, fields).eval(), inputs

    return build


_SMALL_VIT = {"hidden_size": 192, "num_hidden_layers": 4, "num_attention_heads": 3, "intermediate_size": 768}
# the decoders' defaults are 7B-parameter models: two layers, hidden 512, grouped-query attention (8 heads, 4 for
# keys and values)
_SMALL_DECODER = {
    "num_hidden_layers": 2,
    "hidden_size": 512,
    "intermediate_size": 1376,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
}
# mixture-of-experts decoders: four experts, two per token; transformers' default experts (a grouped matrix
# product over the rows sorted by expert) are rewritten for the importer by workloads/moe_prepass.py
_SMALL_MOE = {**_SMALL_DECODER, "intermediate_size": 1024, "num_experts_per_tok": 2}
_SMALL_SEQ2SEQ = {
    "d_model": 256,
    "encoder_layers": 2,
    "decoder_layers": 2,
    "encoder_attention_heads": 4,
    "decoder_attention_heads": 4,
    "encoder_ffn_dim": 1024,
    "decoder_ffn_dim": 1024,
}

HF_MODELS: dict[str, Callable[[], tuple[nn.Module, list[torch.Tensor]]]] = {
    # convnets
    "hf-mobilenetv2": vision("MobileNetV2Model", "MobileNetV2Config", 224, ("last_hidden_state", "pooler_output")),
    "hf-mobilenetv1": vision("MobileNetV1Model", "MobileNetV1Config", 224),
    "hf-resnet": vision("ResNetModel", "ResNetConfig", 224, ("pooler_output",), depths=[1, 1, 2, 1]),
    # the full-size models experiments/vs_frameworks.py times against other runtimes (the configs' defaults
    # are ResNet-50's and DistilBERT's; DeiT-S is set)
    "hf-resnet50": vision("ResNetModel", "ResNetConfig", 224, ("pooler_output",)),
    "hf-convnext": vision("ConvNextModel", "ConvNextConfig", 224, depths=[1, 1, 2, 1]),
    "hf-convnextv2": vision("ConvNextV2Model", "ConvNextV2Config", 224, depths=[1, 1, 2, 1]),
    "hf-efficientnet": vision(
        "EfficientNetModel",
        "EfficientNetConfig",
        224,
        ("pooler_output",),
        image_size=224,
        hidden_dim=1280,
        width_coefficient=1.0,
        depth_coefficient=1.0,
    ),
    "hf-regnet": vision("RegNetModel", "RegNetConfig", 224, depths=[1, 1, 2, 1]),
    "hf-bit": vision("BitModel", "BitConfig", 224, depths=[1, 1, 1, 1]),
    "hf-poolformer": vision("PoolFormerModel", "PoolFormerConfig", 224, depths=[1, 1, 2, 1]),
    # hybrids and vision transformers
    "hf-mobilevit-s": vision("MobileViTModel", "MobileViTConfig", 256, ("last_hidden_state", "pooler_output")),
    "hf-mobilevitv2": vision("MobileViTV2Model", "MobileViTV2Config", 256),
    "hf-levit": vision("LevitModel", "LevitConfig", 224),
    "hf-vit": vision("ViTModel", "ViTConfig", 224, ("last_hidden_state", "pooler_output"), **_SMALL_VIT),
    "hf-deit": vision("DeiTModel", "DeiTConfig", 224, **_SMALL_VIT),
    "hf-deit-s": vision(
        "DeiTModel",
        "DeiTConfig",
        224,
        hidden_size=384,
        num_hidden_layers=12,
        num_attention_heads=6,
        intermediate_size=1536,
    ),
    "hf-beit": vision("BeitModel", "BeitConfig", 224, use_relative_position_bias=True, **_SMALL_VIT),
    "hf-dinov2-s": vision(
        "Dinov2Model",
        "Dinov2Config",
        224,
        image_size=224,
        hidden_size=384,
        num_hidden_layers=4,
        num_attention_heads=6,
    ),
    "hf-swin-t": vision("SwinModel", "SwinConfig", 224, depths=[1, 1, 2, 1]),
    "hf-hiera": vision("HieraModel", "HieraConfig", 224),
    "hf-segformer-b0": vision(
        "SegformerForSemanticSegmentation",
        "SegformerConfig",
        224,
        ("logits",),
        hidden_sizes=[32, 64, 160, 256],
        depths=[2, 2, 2, 2],
        num_attention_heads=[1, 2, 5, 8],
        decoder_hidden_size=256,
    ),
    "hf-clip-vision": vision(
        "CLIPVisionModel", "CLIPVisionConfig", 224, ("last_hidden_state", "pooler_output"), num_hidden_layers=4
    ),
    "hf-swinv2": vision("Swinv2Model", "Swinv2Config", 224, depths=[1, 1, 2, 1]),
    "hf-pvt-v2": vision("PvtV2Model", "PvtV2Config", 224),  # the config's default is PVTv2-b0
    "hf-focalnet": vision("FocalNetModel", "FocalNetConfig", 224, depths=[1, 1, 2, 1]),
    "hf-dinov2-registers": vision(
        "Dinov2WithRegistersModel", "Dinov2WithRegistersConfig", 224, image_size=224, **_SMALL_VIT
    ),
    # text
    "hf-bert": text("BertModel", "BertConfig", ("last_hidden_state", "pooler_output"), num_hidden_layers=2),
    "hf-roberta": text("RobertaModel", "RobertaConfig", num_hidden_layers=2),
    "hf-distilbert": text("DistilBertModel", "DistilBertConfig", n_layers=2),
    "hf-distilbert-base": text("DistilBertModel", "DistilBertConfig"),
    # AlbertConfig() is ALBERT-xxlarge (hidden 4096, feed-forward 16384): its lowering alone took 8.3 GB here
    "hf-albert": text(
        "AlbertModel",
        "AlbertConfig",
        num_hidden_layers=2,
        hidden_size=768,
        intermediate_size=3072,
        num_attention_heads=12,
    ),
    "hf-electra": text("ElectraModel", "ElectraConfig", num_hidden_layers=2),
    "hf-deberta-v2": text("DebertaV2Model", "DebertaV2Config", num_hidden_layers=2),
    "hf-mpnet": text("MPNetModel", "MPNetConfig", num_hidden_layers=2),
    "hf-t5-encoder": text("T5EncoderModel", "T5Config", num_layers=2),
    "hf-xlm-roberta": text("XLMRobertaModel", "XLMRobertaConfig", num_hidden_layers=2),
    "hf-ernie": text("ErnieModel", "ErnieConfig", num_hidden_layers=2),
    "hf-nystromformer": text("NystromformerModel", "NystromformerConfig", num_hidden_layers=2),
    # Canine reads Unicode code points (hashed into buckets), not a vocabulary: ids below 1000
    "hf-canine": text("CanineModel", "CanineConfig", num_hidden_layers=2, vocab_size=1000),
    "hf-funnel": text("FunnelBaseModel", "FunnelConfig", block_sizes=[1, 1, 1]),
    # decoder language models, causal masks built by transformers' masking utilities; their caches are on
    # (use_cache's default) as users build them: each layer's keys and values are concatenated to an empty
    # (0,) cache, which workloads/torch_prepass.py takes out of the exported graph. Mistral's and Gemma 2's sliding
    # windows (64 of the 128 tokens) make their masks band matrices
    "hf-gpt2": text("GPT2Model", "GPT2Config", n_layer=2),
    "hf-llama": text("LlamaModel", "LlamaConfig", **_SMALL_DECODER),
    "hf-qwen2": text("Qwen2Model", "Qwen2Config", **_SMALL_DECODER, vocab_size=32000),
    "hf-mistral": text("MistralModel", "MistralConfig", **_SMALL_DECODER, sliding_window=64),
    "hf-phi3": text("Phi3Model", "Phi3Config", **_SMALL_DECODER),
    "hf-gemma": text("GemmaModel", "GemmaConfig", **_SMALL_DECODER, head_dim=64, vocab_size=32000),
    "hf-gemma2": text(
        "Gemma2Model", "Gemma2Config", **_SMALL_DECODER, head_dim=64, vocab_size=32000, sliding_window=64
    ),
    "hf-mixtral": text("MixtralModel", "MixtralConfig", **_SMALL_MOE, num_local_experts=4),
    # Qwen2-MoE: a shared expert beside the routed ones, every layer sparse
    "hf-qwen2-moe": text(
        "Qwen2MoeModel",
        "Qwen2MoeConfig",
        **_SMALL_MOE,
        num_experts=4,
        moe_intermediate_size=512,
        shared_expert_intermediate_size=1024,
        vocab_size=32000,
    ),
    "hf-olmoe": text("OlmoeModel", "OlmoeConfig", **_SMALL_MOE, num_experts=4),
    "hf-qwen3": text("Qwen3Model", "Qwen3Config", **_SMALL_DECODER, head_dim=64, vocab_size=32000),
    "hf-olmo2": text("Olmo2Model", "Olmo2Config", **_SMALL_DECODER),
    "hf-gpt-neox": text(
        "GPTNeoXModel",
        "GPTNeoXConfig",
        num_hidden_layers=2,
        hidden_size=512,
        num_attention_heads=8,
        intermediate_size=2048,
    ),
    "hf-falcon": text("FalconModel", "FalconConfig", num_hidden_layers=2, hidden_size=512, num_attention_heads=8),
    "hf-cohere": text("CohereModel", "CohereConfig", **_SMALL_DECODER, vocab_size=32000),
    "hf-qwen3-moe": text(
        "Qwen3MoeModel",
        "Qwen3MoeConfig",
        **_SMALL_MOE,
        num_experts=4,
        moe_intermediate_size=512,
        head_dim=64,
        vocab_size=32000,
    ),
    "hf-granitemoe": text("GraniteMoeModel", "GraniteMoeConfig", **_SMALL_MOE, num_local_experts=4),
    # gpt-oss: attention sinks, every other layer a 64-token sliding window, clamped SwiGLU experts with biases
    "hf-gpt-oss": text(
        "GptOssModel",
        "GptOssConfig",
        **_SMALL_MOE,
        num_local_experts=4,
        head_dim=64,
        vocab_size=32000,
        sliding_window=64,
        layer_types=["sliding_attention", "full_attention"],
    ),
    # DeepSeek-V3: multi-head latent attention (low-rank queries, keys and values, a rotary part apart), the first
    # layer dense, then routed experts chosen within the best groups, beside a shared one
    "hf-deepseek-v3": text(
        "DeepseekV3Model",
        "DeepseekV3Config",
        **{**_SMALL_MOE, "num_key_value_heads": 8},  # latent attention: as many key/value heads as query heads
        moe_intermediate_size=256,
        first_k_dense_replace=1,
        n_routed_experts=4,
        n_group=2,
        topk_group=1,
        q_lora_rank=128,
        kv_lora_rank=64,
        qk_rope_head_dim=16,
        qk_nope_head_dim=32,
        v_head_dim=32,
        vocab_size=32000,
    ),
    # encoder-decoders: the decoder's last hidden state, from 32 decoder tokens
    "hf-t5": text("T5Model", "T5Config", num_layers=2, num_decoder_layers=2, decoder_tokens=32),
    "hf-bart": text("BartModel", "BartConfig", **_SMALL_SEQ2SEQ, decoder_tokens=32),
    "hf-marian": text("MarianModel", "MarianConfig", **_SMALL_SEQ2SEQ, decoder_tokens=32),
    # speech: one second of 16 kHz audio; Whisper's log-mel features cut to 200 frames (the encoder's positions
    # set to match), and its decoder from 16 tokens
    "hf-wav2vec2": speech("Wav2Vec2Model", "Wav2Vec2Config", "input_values", (1, 16000), num_hidden_layers=2),
    "hf-hubert": speech("HubertModel", "HubertConfig", "input_values", (1, 16000), num_hidden_layers=2),
    "hf-wavlm": speech("WavLMModel", "WavLMConfig", "input_values", (1, 16000), num_hidden_layers=2),
    "hf-data2vec-audio": speech(
        "Data2VecAudioModel", "Data2VecAudioConfig", "input_values", (1, 16000), num_hidden_layers=2
    ),
    "hf-sew": speech("SEWModel", "SEWConfig", "input_values", (1, 16000), num_hidden_layers=2),
    "hf-whisper": speech(
        "WhisperModel",
        "WhisperConfig",
        "input_features",
        (1, 80, 200),
        decoder_tokens=16,
        max_source_positions=100,
        encoder_layers=2,
        decoder_layers=2,
    ),
    # long sequences: Whisper-tiny's encoder on 30 s of audio, 1,500 positions (attention scores of 1500x1500
    # per head)
    "hf-whisper-encoder-long": speech(
        "WhisperModel",
        "WhisperConfig",
        "input_features",
        (1, 80, 3000),
        part="encoder",
        encoder_layers=4,
        d_model=384,
        encoder_attention_heads=6,
        encoder_ffn_dim=1536,
    ),
}


def _check(names: Sequence[str]) -> None:
    """Run each builder in PyTorch: max |output|, whether the output follows the input, and whether
    torch.export takes the module."""
    import time

    for name in names:
        started = time.monotonic()
        try:
            module, inputs = HF_MODELS[name]()
            with torch.no_grad():
                outs = module(*inputs)
                other = [
                    torch.randn_like(x)
                    if x.is_floating_point()
                    else (x if x.min() == x.max() else torch.randint_like(x, 0, int(x.max()) + 1))
                    for x in inputs
                ]
                outs2 = module(*other)
            outs, outs2 = (outs, outs2) if isinstance(outs, tuple) else ((outs,), (outs2,))
            scale = [float(o.abs().max()) for o in outs]
            moved = [float((a - b).abs().max()) for a, b in zip(outs, outs2, strict=True)]
            torch.export.export(module, tuple(inputs))
            exported = "ok"
        except Exception as err:  # noqa: BLE001 - a report of every builder
            print(f"{name}: FAILED {type(err).__name__}: {str(err).splitlines()[0][:200]}", flush=True)
            continue
        shapes = [tuple(o.shape) for o in outs]
        degenerate = any(s < 1e-3 or m <= 1e-6 * s for s, m in zip(scale, moved, strict=True))
        print(
            f"{name}: outputs {shapes} max|out| {[f'{s:.3g}' for s in scale]}"
            f" changed by input {[f'{m:.3g}' for m in moved]}"
            f" export {exported}{' DEGENERATE' if degenerate else ''} ({time.monotonic() - started:.0f} s)",
            flush=True,
        )


if __name__ == "__main__":
    import sys

    _check(sys.argv[1:] or list(HF_MODELS))
