"""lm_engine "width_varying" checkpoints (MODELS.md §2.5) <-> BowtieFormer.

The test writes its own lm_engine folders, config keys and fused tensor layouts spelled out here, and checks the
converted model against a plain forward pass over the lm_engine tensors themselves, written the way lm_engine
computes it (c_attn output viewed per key/value group and split, c_fc output chunked up-first, move_up resizing
over a list of past states, MODELS.md §2.2)."""

import json
import math

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from shapeformers import BowtieFormerConfig, BowtieFormerForCausalLM
from shapeformers.conversion.io import ConversionError
from shapeformers.conversion.lm_engine import export_lm_engine, read_lm_engine
from shapeformers.conversion.writer import write_checkpoint

from .conftest import perturb_norms

# Two tiny models. "mha": wide-narrow-wide widths with a first layer wider than the embedding (zeros come in), a
# widening that takes coordinates from two earlier layers, per-layer head counts; stored in two shards.
# "gqa": grouped-query attention (one layer with a single key/value head) and a last layer narrower than the
# embedding, so the LM head reads carried coordinates. Each schedule rebuilds its widths in WidthVaryingConfig.
VARIANTS = {
    "mha": dict(
        vocab_size=61, hidden_size=32, widths=[48, 32, 16, 40, 96], heads=[4, 4, 2, 4, 4], kv_heads=[4, 4, 2, 4, 4],
        schedule=dict(base_width=48, expansion_factor=0.6, reduction_factor=2.4, max_layer=3, quantize_to=8),
        m_emb=3.0, m_residual=0.5, m_width=2.0, rope_theta=500.0, shards=2,
    ),
    "gqa": dict(
        vocab_size=61, hidden_size=48, widths=[64, 32, 16, 32], heads=[4, 4, 4, 4], kv_heads=[2, 1, 2, 2],
        schedule=dict(base_width=64, expansion_factor=0.5, reduction_factor=2.0, max_layer=3, quantize_to=8),
        m_emb=2.0, m_residual=0.7, m_width=3.0, rope_theta=10000.0, shards=1,
    ),
}
EPS = 1e-5


def official_widths(schedule, num_layers):
    """WidthVaryingConfig.__init__'s width loop (geometric, explicit factors), rounding included."""
    widths = [float(schedule["base_width"])]
    for layer in range(2, num_layers + 1):
        factor = schedule["expansion_factor"] if layer <= schedule["max_layer"] else schedule["reduction_factor"]
        widths.append(widths[-1] * factor)
    return [int(round(w / schedule["quantize_to"]) * schedule["quantize_to"]) for w in widths]


