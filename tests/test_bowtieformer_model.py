"""BowtieFormer computes MODELS.md §2.2-2.3: with equal widths it is transformers' Granite; with an X shape it
matches a plain re-implementation that keeps the list of past states, as the paper describes it."""

import pytest
import torch
import transformers
from transformers import GraniteConfig, GraniteForCausalLM

from shapeformers import BowtieFormerForCausalLM

from .conftest import perturb_norms
from .test_bowtieformer_config import tiny_bowtie_config
from .test_hourglass_llama_equivalence import rms_norm, rotate

pytestmark = pytest.mark.matrix


def granite_twin(config):
    fields = dict(
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.layer_shape(0)[4],
        num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_key_value_heads,
        max_position_embeddings=config.max_position_embeddings,
        rms_norm_eps=config.rms_norm_eps,
        tie_word_embeddings=config.tie_word_embeddings,
        embedding_multiplier=config.embedding_multiplier,
        residual_multiplier=config.residual_multiplier,
        logits_scaling=config.logits_scaling,
        attention_multiplier=config.attention_multiplier,
    )
    theta = config.rope_parameters["rope_theta"]
    if transformers.__version__.startswith("4."):
        fields["rope_theta"] = theta
    else:
        fields["rope_parameters"] = {"rope_type": "default", "rope_theta": theta}
    return GraniteForCausalLM(GraniteConfig(**fields))


@pytest.mark.parametrize("kv_heads", [4, 2], ids=["mha", "gqa"])
def test_uniform_widths_equal_transformers_granite(kv_heads):
    torch.manual_seed(0)
    config = tiny_bowtie_config(
        schedule="uniform", num_key_value_heads=kv_heads, intermediate_size=80, embedding_multiplier=6.0,
        residual_multiplier=0.3, logits_scaling=4.0, attention_multiplier=0.2, rope_theta=5000.0,
    )
    ours = perturb_norms(BowtieFormerForCausalLM(config)).eval()
    granite = granite_twin(config).eval()
    granite.load_state_dict(ours.state_dict(), strict=True)  # the same parameter names
    input_ids = torch.randint(3, config.vocab_size, (2, 19))
    with torch.no_grad():
        assert torch.allclose(ours(input_ids).logits, granite(input_ids).logits, atol=1e-5, rtol=0)
    prompt = input_ids[:, :5]
    settings = dict(max_new_tokens=10, do_sample=False, attention_mask=torch.ones_like(prompt), pad_token_id=0)
    assert torch.equal(ours.generate(prompt, **settings), granite.generate(prompt, **settings))


def resize(x, width, past_states):
    """MODELS.md §2.2: cut to `width`, or widen with each new coordinate's value in the most recent past state
    that had it (newest first), else 0."""
    if width <= x.shape[-1]:
        return x[..., :width]
    columns = [x]
    for j in range(x.shape[-1], width):
        donor = next((state for state in reversed(past_states) if state.shape[-1] > j), None)
        columns.append(donor[..., j : j + 1] if donor is not None else torch.zeros_like(x[..., :1]))
    return torch.cat(columns, dim=-1)


