import re

import pytest
import torch

from shapeformers import BOWTIEFORMER_PRESETS, BowtieFormerConfig, BowtieFormerForCausalLM, bowtieformer_preset

# MODELS.md §2.1: the widths of the paper's four models.
PAPER_WIDTHS = {
    "200m": "1152 960 832 704 608 512 448 352 320 256 224 192 288 480 736 1152",
    "500m": "1760 1600 1440 1280 1152 1024 928 832 768 672 608 544 480 448 384 352 320 288 384 544 704 960 1312 "
    "1760",
    "1b": "2400 2208 2048 1888 1760 1600 1504 1376 1280 1184 1088 992 928 864 800 736 672 608 576 544 480 448 416 "
    "384 480 608 768 960 1216 1504 1920 2400",
    "2b": "3040 2848 2656 2496 2336 2208 2080 1952 1824 1696 1600 1504 1408 1312 1248 1184 1088 1024 960 896 864 "
    "800 736 704 672 608 576 544 512 480 576 704 832 992 1216 1440 1728 2080 2528 3040",
}
PAPER_SHAPES = {"200m": (640, 16), "500m": (960, 24), "1b": (1280, 32), "2b": (1600, 40)}


def tiny_bowtie_config(**overrides):
    fields = dict(
        vocab_size=89,
        hidden_size=64,
        num_hidden_layers=6,
        num_attention_heads=4,
        quantize_to=8,
        max_position_embeddings=128,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    fields.update(overrides)
    return BowtieFormerConfig(**fields)


@pytest.mark.parametrize("size", PAPER_WIDTHS)
def test_solver_reproduces_the_paper_widths(size):
    hidden_size, layers = PAPER_SHAPES[size]
    config = BowtieFormerConfig(
        vocab_size=100263, hidden_size=hidden_size, num_hidden_layers=layers, num_attention_heads=16,
        schedule="geometric", bottleneck_ratio=0.3, bottleneck_position=0.75, symmetric=True, quantize_to=32,
    )
    assert config.layer_widths == [int(w) for w in PAPER_WIDTHS[size].split()]
    assert bowtieformer_preset(size).layer_widths == config.layer_widths


def test_presets_and_their_uniform_baselines():
    assert len(BOWTIEFORMER_PRESETS) == 8
    bowtie, uniform = bowtieformer_preset("200m"), bowtieformer_preset("200m-uniform")
    assert uniform.layer_widths == [640] * 16
    assert bowtie.attention_multiplier[0] == 1 / 72 and bowtie.attention_multiplier[11] == 1 / 12  # muP 1/head_dim
    assert (bowtie.embedding_multiplier, bowtie.residual_multiplier, bowtie.logits_scaling) == (12.0, 0.22, 8.0)
    # KV bytes per token are in the ratio of the average widths: 576 / 640.
    assert sum(bowtie.layer_widths) / 16 == 576
    assert bowtie.kv_cache_bytes_per_token() / uniform.kv_cache_bytes_per_token() == pytest.approx(576 / 640)
    # Parameter-matched as the paper counts; our exact count (norms included) within 2%.
    assert bowtie.num_parameters() / uniform.num_parameters() == pytest.approx(1, abs=0.02)


def test_saved_widths_are_never_re_solved():
    config = tiny_bowtie_config()
    data = config.to_dict()
    assert data["layer_widths"] == config.layer_widths == [96, 64, 40, 32, 16, 96]
    data["bottleneck_ratio"] = 0.9  # a different schedule would give other widths; the stored list wins
    assert BowtieFormerConfig.from_dict(data).layer_widths == config.layer_widths


def test_arithmetic_and_asymmetric_schedules():
    arithmetic = tiny_bowtie_config(schedule="arithmetic", bottleneck_ratio=0.25)
    widths = arithmetic.layer_widths
    # round(0.75 * 6) = 5: the fifth layer is the narrowest, 0.25 * 64 wide.
    assert widths[0] == widths[-1] and min(widths) == widths[4] == 16
    steps = [a - b for a, b in zip(widths[:4], widths[1:5])]
    assert max(steps) - min(steps) <= 8  # equal steps down, up to quantization
    asymmetric = BowtieFormerConfig(hidden_size=640, num_hidden_layers=16, symmetric=False)
    assert asymmetric.layer_widths[-1] < asymmetric.layer_widths[0]


@pytest.mark.parametrize(
    "overrides, field",
    [
        ({"schedule": "exponential"}, "schedule"),
        ({"resize_mode": "learned"}, "resize_mode"),
        ({"ffn_type": "moe"}, "ffn_type"),
        ({"num_mlp_layers": 2}, "num_mlp_layers"),
        ({"bottleneck_ratio": 1.5}, "bottleneck_ratio"),
        ({"bottleneck_position": 0.99}, "bottleneck_position"),
        ({"layer_widths": [64, 64]}, "layer_widths"),
        ({"layer_widths": [64, 64, 0, 64, 64, 64]}, "layer_widths[2]"),
        ({"layer_widths": [64, 64, 36, 64, 64, 64]}, "layer_widths[2]"),
        ({"layer_widths": [64, 64, 30, 64, 64, 64]}, "layer_widths[2]"),
        ({"num_key_value_heads": 3}, "num_key_value_heads"),
        ({"num_attention_heads": [4, 4, 4]}, "num_attention_heads"),
        ({"intermediate_size": [32] * 5}, "intermediate_size"),
        ({"attention_multiplier": -0.1}, "attention_multiplier"),
        ({"attention_multiplier": [0.1] * 5 + ["x"]}, "attention_multiplier[5]"),
        ({"embedding_multiplier": 0}, "embedding_multiplier"),
        ({"mlp_ratio": 0}, "mlp_ratio"),
        ({"mlp_ratio": float("inf")}, "mlp_ratio"),
        ({"bottleneck_position": float("nan")}, "bottleneck_position"),
        ({"embedding_multiplier": float("inf")}, "embedding_multiplier"),
        ({"symmetric": "no"}, "symmetric"),
        ({"rope_scaling": {"rope_type": "nope"}}, "rope_parameters['rope_type']"),
        # the layers' head sizes differ, so no one list of longrope factors fits them all
        ({"rope_scaling": {"rope_type": "longrope", "short_factor": [1.0] * 12, "long_factor": [1.0] * 12}},
         "rope_parameters['short_factor']"),
    ],
)
def test_invalid_config_fails_at_construction_naming_the_field(overrides, field):
    with pytest.raises(ValueError, match=re.escape(f"`{field}")):
        tiny_bowtie_config(**overrides)


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"num_key_value_heads": 2, "tie_word_embeddings": True},
        {"ffn_type": "hourglass", "num_mlp_layers": 3, "mlp_ratio": 0.5},
        {"attention_bias": True, "mlp_bias": True, "num_attention_heads": [4, 2, 4, 2, 4, 4]},
    ],
)
def test_parameter_count_matches_the_model(overrides):
    config = tiny_bowtie_config(**overrides)
    model = BowtieFormerForCausalLM(config)
    for exclude in (False, True):
        assert config.num_parameters(exclude_embeddings=exclude) == model.num_parameters(exclude_embeddings=exclude)


def test_flops_and_kv_bytes_by_hand():
    config = tiny_bowtie_config(num_key_value_heads=2)  # widths 96 64 40 32 16 96, MLP 4w, vocab 89, h 64
    expected = 2 * 89 * 64
    for w in config.layer_widths:
        kv = w // 2  # 2 of 4 heads
        expected += 2 * (w * (2 * w + 2 * kv) + 3 * w * 4 * w) + 4 * 10 * w
    assert config.flops_per_token(10) == expected
    assert config.layer_kv_cache_bytes_per_token(torch.float32) == [2 * (w // 2) * 4 for w in config.layer_widths]
    assert config.kv_cache_bytes_per_token("bfloat16") == 2 * sum(config.layer_widths)  # 2 (k, v) * w/2 * 2 bytes
