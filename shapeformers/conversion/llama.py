"""transformers Llama folders <-> HourglassLlama with K = 1, which is the same model: only the names of the MLP
and its norm differ (`mlp.gate_proj` <-> `mlp.0.gate_proj`, `post_attention_layernorm` <-> `...layernorm.0`)."""

import re
from pathlib import Path

from ..configuration import HourglassLlamaConfig
from .io import (
    DEFAULT_MAX_SHARD_BYTES, Checkpoint, ConversionError, read_json, renamed, safetensors_loaders, write_foreign_folder,
)

# Keys of a saved config that describe the file rather than the model.
BOOKKEEPING_KEYS = ("model_type", "architectures", "auto_map", "transformers_version", "torch_dtype", "dtype", "_name_or_path")
_OURS = re.compile(r"\.(mlp|post_attention_layernorm)\.0\.")
_LLAMA = re.compile(r"\.(mlp|post_attention_layernorm)\.")


def model_fields(config_dict):
    return {key: value for key, value in config_dict.items() if key not in BOOKKEEPING_KEYS}


def with_both_rope_spellings(config):
    """Add transformers 4.x's `rope_theta` / `rope_scaling` beside 5.x's `rope_parameters`, so that the exported
    folder loads with the same RoPE on every release."""
    rope = dict(config["rope_parameters"])
    config["rope_theta"] = rope.pop("rope_theta")
    config["rope_scaling"] = rope if rope["rope_type"] != "default" else None
    return config


def tied_head_dropped(tie_word_embeddings):
    """A rename step dropping what a checkpoint may store but the model does not: a tied LM head, rotary buffers."""

    def rename(name):
        if name.endswith("rotary_emb.inv_freq") or (tie_word_embeddings and name == "lm_head.weight"):
            return None
        return name

    return rename


def read_llama(folder):
    folder = Path(folder)
    source = read_json(folder / "config.json")
    if source.get("model_type") != "llama":
        raise ConversionError(f"{folder} is not a Llama checkpoint (model_type {source.get('model_type')!r})")
    if "num_mlp_layers" in source:
        raise ConversionError(
            f"{folder} is an Hourglass_LM checkpoint saved as model_type 'llama' (it has num_mlp_layers): stock "
            "transformers would load it as a plain Llama with random sub-MLPs; convert it with --from hourglass_lm"
        )
    fields = model_fields(source)
    fields.pop("pretraining_tp", None)  # a matmul split that does not change the model
    config = HourglassLlamaConfig(**fields, num_mlp_layers=1)
    drop = tied_head_dropped(config.tie_word_embeddings)
    tensors = renamed(safetensors_loaders(folder), lambda name: drop(_LLAMA.sub(r".\1.0.", name)))
    return Checkpoint(config=config, tensors=tensors, source_dir=folder, base_model=source.get("_name_or_path") or None)


def export_llama(folder, destination, dtype=None, max_shard_bytes=DEFAULT_MAX_SHARD_BYTES):
    """Write one of our HourglassLlama folders with K = 1 and no QK-norm as a transformers Llama folder."""
    folder = Path(folder)
    ours = read_json(folder / "config.json")
    if ours.get("model_type") != "hourglass_llama" or ours.get("num_mlp_layers") != 1 or ours.get("qk_norm"):
        raise ConversionError(
            f"{folder}: only an HourglassLlama with num_mlp_layers 1 and no qk_norm is a Llama "
            f"(model_type {ours.get('model_type')!r}, num_mlp_layers {ours.get('num_mlp_layers')!r}, "
            f"qk_norm {ours.get('qk_norm')!r})"
        )
    config = model_fields(ours)
    for key in ("num_mlp_layers", "mlp_intermediate_sizes", "qk_norm"):
        config.pop(key)
    config.update(model_type="llama", architectures=["LlamaForCausalLM"])
    with_both_rope_spellings(config)
    tensors = renamed(safetensors_loaders(folder), lambda name: _OURS.sub(r".\1.", name))
    write_foreign_folder(folder, destination, config, tensors, dtype, max_shard_bytes)