def reference_logits(model, input_ids):
    """The forward pass of MODELS.md §2.2 written plainly, from the model's weights, keeping every past state."""
    config, weights = model.config, model.state_dict()
    eps, seq = config.rms_norm_eps, input_ids.shape[1]
    x = weights["model.embed_tokens.weight"][input_ids] * config.embedding_multiplier
    past_states = [x]
    position = torch.arange(seq, dtype=torch.float32)
    causal = torch.full((seq, seq), float("-inf")).triu(1)
    for l in range(config.num_hidden_layers):
        width, heads, kv_heads, head_dim, _ = config.layer_shape(l)
        zero_mode = config.resize_mode == "zero"
        x = resize(x, width, [] if zero_mode else past_states)
        p = f"model.layers.{l}."
        h = rms_norm(x, weights[p + "input_layernorm.weight"], eps)
        q, k, v = (h @ weights[p + f"self_attn.{n}_proj.weight"].T for n in "qkv")
        q = rotate(q.unflatten(-1, (heads, head_dim)).transpose(1, 2), position, config.rope_parameters["rope_theta"])
        k = rotate(k.unflatten(-1, (kv_heads, head_dim)).transpose(1, 2), position, config.rope_parameters["rope_theta"])
        v = v.unflatten(-1, (kv_heads, head_dim)).transpose(1, 2)
        k, v = (t.repeat_interleave(heads // kv_heads, dim=1) for t in (k, v))
        scores = (q @ k.transpose(-1, -2)) * config.layer_attention_scale(l) + causal
        attention = (scores.softmax(-1) @ v).transpose(1, 2).flatten(-2)
        x = x + config.residual_multiplier * (attention @ weights[p + "self_attn.o_proj.weight"].T)
        suffixes = [f".{k}" for k in range(config.num_mlp_layers)] if config.ffn_type == "hourglass" else [""]
        for s in suffixes:
            h = rms_norm(x, weights[p + f"post_attention_layernorm{s}.weight"], eps)
            gate, up = h @ weights[p + f"mlp{s}.gate_proj.weight"].T, h @ weights[p + f"mlp{s}.up_proj.weight"].T
            x = x + config.residual_multiplier * ((torch.nn.functional.silu(gate) * up) @ weights[p + f"mlp{s}.down_proj.weight"].T)
        past_states.append(x)
    y = rms_norm(x, weights["model.norm.weight"], eps)
    y = resize(y, config.hidden_size, [] if config.resize_mode == "zero" else past_states[:-1])
    return (y @ weights["lm_head.weight"].T) / config.logits_scaling


# Narrow last layer (32 < h = 64): the LM head's input is the normed 32 coordinates plus 32 carried ones.
NARROW_END = [96, 64, 40, 32, 16, 32]


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"resize_mode": "zero"},
        {"layer_widths": NARROW_END},
        {"layer_widths": NARROW_END, "resize_mode": "zero"},
        {"ffn_type": "hourglass", "num_mlp_layers": 2, "mlp_ratio": 0.75, "num_key_value_heads": 2},
    ],
    ids=["carry", "zero", "carry-narrow-end", "zero-narrow-end", "hourglass-gqa"],
)
def test_x_shape_matches_the_list_of_past_states_formulation(overrides):
    torch.manual_seed(0)
    config = tiny_bowtie_config(
        embedding_multiplier=3.0, residual_multiplier=0.5, logits_scaling=2.0, **overrides
    )
    model = perturb_norms(BowtieFormerForCausalLM(config)).eval()
    input_ids = torch.randint(3, config.vocab_size, (2, 13))
    with torch.no_grad():
        ours = model(input_ids).logits
        expected = reference_logits(model, input_ids)
    assert torch.allclose(ours, expected, atol=1e-5, rtol=0)


def test_carry_forward_and_zero_modes_differ():
    torch.manual_seed(0)
    carry = perturb_norms(BowtieFormerForCausalLM(tiny_bowtie_config())).eval()
    zero = BowtieFormerForCausalLM(tiny_bowtie_config(resize_mode="zero")).eval()
    zero.load_state_dict(carry.state_dict())
    input_ids = torch.randint(3, 89, (1, 7))
    with torch.no_grad():
        assert not torch.allclose(carry(input_ids).logits, zero(input_ids).logits, atol=1e-3)


def test_training_step_gradients_match_the_reference():
    torch.manual_seed(0)
    model = perturb_norms(BowtieFormerForCausalLM(tiny_bowtie_config(layer_widths=NARROW_END))).train()
    input_ids = torch.randint(3, 89, (2, 9))
    model(input_ids, labels=input_ids).loss.backward()
    ours = {name: p.grad.clone() for name, p in model.named_parameters()}

    params = dict(model.named_parameters())
    model.zero_grad()
    logits = reference_logits_with_grad(model, input_ids)
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), input_ids[:, 1:].flatten())
    loss.backward()
    for name, grad in ours.items():
        assert torch.allclose(grad, params[name].grad, atol=1e-5), name

    model.zero_grad()
    model.gradient_checkpointing_enable()
    model(input_ids, labels=input_ids).loss.backward()
    for name, grad in ours.items():
        assert torch.allclose(grad, params[name].grad, atol=1e-6), name


def reference_logits_with_grad(model, input_ids):
    """reference_logits on the live parameters, so that gradients flow to them."""
    state_dict = model.state_dict
    model.state_dict = lambda: dict(model.named_parameters())
    try:
        return reference_logits(model, input_ids)
    finally:
        model.state_dict = state_dict
