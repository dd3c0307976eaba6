"""What differs between the transformers releases we support (4.57 to 5.24+), in one place.

Copied flat into every saved model folder beside the modeling file, so it imports only torch and transformers.
"""

import dataclasses
import inspect

import torch
from transformers import LlamaConfig
from transformers.masking_utils import create_causal_mask
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.modeling_outputs import BaseModelOutputWithPast

# 5.24 renamed the cache argument and output field from `past_key_values` to `cache`.
CACHE_FIELD = "cache" if "cache" in {f.name for f in dataclasses.fields(BaseModelOutputWithPast)} else "past_key_values"

_MASK_PARAMETERS = set(inspect.signature(create_causal_mask).parameters)
_LLAMA_TAKES_ROPE_PARAMETERS = "rope_parameters" in inspect.signature(LlamaConfig.__init__).parameters or hasattr(
    LlamaConfig, "standardize_rope_params"
)


def pop_cache(past_key_values, kwargs):
    """The cache whichever name the caller used for it."""
    cache = kwargs.pop("cache", None)
    return cache if cache is not None else past_key_values


def past_length(cache):
    """Tokens already in `cache`: an int, or a tensor on releases whose static cache reports one (keep it a tensor
    so that compiled decoding does not break its graph)."""
    return 0 if cache is None else cache.get_seq_length()


def causal_mask(config, inputs_embeds, attention_mask, cache, cache_position, position_ids):
    """transformers' `create_causal_mask`, whose argument names changed in 4.53, 5.10 and 5.24."""
    arguments = {"config": config, "attention_mask": attention_mask, "position_ids": position_ids}
    arguments["inputs_embeds" if "inputs_embeds" in _MASK_PARAMETERS else "input_embeds"] = inputs_embeds
    arguments["cache" if "cache" in _MASK_PARAMETERS else "past_key_values"] = cache
    if "cache_position" in _MASK_PARAMETERS:
        arguments["cache_position"] = cache_position
    return create_causal_mask(**arguments)


def attention_function(implementation, eager_function):
    """The attention kernel registered for `config._attn_implementation` (eager is ours to give)."""
    if implementation in (None, "eager"):
        return eager_function
    return ALL_ATTENTION_FUNCTIONS[implementation]


def llama_rope_config(head_dim, rope_parameters, max_position_embeddings):
    """A LlamaConfig carrying only RoPE settings, so that transformers' own LlamaRotaryEmbedding computes the
    frequencies (every rope type it knows, in every release) for a head size of our choosing."""
    rope_parameters = dict(rope_parameters)
    common = {
        "hidden_size": head_dim,
        "num_attention_heads": 1,
        "head_dim": head_dim,
        "max_position_embeddings": max_position_embeddings,
    }
    if _LLAMA_TAKES_ROPE_PARAMETERS:
        return LlamaConfig(rope_parameters=rope_parameters, **common)
    rope_theta = rope_parameters.pop("rope_theta")
    scaling = rope_parameters if rope_parameters["rope_type"] != "default" else None
    return LlamaConfig(rope_theta=rope_theta, rope_scaling=scaling, **common)


def model_output(output_class, cache, **fields):
    """An output dataclass with the cache under the field name this release declares."""
    return output_class(**{CACHE_FIELD: cache}, **fields)


def model_output_cache(output):
    return getattr(output, CACHE_FIELD)


def rotary_positions(cache_position, past_seen, query_length, device):
    """`cache_position` as generate() passed it (up to 5.0), else the positions after the cached ones."""
    if cache_position is not None:
        return cache_position
    return torch.arange(query_length, device=device) + past_seen
