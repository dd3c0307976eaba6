"""The papers' configurations (MODELS.md §1.4 and §2.1) and the HourglassLlama parameter-matching helper."""

import math

from .configuration_bowtieformer import BowtieFormerConfig
from .configuration_hourglass_llama import HourglassLlamaConfig

# Shared by every configuration of the revised paper.
_PAPER_COMMON = {
    "vocab_size": 100352,  # 100278 tokens padded to a multiple of 128
    "qk_norm": True,
    "tie_word_embeddings": True,
    "max_position_embeddings": 131072,
    "rope_parameters": {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 32.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
}

# name: (hidden_size, layers, heads, head_dim, K, sub-MLP width)
_PAPER_SHAPES = {
    "906m-baseline": (1536, 24, 16, 96, 1, 6144),
    "906m-hourglass": (2496, 12, 16, 96, 4, 2016),
    "3b-baseline": (3072, 28, 24, 128, 1, 8192),
    "3b-hourglass": (3696, 18, 24, 128, 4, 2944),
    "8b-baseline": (4096, 32, 32, 128, 1, 14336),
    "8b-hourglass": (4992, 22, 32, 128, 4, 4544),
}

HOURGLASS_LLAMA_PRESETS = tuple(_PAPER_SHAPES)


def hourglass_llama_preset(name, **overrides):
    """The paper configuration `name` (one of HOURGLASS_LLAMA_PRESETS), with any field overridden."""
    if name not in _PAPER_SHAPES:
        raise ValueError(f"preset `name` must be one of {list(HOURGLASS_LLAMA_PRESETS)}, got {name!r}")
    hidden_size, layers, heads, head_dim, num_mlp_layers, width = _PAPER_SHAPES[name]
    fields = dict(
        _PAPER_COMMON,
        hidden_size=hidden_size,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        head_dim=head_dim,
        num_mlp_layers=num_mlp_layers,
        mlp_intermediate_sizes=width,
    )
    fields.update(overrides)
    return HourglassLlamaConfig(**fields)


def match_bottleneck_width(baseline, num_mlp_layers, num_hidden_layers, hidden_size, multiple_of=1, **overrides):
    """An hourglass version of `baseline` with K = `num_mlp_layers` sub-MLPs, the given depth and width, and the
    sub-MLP width (a multiple of `multiple_of`) whose non-embedding parameter count is closest to the baseline's.

    Everything else (attention shape, vocabulary, RoPE, ...) is the baseline's unless given in `overrides`.
    """
    fields = baseline.to_dict()
    for key in ("model_type", "transformers_version", "architectures", "auto_map", "intermediate_size"):
        fields.pop(key, None)
    fields.update(overrides, num_mlp_layers=num_mlp_layers, num_hidden_layers=num_hidden_layers, hidden_size=hidden_size)

    def with_width(width):
        return HourglassLlamaConfig(**dict(fields, mlp_intermediate_sizes=width))

    target = baseline.non_embedding_parameters()
    # The count is affine in the sub-MLP width: P(w) = P(0) + slope * w.
    at_one, at_two = with_width(1).non_embedding_parameters(), with_width(2).non_embedding_parameters()
    slope = at_two - at_one
    ideal = (target - (at_one - slope)) / slope
    candidates = {max(multiple_of, multiple_of * f(ideal / multiple_of)) for f in (math.floor, math.ceil)}
    best = min(candidates, key=lambda width: (abs(at_one + slope * (width - 1) - target), width))
    return with_width(best)


# BowtieFormer paper models (MODELS.md §2): name -> (uniform width h, layers). 16 heads, MLP ratio 4, untied
# embeddings, muP multipliers, attention scale 1 / head_dim.
_BOWTIE_SIZES = {"200m": (640, 16), "500m": (960, 24), "1b": (1280, 32), "2b": (1600, 40)}
BOWTIEFORMER_PRESETS = tuple(f"{size}{kind}" for size in _BOWTIE_SIZES for kind in ("", "-uniform"))


def bowtieformer_preset(name, **overrides):
    """The paper's X-shaped model `name` ("200m", ...) or its parameter-matched uniform baseline ("200m-uniform"),
    with any field overridden."""
    if name not in BOWTIEFORMER_PRESETS:
        raise ValueError(f"preset `name` must be one of {list(BOWTIEFORMER_PRESETS)}, got {name!r}")
    size, _, kind = name.partition("-")
    hidden_size, layers = _BOWTIE_SIZES[size]
    fields = dict(
        vocab_size=100263,
        hidden_size=hidden_size,
        num_hidden_layers=layers,
        schedule="uniform" if kind else "geometric",
        bottleneck_ratio=0.3,
        bottleneck_position=0.75,
        symmetric=True,
        quantize_to=32,
        num_attention_heads=16,
        mlp_ratio=4,
        embedding_multiplier=12.0,
        residual_multiplier=0.22,
        logits_scaling=8.0,
        rope_theta=10000.0,
        max_position_embeddings=2048,
        tie_word_embeddings=False,
    )
    fields.update(overrides)
    config = BowtieFormerConfig(**fields)
    if "attention_multiplier" in overrides:
        return config
    # muP: 1 / head_dim of each layer, known once the widths are solved.
    head_dims = [config.layer_shape(l)[3] for l in range(config.num_hidden_layers)]
    return BowtieFormerConfig(
        **dict(fields, layer_widths=config.layer_widths, attention_multiplier=[1 / d for d in head_dims])
    )
