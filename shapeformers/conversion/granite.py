"""transformers Granite folders <-> BowtieFormer with uniform widths, which is the same model with the same tensor
names."""

from pathlib import Path

from ..configuration import BowtieFormerConfig
from .io import (
    DEFAULT_MAX_SHARD_BYTES, Checkpoint, ConversionError, read_json, renamed, safetensors_loaders, write_foreign_folder,
)
from .llama import model_fields, tied_head_dropped, with_both_rope_spellings

# BowtieFormer fields that a Granite cannot vary, with the value a Granite has.
_BOWTIE_ONLY = ("layer_widths", "schedule", "bottleneck_ratio", "bottleneck_position", "symmetric", "quantize_to",
                "mlp_ratio", "ffn_type", "num_mlp_layers", "resize_mode")


def read_granite(folder):
    folder = Path(folder)
    source = read_json(folder / "config.json")
    if source.get("model_type") != "granite":
        raise ConversionError(f"{folder} is not a Granite checkpoint (model_type {source.get('model_type')!r})")
    config = BowtieFormerConfig(**model_fields(source), schedule="uniform")
    tensors = renamed(safetensors_loaders(folder), tied_head_dropped(config.tie_word_embeddings))
    return Checkpoint(config=config, tensors=tensors, source_dir=folder, base_model=source.get("_name_or_path") or None)


def _uniform(value, name, folder):
    if isinstance(value, list):
        if len(set(value)) != 1:
            raise ConversionError(f"{folder}: a Granite has one `{name}` for all layers, got {value}")
        return value[0]
    return value


def export_granite(folder, destination, dtype=None, max_shard_bytes=DEFAULT_MAX_SHARD_BYTES):
    """Write one of our BowtieFormer folders with equal widths (all equal to hidden_size) as a Granite folder."""
    folder = Path(folder)
    ours = read_json(folder / "config.json")
    if ours.get("model_type") != "bowtieformer" or ours.get("ffn_type") != "swiglu":
        raise ConversionError(f"{folder}: only a BowtieFormer with ffn_type 'swiglu' is a Granite")
    if set(ours["layer_widths"]) != {ours["hidden_size"]}:
        raise ConversionError(
            f"{folder}: a Granite has every layer {ours['hidden_size']} wide, got layer_widths {ours['layer_widths']}"
        )
    config = {key: value for key, value in model_fields(ours).items() if key not in _BOWTIE_ONLY}
    for name in ("num_attention_heads", "num_key_value_heads", "intermediate_size", "attention_multiplier"):
        config[name] = _uniform(config[name], name, folder)
    if config["attention_multiplier"] is None:  # BowtieFormer's default, 1 / sqrt(head_dim), spelled out
        config["attention_multiplier"] = (ours["hidden_size"] // config["num_attention_heads"]) ** -0.5
    config.update(model_type="granite", architectures=["GraniteForCausalLM"])
    with_both_rope_spellings(config)
    write_foreign_folder(folder, destination, config, safetensors_loaders(folder), dtype, max_shard_bytes)
