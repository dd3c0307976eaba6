import re

import pytest
import torch

from shapeformers import (
    HOURGLASS_LLAMA_PRESETS,
    HourglassLlamaConfig,
    HourglassLlamaForCausalLM,
    hourglass_llama_preset,
    match_bottleneck_width,
)

from .conftest import LLAMA3_SCALING, tiny_hourglass_config


@pytest.mark.parametrize(
    "overrides, field",
    [
        ({"hidden_size": 0}, "hidden_size"),
        ({"num_hidden_layers": 2.5}, "num_hidden_layers"),
        ({"num_attention_heads": 4, "num_key_value_heads": 3}, "num_key_value_heads"),
        ({"head_dim": None, "hidden_size": 50}, "hidden_size"),
        ({"head_dim": 9}, "head_dim"),
        ({"num_mlp_layers": 0}, "num_mlp_layers"),
        ({"mlp_intermediate_sizes": [8, 8]}, "mlp_intermediate_sizes"),
        ({"mlp_intermediate_sizes": [8, -1, 8]}, "mlp_intermediate_sizes[1]"),
        ({"hidden_act": "swish-ish"}, "hidden_act"),
        ({"rms_norm_eps": 0.0}, "rms_norm_eps"),
        ({"attention_dropout": 1.0}, "attention_dropout"),
        ({"rope_scaling": {"rope_type": "fancy"}}, "rope_parameters['rope_type']"),
        ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "rope_parameters"),
        ({"rope_theta": -1.0}, "rope_theta"),
        ({"rope_theta": "10000"}, "rope_theta"),
        ({"rope_scaling": {"rope_type": "linear", "factor": -2.0}}, "rope_parameters['factor']"),
        ({"rope_scaling": {"rope_type": "longrope", "short_factor": [1.0] * 4, "long_factor": [1.0] * 5}},
         "rope_parameters['short_factor']"),  # head_dim 10: 5 values each
        ({"qk_norm": "false"}, "qk_norm"),
        ({"mlp_bias": 1}, "mlp_bias"),
    ],
)
def test_invalid_config_fails_at_construction_naming_the_field(overrides, field):
    with pytest.raises(ValueError, match=re.escape(f"`{field}")):
        tiny_hourglass_config(**overrides)


def test_defaults_and_spellings():
    config = HourglassLlamaConfig(hidden_size=64, num_attention_heads=4, num_hidden_layers=1, intermediate_size=80)
    assert config.head_dim == 16 and config.num_key_value_heads == 4
    assert config.mlp_intermediate_sizes == [80] and config.intermediate_size == 80
    assert config.rope_parameters == {"rope_type": "default", "rope_theta": 10000.0}
    # transformers 4.x spelling (rope_theta + rope_scaling with "type") and 5.x spelling give the same config.
    old = tiny_hourglass_config(rope_theta=5e5, rope_scaling={"type": "linear", "factor": 2.0})
    new = tiny_hourglass_config(rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 5e5})
    assert old.rope_parameters == new.rope_parameters == {"rope_type": "linear", "factor": 2.0, "rope_theta": 5e5}
    assert tiny_hourglass_config(mlp_intermediate_sizes=12).mlp_intermediate_sizes == [12, 12, 12]


def test_config_round_trips_through_dict():
    config = tiny_hourglass_config(rope_scaling=LLAMA3_SCALING, tie_word_embeddings=True)
    again = HourglassLlamaConfig.from_dict(config.to_dict())
    for key in ("mlp_intermediate_sizes", "head_dim", "qk_norm", "rope_parameters", "num_key_value_heads"):
        assert getattr(again, key) == getattr(config, key)
    assert again.tie_word_embeddings


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"tie_word_embeddings": True},
        {"qk_norm": False, "attention_bias": True, "mlp_bias": True},
        {"num_mlp_layers": 1, "mlp_intermediate_sizes": 64, "head_dim": None, "num_key_value_heads": None},
    ],
)
def test_parameter_count_matches_the_model(overrides):
    config = tiny_hourglass_config(**overrides)
    model = HourglassLlamaForCausalLM(config)
    for exclude in (False, True):
        assert config.num_parameters(exclude_embeddings=exclude) == model.num_parameters(exclude_embeddings=exclude)
    embeddings = config.vocab_size * config.hidden_size * (1 if config.tie_word_embeddings else 2)
    assert config.non_embedding_parameters() == model.num_parameters() - embeddings


def test_flops_and_kv_bytes_by_hand():
    config = tiny_hourglass_config()  # d 48, 2 layers, q width 40, kv width 20, sub-MLPs 24 + 40 + 16, vocab 97
    linear_weights = 2 * (48 * (40 + 20 + 20) + 40 * 48 + 3 * 48 * 80) + 97 * 48
    assert config.flops_per_token(100) == 2 * linear_weights + 4 * 100 * 40 * 2
    assert config.kv_cache_bytes_per_token(torch.bfloat16) == 2 * 2 * 20 * 2
    assert config.kv_cache_bytes_per_token("float32") == 2 * 2 * 20 * 4
    with pytest.raises(ValueError, match="`dtype`"):
        config.kv_cache_bytes_per_token("float13")


# Non-embedding parameter counts of the revised paper's table (MODELS.md §1.4), in millions.
PAPER_COUNTS = {
    "906m-baseline": 906,
    "906m-hourglass": 909,
    "3b-baseline": 3171,
    "3b-hourglass": 3168,
    "8b-baseline": 7785,
    "8b-hourglass": 7789,
}


@pytest.mark.parametrize("name", HOURGLASS_LLAMA_PRESETS)
def test_presets_have_the_paper_parameter_counts(name):
    config = hourglass_llama_preset(name)
    assert round(config.non_embedding_parameters() / 1e6) == PAPER_COUNTS[name]
    assert config.qk_norm and config.tie_word_embeddings and config.rope_parameters["rope_type"] == "llama3"


@pytest.mark.parametrize("size", ["906m", "3b", "8b"])
def test_matching_helper_reproduces_the_paper_widths(size):
    baseline = hourglass_llama_preset(f"{size}-baseline")
    paper = hourglass_llama_preset(f"{size}-hourglass")
    shape = dict(num_mlp_layers=4, num_hidden_layers=paper.num_hidden_layers, hidden_size=paper.hidden_size)
    assert match_bottleneck_width(baseline, multiple_of=32, **shape).mlp_intermediate_sizes == paper.mlp_intermediate_sizes

    # Without a multiple, no other integer width comes closer to the baseline's count.
    matched = match_bottleneck_width(baseline, **shape)
    width = matched.mlp_intermediate_sizes[0]
    target = baseline.non_embedding_parameters()

    def gap(w):
        return abs(HourglassLlamaConfig(**{**matched.to_dict(), "mlp_intermediate_sizes": w}).non_embedding_parameters() - target)

    assert gap(width) <= min(gap(width - 1), gap(width + 1))
    assert matched.head_dim == baseline.head_dim and matched.rope_parameters == baseline.rope_parameters