def lm_engine_config(spec, **overrides):
    widths = spec["widths"]
    config = {
        "model_type": "width_varying",
        "vocab_size": spec["vocab_size"],
        "hidden_size": spec["hidden_size"],
        "num_layers": len(widths),
        "widths": widths,
        "embedding_width": spec["hidden_size"],
        "unembedding_width": spec["hidden_size"],
        "original_input_width": True,
        "original_output_width": True,
        "expand_method": "move_up",
        "m_emb": spec["m_emb"],
        "m_residual": spec["m_residual"],
        "m_width": spec["m_width"],
        "rope_theta": spec["rope_theta"],
        "rope_scaling": None,
        "layer_norm_epsilon": EPS,
        "normalization_function": "rmsnorm",
        "position_embedding_type": "rope",
        "tie_word_embeddings": False,
        "max_position_embeddings": 64,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 0,
        **spec["schedule"],
        "symmetric_widths": False,
        "sequence_mixer_blocks": [
            {
                "sequence_mixer_type": "softmax_attention",
                "num_attention_heads": heads,
                "num_key_value_heads": kv_heads,
                "attention_multiplier": 1 / (width // heads),  # muP, as WidthVaryingConfig sets it
                "add_bias": False,
            }
            for width, heads, kv_heads in zip(widths, spec["heads"], spec["kv_heads"])
        ],
        "mlp_blocks": [
            {"mlp_type": "MLP", "activation_function": "swiglu", "intermediate_size": 4 * width, "add_bias": False}
            for width in widths
        ],
    }
    config.update(overrides)
    return config


def lm_engine_tensors(spec, seed=0):
    """Random tensors in lm_engine's names and shapes: c_attn [(heads + 2 kv_heads) head_dim, w], c_fc [8 w, w]."""
    generator = torch.Generator().manual_seed(seed)

    def randn(*shape, scale):
        return scale * torch.randn(shape, generator=generator)

    V, h, widths = spec["vocab_size"], spec["hidden_size"], spec["widths"]
    tensors = {"transformer.wte.weight": randn(V, h, scale=0.5)}
    for i, (w, heads, kv_heads) in enumerate(zip(widths, spec["heads"], spec["kv_heads"])):
        head_dim = w // heads
        prefix = f"transformer.h.{i}."
        tensors[prefix + "ln_1.weight"] = 1 + randn(w, scale=0.1)
        tensors[prefix + "sequence_mixer.c_attn.weight"] = randn((heads + 2 * kv_heads) * head_dim, w, scale=w**-0.5)
        tensors[prefix + "sequence_mixer.c_proj.weight"] = randn(w, w, scale=w**-0.5)
        tensors[prefix + "ln_2.weight"] = 1 + randn(w, scale=0.1)
        tensors[prefix + "mlp_block.c_fc.weight"] = randn(8 * w, w, scale=w**-0.5)
        tensors[prefix + "mlp_block.c_proj.weight"] = randn(w, 4 * w, scale=(4 * w) ** -0.5)
    tensors["transformer.ln_f.weight"] = 1 + randn(widths[-1], scale=0.1)
    tensors["lm_head.weight"] = randn(V, h, scale=h**-0.5)
    return tensors


def save_lm_engine(folder, config, tensors, shards=1):
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    if shards == 1:
        save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
        return folder
    names = list(tensors)
    weight_map = {}
    for shard in range(shards):
        file_name = f"model-{shard + 1:05d}-of-{shards:05d}.safetensors"
        part = names[shard::shards]
        save_file({name: tensors[name] for name in part}, folder / file_name, metadata={"format": "pt"})
        weight_map.update({name: file_name for name in part})
    index = {"metadata": {"total_size": 0}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    return folder


def write_lm_engine(folder, spec, seed=0, **config_overrides):
    config, tensors = lm_engine_config(spec, **config_overrides), lm_engine_tensors(spec, seed)
    return save_lm_engine(folder, config, tensors, spec["shards"]), tensors


# The reference: lm_engine's forward pass, written out over its own tensors.


def rms_norm(x, weight):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * weight


def rotate(x, theta):
    """lm_engine's RoPE: rotate-half over the whole head, cos/sin of cat(freqs, freqs)."""
    seq, head_dim = x.shape[-2], x.shape[-1]
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    freqs = torch.outer(torch.arange(seq, dtype=torch.float32), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    x1, x2 = x.chunk(2, dim=-1)
    return x * emb.cos() + torch.cat((-x2, x1), dim=-1) * emb.sin()


def move_up(x, width, past_states):
    """Widen `x` to `width`: each new coordinate from the newest past state that has it, else 0."""
    if x.shape[-1] >= width:
        return x[..., :width]
    parts, start = [x], x.shape[-1]
    for state in past_states:  # newest first
        if state.shape[-1] > start:
            end = min(state.shape[-1], width)
            parts.append(state[..., start:end])
            start = end
        if start == width:
            break
    if start < width:
        parts.append(x.new_zeros(*x.shape[:-1], width - start))
    return torch.cat(parts, dim=-1)


def reference_logits(tensors, config, input_ids):
    batch, seq = input_ids.shape
    x = F.embedding(input_ids, tensors["transformer.wte.weight"]) * config["m_emb"]
    states = [x]
    for i, (w, attention) in enumerate(zip(config["widths"], config["sequence_mixer_blocks"])):
        prefix = f"transformer.h.{i}."
        heads, kv_heads = attention["num_attention_heads"], attention["num_key_value_heads"]
        head_dim, n_rep = w // heads, heads // kv_heads
        x = move_up(x, w, states[::-1])

        qkv = F.linear(rms_norm(x, tensors[prefix + "ln_1.weight"]), tensors[prefix + "sequence_mixer.c_attn.weight"])
        q, k, v = qkv.view(batch, seq, kv_heads, -1).split((n_rep * head_dim, head_dim, head_dim), dim=-1)
        q = q.reshape(batch, seq, heads, head_dim).transpose(1, 2)
        k, v = k.transpose(1, 2), v.transpose(1, 2)  # [batch, kv_heads, seq, head_dim]
        q, k = rotate(q, config["rope_theta"]), rotate(k, config["rope_theta"])
        k, v = k.repeat_interleave(n_rep, dim=1), v.repeat_interleave(n_rep, dim=1)  # query head j uses kv j // n_rep
        scores = (q @ k.transpose(-1, -2)) * attention["attention_multiplier"]
        scores = scores.masked_fill(torch.ones(seq, seq, dtype=torch.bool).triu(1), float("-inf"))
        out = (scores.softmax(-1) @ v).transpose(1, 2).reshape(batch, seq, heads * head_dim)
        x = x + config["m_residual"] * F.linear(out, tensors[prefix + "sequence_mixer.c_proj.weight"])

        fc = F.linear(rms_norm(x, tensors[prefix + "ln_2.weight"]), tensors[prefix + "mlp_block.c_fc.weight"])
        up, gate = fc.chunk(2, dim=-1)  # up rows first, then gate rows
        x = x + config["m_residual"] * F.linear(up * F.silu(gate), tensors[prefix + "mlp_block.c_proj.weight"])
        states.append(x)
    y = move_up(rms_norm(x, tensors["transformer.ln_f.weight"]), config["unembedding_width"], states[::-1])
    return F.linear(y, tensors["lm_head.weight"]) / config["m_width"]


def no_folder_left(parent, name):
    return not (parent / name).exists() and not any(path.name.startswith(f".{name}.") for path in parent.iterdir())


@pytest.fixture(params=sorted(VARIANTS))
def variant(request):
    return request.param


def test_the_test_checkpoints_are_what_the_official_code_builds():
    for spec in VARIANTS.values():
        assert official_widths(spec["schedule"], len(spec["widths"])) == spec["widths"]


def test_convert_matches_lm_engine_forward_and_exports_back_bit_exact(variant, tmp_path):
    spec = VARIANTS[variant]
    source, tensors = write_lm_engine(tmp_path / "lm_engine", spec)
    config = json.loads((source / "config.json").read_text())

    checkpoint = read_lm_engine(source)
    ours = checkpoint.config
    assert ours.layer_widths == spec["widths"] and ours.hidden_size == spec["hidden_size"]
    assert ours.num_attention_heads == spec["heads"] and ours.num_key_value_heads == spec["kv_heads"]
    assert ours.resize_mode == "carry_forward"
    write_checkpoint(checkpoint, tmp_path / "ours")

    model = AutoModelForCausalLM.from_pretrained(tmp_path / "ours", trust_remote_code=True, dtype=torch.float32)
    input_ids = torch.randint(0, spec["vocab_size"], (2, 11), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = reference_logits(tensors, config, input_ids)
        actual = model.eval()(input_ids).logits
    assert expected.abs().max() > 0.1  # not vacuous
    torch.testing.assert_close(actual, expected, rtol=0, atol=1e-5)

    export_lm_engine(tmp_path / "ours", tmp_path / "back")
    exported = json.loads((tmp_path / "back" / "config.json").read_text())
    for key in ("model_type", "widths", "num_layers", "hidden_size", "embedding_width", "unembedding_width",
                "expand_method", "m_emb", "m_residual", "m_width", "rope_theta", "layer_norm_epsilon", "vocab_size",
                "tie_word_embeddings", "max_position_embeddings", "bos_token_id", "eos_token_id", "pad_token_id",
                *spec["schedule"]):
        assert exported[key] == config[key], key
    for block_key in ("sequence_mixer_blocks", "mlp_blocks"):
        for theirs, back in zip(config[block_key], exported[block_key]):
            assert {key: back[key] for key in theirs} == theirs
    back = load_file(tmp_path / "back" / "model.safetensors")
    assert set(back) == set(tensors)
    for name, tensor in tensors.items():
        assert back[name].dtype == tensor.dtype and torch.equal(back[name], tensor), name


def test_interleaved_swiglu_blocks_are_read_as_such(tmp_path):
    spec = dict(VARIANTS["gqa"], shards=1)
    plain, tensors = write_lm_engine(tmp_path / "plain", spec)
    config = lm_engine_config(spec)
    config["mlp_blocks"][1]["use_interleaved_weights"] = True
    interleaved = dict(tensors)
    name = "transformer.h.1.mlp_block.c_fc.weight"
    up, gate = tensors[name].chunk(2)
    interleaved[name] = torch.stack((gate, up), dim=1).reshape(tensors[name].shape)  # gate rows even, up rows odd
    save_lm_engine(tmp_path / "interleaved", config, interleaved)
    a, b = read_lm_engine(plain).tensors, read_lm_engine(tmp_path / "interleaved").tensors
    for key in ("model.layers.1.mlp.up_proj.weight", "model.layers.1.mlp.gate_proj.weight"):
        assert torch.equal(a[key](), b[key]())


def test_tied_embeddings_drop_a_stored_head(tmp_path):
    spec = VARIANTS["gqa"]
    source, tensors = write_lm_engine(tmp_path / "lm_engine", spec, tie_word_embeddings=True)
    checkpoint = read_lm_engine(source)
    assert checkpoint.config.tie_word_embeddings and "lm_head.weight" not in checkpoint.tensors


@pytest.mark.parametrize("schedule", ["geometric", "uniform"])
def test_our_models_export_with_a_schedule_the_official_code_rebuilds(schedule, tmp_path):
    """An exported config carries base_width / factors / max_layer / quantize_to from which WidthVaryingConfig
    rebuilds our widths (it ignores a stored `widths`), and reads back as the same model."""
    config = BowtieFormerConfig(
        vocab_size=53, hidden_size=64, num_hidden_layers=6, num_attention_heads=4, quantize_to=8, schedule=schedule,
        max_position_embeddings=64, embedding_multiplier=4.0, residual_multiplier=0.3, logits_scaling=2.5,
    )
    config.attention_multiplier = [1 / (width // 4) for width in config.layer_widths]
    torch.manual_seed(0)
    model = perturb_norms(BowtieFormerForCausalLM(config)).eval()
    model.save_pretrained(tmp_path / "ours")

    export_lm_engine(tmp_path / "ours", tmp_path / "lm_engine")
    exported = json.loads((tmp_path / "lm_engine" / "config.json").read_text())
    assert exported["widths"] == config.layer_widths
    if schedule == "geometric":
        assert len(set(config.layer_widths)) > 1
        assert official_widths(exported, exported["num_layers"]) == config.layer_widths
        assert exported["max_layer"] == math.floor(config.bottleneck_position * 6 + 0.5)
    else:
        assert (exported["base_width"], exported["expansion_factor"], exported["reduction_factor"]) == (64, 1.0, 1.0)
        assert official_widths(exported, exported["num_layers"]) == [64] * 6

    write_checkpoint(read_lm_engine(tmp_path / "lm_engine"), tmp_path / "again")
    again = AutoModelForCausalLM.from_pretrained(tmp_path / "again", trust_remote_code=True, dtype=torch.float32)
    input_ids = torch.randint(0, 53, (1, 9), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(again.eval()(input_ids).logits, model(input_ids).logits, rtol=0, atol=0)


# Refusals: each names what is wrong and leaves no output folder.


def convert_and_fail(source, tmp_path, match):
    with pytest.raises(ConversionError, match=match) as error:
        write_checkpoint(read_lm_engine(source), tmp_path / "out")
    assert no_folder_left(tmp_path, "out")
    return str(error.value)


def test_missing_tensor(tmp_path):
    spec = dict(VARIANTS["mha"], shards=1)
    config, tensors = lm_engine_config(spec), lm_engine_tensors(spec)
    del tensors["transformer.h.2.ln_2.weight"]
    source = save_lm_engine(tmp_path / "lm_engine", config, tensors)
    convert_and_fail(source, tmp_path, r"missing: transformer\.h\.2\.ln_2\.weight")


def test_misshaped_tensors_are_all_listed(tmp_path):
    spec = dict(VARIANTS["gqa"], shards=1)
    config, tensors = lm_engine_config(spec), lm_engine_tensors(spec)
    tensors["transformer.h.1.sequence_mixer.c_attn.weight"] = torch.zeros(96, 32)  # MHA-sized; layer 1 has 1 kv head
    tensors["transformer.h.3.mlp_block.c_proj.weight"] = torch.zeros(32, 64)
    source = save_lm_engine(tmp_path / "lm_engine", config, tensors)
    message = convert_and_fail(source, tmp_path, "misshaped")
    assert "transformer.h.1.sequence_mixer.c_attn.weight (96, 32) (expected (48, 32))" in message
    assert "transformer.h.3.mlp_block.c_proj.weight (32, 64) (expected (32, 128))" in message


def test_unknown_expand_method(tmp_path):
    source, _ = write_lm_engine(tmp_path / "lm_engine", VARIANTS["gqa"], expand_method="linear_diff")
    message = convert_and_fail(source, tmp_path, "'linear_diff'")
    assert "move_up" in message and "zero" in message


def test_zero_padding_maps_to_zero_mode_and_is_refused_where_lm_engine_differs(tmp_path):
    source, _ = write_lm_engine(tmp_path / "mha", dict(VARIANTS["mha"], shards=1), expand_method="zero")
    assert read_lm_engine(source).config.resize_mode == "zero"  # last layer 96 >= 32: same model
    source, _ = write_lm_engine(tmp_path / "gqa", VARIANTS["gqa"], expand_method="zero")
    convert_and_fail(source, tmp_path, "move_up")  # last layer 32 < 48: lm_engine carries, we would zero


def test_mismatched_embedding_widths(tmp_path):
    source, _ = write_lm_engine(tmp_path / "lm_engine", VARIANTS["gqa"], unembedding_width=32)
    convert_and_fail(source, tmp_path, "unembedding_width")


def test_non_swiglu_activation(tmp_path):
    spec = VARIANTS["gqa"]
    config, tensors = lm_engine_config(spec), lm_engine_tensors(spec)
    config["mlp_blocks"][2]["activation_function"] = "gelu"
    source = save_lm_engine(tmp_path / "lm_engine", config, tensors)
    convert_and_fail(source, tmp_path, "layer 2: activation_function 'gelu'")


def test_truncated_safetensors(tmp_path):
    source, _ = write_lm_engine(tmp_path / "lm_engine", dict(VARIANTS["gqa"], shards=1))
    path = source / "model.safetensors"
    size = path.stat().st_size
    with open(path, "r+b") as handle:
        handle.truncate(size - 100)
    convert_and_fail(source, tmp_path, "model.safetensors")


@pytest.mark.parametrize(
    "overrides, match",
    [
        (dict(ffn_type="hourglass", num_mlp_layers=2), "hourglass"),
        (dict(tie_word_embeddings=True), "tied"),
        (dict(attention_multiplier=None), "1 / head_dim"),
        (dict(mlp_ratio=3), "4 \\* width"),
    ],
)
def test_export_refuses_what_lm_engine_cannot_express(overrides, match, tmp_path):
    fields = dict(vocab_size=53, hidden_size=64, num_hidden_layers=3, layer_widths=[96, 48, 64], num_attention_heads=4)
    fields.update(overrides)
    if "attention_multiplier" not in overrides:
        fields["attention_multiplier"] = [1 / (width // 4) for width in fields["layer_widths"]]
    BowtieFormerForCausalLM(BowtieFormerConfig(**fields)).save_pretrained(tmp_path / "ours")
    with pytest.raises(ConversionError, match=match):
        export_lm_engine(tmp_path / "ours", tmp_path / "out")
    assert no_folder_left(tmp_path, "out")


def test_export_refuses_widths_no_official_schedule_rebuilds(tmp_path):
    widths = [96, 48, 64]
    config = BowtieFormerConfig(
        vocab_size=53, hidden_size=64, num_hidden_layers=3, layer_widths=widths, num_attention_heads=4,
        attention_multiplier=[1 / (width // 4) for width in widths],
    )
    BowtieFormerForCausalLM(config).save_pretrained(tmp_path / "ours")
    with pytest.raises(ConversionError, match="rebuilds `widths`"):
        export_lm_engine(tmp_path / "ours", tmp_path / "out")
    assert no_folder_left(tmp_path, "out")
