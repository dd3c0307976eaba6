"""Validation helpers shared by the configurations; copied flat into saved model folders beside them."""

import math

import torch
from transformers.activations import ACT2FN

# RoPE types whose frequencies transformers computes from the config alone, with the keys each one requires.
ROPE_REQUIRED_KEYS = {
    "default": (),
    "linear": ("factor",),
    "dynamic": ("factor",),
    "yarn": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor"),
    "longrope": ("short_factor", "long_factor"),
}
# Pretraining-time context length that these types read; transformers 5 fills it in, 4.57 requires it.
ROPE_TYPES_WITH_ORIGINAL_LENGTH = ("llama3", "yarn", "longrope")


def check_positive_int(name, value):
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"`{name}` must be a positive int, got {value!r}")


def check_positive_number(name, value):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise ValueError(f"`{name}` must be a finite number > 0, got {value!r}")


def check_bool(name, value):
    if not isinstance(value, bool):
        raise ValueError(f"`{name}` must be True or False, got {value!r}")


def normalize_rope_parameters(rope_parameters, rope_scaling, rope_theta, max_position_embeddings):
    """Merge Llama's two spellings (4.x `rope_theta` + `rope_scaling`, 5.x `rope_parameters`) into one dict."""
    params = dict(rope_parameters or rope_scaling or {})
    if "type" in params:
        params.setdefault("rope_type", params.pop("type"))
    params.setdefault("rope_type", "default")
    params.setdefault("rope_theta", 10000.0 if rope_theta is None else rope_theta)
    rope_type = params["rope_type"]
    if rope_type not in ROPE_REQUIRED_KEYS:
        raise ValueError(f"`rope_parameters['rope_type']` must be one of {sorted(ROPE_REQUIRED_KEYS)}, got {rope_type!r}")
    missing = [key for key in ROPE_REQUIRED_KEYS[rope_type] if key not in params]
    if missing:
        raise ValueError(f"`rope_parameters` of type {rope_type!r} is missing {missing}")
    if rope_type in ROPE_TYPES_WITH_ORIGINAL_LENGTH:
        params.setdefault("original_max_position_embeddings", max_position_embeddings)
    check_positive_number("rope_theta", params["rope_theta"])
    if "factor" in params:
        check_positive_number("rope_parameters['factor']", params["factor"])
    return params


def check_rope_head_dims(rope_parameters, head_dims):
    """longrope scales each rotary frequency by its own factor: one per pair of head dimensions, in every layer."""
    if rope_parameters["rope_type"] != "longrope":
        return
    pairs = sorted({head_dim // 2 for head_dim in head_dims})
    for key in ("short_factor", "long_factor"):
        if [len(rope_parameters[key])] != pairs:
            raise ValueError(
                f"`rope_parameters['{key}']` must have head_dim / 2 values ({' or '.join(map(str, pairs))} here; "
                f"longrope needs one head_dim in all layers), got {len(rope_parameters[key])}"
            )


def dtype_bytes(dtype):
    """Bytes per element of a torch dtype given as a dtype or its name ("bfloat16", "torch.float16")."""
    if isinstance(dtype, str):
        name = dtype.removeprefix("torch.")
        if not isinstance(getattr(torch, name, None), torch.dtype):
            raise ValueError(f"`dtype` must name a torch dtype such as 'float32' or 'bfloat16', got {dtype!r}")
        dtype = getattr(torch, name)
    return torch.empty((), dtype=dtype).element_size()


def check_llama_fields(hidden_act, rms_norm_eps, initializer_range, attention_dropout):
    """The checks of the fields both configurations share with Llama."""
    if hidden_act not in ACT2FN:
        raise ValueError(f"`hidden_act` must be one of {sorted(ACT2FN)}, got {hidden_act!r}")
    if not rms_norm_eps > 0:
        raise ValueError(f"`rms_norm_eps` must be > 0, got {rms_norm_eps!r}")
    if not initializer_range >= 0:
        raise ValueError(f"`initializer_range` must be >= 0, got {initializer_range!r}")
    if not 0 <= attention_dropout < 1:
        raise ValueError(f"`attention_dropout` must be in [0, 1), got {attention_dropout!r}")
