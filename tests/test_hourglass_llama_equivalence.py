"""HourglassLlama with K = 1 is transformers' Llama; with K > 1 it computes MODELS.md §1.1, checked against a plain
re-implementation written here from the formulas."""

import pytest
import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM

from shapeformers import HourglassLlamaConfig, HourglassLlamaForCausalLM

from .conftest import LLAMA3_SCALING, perturb_norms, tiny_hourglass_config

pytestmark = pytest.mark.matrix


def llama_twin(config):
    """A transformers Llama with the same shape as a K = 1 HourglassLlama, in this release's rope spelling."""
    fields = {
        key: getattr(config, key)
        for key in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "max_position_embeddings",
            "rms_norm_eps",
            "tie_word_embeddings",
            "bos_token_id",
            "eos_token_id",
            "pad_token_id",
        )
    }
    rope = dict(config.rope_parameters)
    if transformers.__version__.startswith("4."):
        fields["rope_theta"] = rope.pop("rope_theta")
        fields["rope_scaling"] = rope if rope["rope_type"] != "default" else None
    else:
        fields["rope_parameters"] = rope
    return LlamaForCausalLM(LlamaConfig(**fields))


def to_llama_names(state_dict):
    return {
        name.replace(".mlp.0.", ".mlp.").replace(".post_attention_layernorm.0.", ".post_attention_layernorm."): value
        for name, value in state_dict.items()
    }


@pytest.mark.parametrize("kv_heads", [4, 2], ids=["mha", "gqa"])
@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
@pytest.mark.parametrize("scaling", [None, LLAMA3_SCALING], ids=["rope", "llama3-rope"])
def test_k1_equals_transformers_llama(kv_heads, tied, scaling):
    torch.manual_seed(0)
    config = tiny_hourglass_config(
        num_mlp_layers=1,
        mlp_intermediate_sizes=72,
        qk_norm=False,
        head_dim=None,
        num_key_value_heads=kv_heads,
        tie_word_embeddings=tied,
        rope_theta=500000.0,
        rope_scaling=scaling,
    )
    ours = perturb_norms(HourglassLlamaForCausalLM(config)).eval()
    llama = llama_twin(config).eval()
    result = llama.load_state_dict(to_llama_names(ours.state_dict()), strict=False)
    assert not result.unexpected_keys and set(result.missing_keys) <= {"lm_head.weight"}
    if tied:
        assert llama.lm_head.weight.data_ptr() == llama.model.embed_tokens.weight.data_ptr()

    input_ids = torch.randint(3, config.vocab_size, (2, 40))  # longer than the llama3 original context (32)
    with torch.no_grad():
        assert torch.allclose(ours(input_ids).logits, llama(input_ids).logits, atol=1e-5, rtol=0)

    prompt = input_ids[:, :6]
    settings = dict(max_new_tokens=12, do_sample=False, attention_mask=torch.ones_like(prompt))
    assert torch.equal(ours.generate(prompt, **settings), llama.generate(prompt, **settings))


def rms_norm(x, weight, eps):
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def rotate(x, position, theta):
    """RoPE on the last dimension (size head_dim), halves layout as in Llama."""
    half = x.shape[-1] // 2
    frequencies = theta ** (-torch.arange(half, dtype=torch.float32) / half)
    angle = position[:, None] * frequencies[None, :]  # [seq, half]
    cos, sin = torch.cat([angle.cos()] * 2, -1), torch.cat([angle.sin()] * 2, -1)
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], -1) * sin


def reference_logits(weights, config, input_ids):
    """MODELS.md §1.1-1.2 from the state dict, one formula per line."""
    eps, hd, theta = config.rms_norm_eps, config.head_dim, config.rope_parameters["rope_theta"]
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    seq = input_ids.shape[1]
    x = weights["model.embed_tokens.weight"][input_ids]
    position = torch.arange(seq, dtype=torch.float32)
    causal = torch.full((seq, seq), float("-inf")).triu(1)
    for i in range(config.num_hidden_layers):
        p = f"model.layers.{i}."
        h = rms_norm(x, weights[p + "input_layernorm.weight"], eps)
        q, k, v = (h @ weights[p + f"self_attn.{n}_proj.weight"].T for n in "qkv")
        if config.qk_norm:
            q = rms_norm(q, weights[p + "self_attn.q_norm.weight"], eps)
            k = rms_norm(k, weights[p + "self_attn.k_norm.weight"], eps)
        q = rotate(q.unflatten(-1, (heads, hd)).transpose(1, 2), position, theta)
        k = rotate(k.unflatten(-1, (kv_heads, hd)).transpose(1, 2), position, theta)
        v = v.unflatten(-1, (kv_heads, hd)).transpose(1, 2)
        k = k.repeat_interleave(heads // kv_heads, dim=1)
        v = v.repeat_interleave(heads // kv_heads, dim=1)
        scores = (q @ k.transpose(-1, -2)) / hd**0.5 + causal
        attention = (scores.softmax(-1) @ v).transpose(1, 2).flatten(-2)
        x = x + attention @ weights[p + "self_attn.o_proj.weight"].T
        for j in range(config.num_mlp_layers):
            h = rms_norm(x, weights[p + f"post_attention_layernorm.{j}.weight"], eps)
            gate = h @ weights[p + f"mlp.{j}.gate_proj.weight"].T
            up = h @ weights[p + f"mlp.{j}.up_proj.weight"].T
            x = x + (torch.nn.functional.silu(gate) * up) @ weights[p + f"mlp.{j}.down_proj.weight"].T
    x = rms_norm(x, weights["model.norm.weight"], eps)
    return x @ weights["lm_head.weight"].T


@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
def test_hourglass_block_matches_the_formulas(tiny_model, attn_implementation):
    tiny_model.config._attn_implementation = attn_implementation
    input_ids = torch.randint(0, tiny_model.config.vocab_size, (2, 17))
    with torch.no_grad():
        ours = tiny_model(input_ids).logits
        expected = reference_logits(tiny_model.state_dict(), tiny_model.config, input_ids)
    assert torch.allclose(ours, expected, atol=1e-5, rtol=0)


def test_initialisation_follows_the_official_code():
    torch.manual_seed(0)
    config = HourglassLlamaConfig(
        vocab_size=512, hidden_size=256, num_hidden_layers=2, num_attention_heads=4, num_mlp_layers=2,
        mlp_intermediate_sizes=[256, 128], qk_norm=True,
    )
    model = HourglassLlamaForCausalLM(config)
    for name, parameter in model.named_parameters():
        if "norm" in name:
            assert torch.all(parameter == 1), name
        else:
            assert abs(parameter.std().item() - 0.02) < 0.003, name
