"""The official Hourglass_LM Hugging Face port (MODELS.md §1.3) <-> HourglassLlama.

The port saves `model_type: "llama"` plus `num_mlp_layers` and `mlp_intermediate_sizes`, with our tensor names, so
stock transformers would load it as a plain Llama and leave the sub-MLPs random; here it is read as what it is."""

from pathlib import Path

from ..configuration import HourglassLlamaConfig
from .io import (
    DEFAULT_MAX_SHARD_BYTES, Checkpoint, ConversionError, read_json, renamed, safetensors_loaders, write_foreign_folder,
)
from .llama import model_fields, tied_head_dropped, with_both_rope_spellings


def is_hourglass_lm(config_dict):
    return config_dict.get("model_type") == "llama" and "num_mlp_layers" in config_dict


def read_hourglass_lm(folder):
    folder = Path(folder)
    source = read_json(folder / "config.json")
    if not is_hourglass_lm(source):
        raise ConversionError(
            f"{folder} is not an Hourglass_LM checkpoint (model_type 'llama' with num_mlp_layers), got model_type "
            f"{source.get('model_type')!r}"
        )
    fields = model_fields(source)
    fields.pop("pretraining_tp", None)
    config = HourglassLlamaConfig(**fields)
    tensors = renamed(safetensors_loaders(folder), tied_head_dropped(config.tie_word_embeddings))
    return Checkpoint(config=config, tensors=tensors, source_dir=folder, base_model=source.get("_name_or_path") or None)


def export_hourglass_lm(folder, destination, dtype=None, max_shard_bytes=DEFAULT_MAX_SHARD_BYTES):
    """Write one of our HourglassLlama folders in the official port's layout."""
    folder = Path(folder)
    ours = read_json(folder / "config.json")
    if ours.get("model_type") != "hourglass_llama":
        raise ConversionError(f"{folder} is not an HourglassLlama folder (model_type {ours.get('model_type')!r})")
    config = model_fields(ours)
    config.update(model_type="llama", architectures=["LlamaForCausalLM"])
    with_both_rope_spellings(config)
    write_foreign_folder(folder, destination, config, safetensors_loaders(folder), dtype, max_shard_bytes)
