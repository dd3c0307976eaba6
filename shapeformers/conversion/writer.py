"""The one writer every source format goes through: check the tensors against the model the config describes, then
write a Hub folder (config, sharded safetensors, remote code, generation config, tokenizer) atomically."""

import shutil

import torch
from huggingface_hub import ModelCardData
from transformers import GenerationConfig

from ..modeling import BowtieFormerForCausalLM, HourglassLlamaForCausalLM
from ..modeling.bundle import write_remote_code
from ..tokenization import save_tokenizer
from .io import DEFAULT_MAX_SHARD_BYTES, ConversionError, atomic_folder, write_safetensors

MODEL_CLASSES = {"hourglass_llama": HourglassLlamaForCausalLM, "bowtieformer": BowtieFormerForCausalLM}
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
)


def skeleton(config):
    """The model `config` describes, on the meta device (no memory), and its expected tensor shapes (a tied LM head
    is stored once, as the input embedding)."""
    with torch.device("meta"):
        model = MODEL_CLASSES[config.model_type](config)
    shapes = {name: tuple(tensor.shape) for name, tensor in model.state_dict().items()}
    if config.tie_word_embeddings:
        shapes.pop("lm_head.weight")
    return model, shapes


def check_names(provided, expected):
    missing = sorted(set(expected) - set(provided))
    unexpected = sorted(set(provided) - set(expected))
    if missing or unexpected:
        raise ConversionError(
            "the checkpoint does not match its config: "
            + "; ".join(f"{what}: {', '.join(names)}" for what, names in (("missing", missing), ("unexpected", unexpected)) if names)
        )


def write_checkpoint(checkpoint, destination, dtype=None, max_shard_bytes=DEFAULT_MAX_SHARD_BYTES):
    """Write `checkpoint` as a self-contained Hub folder at `destination`. Every tensor the model expects must be
    present with its shape, and nothing else; tensors keep the source dtype unless `dtype` is given."""
    config = checkpoint.config
    model, shapes = skeleton(config)
    check_names(checkpoint.tensors, shapes)
    refused = []

    def check(name, tensor):
        if tuple(tensor.shape) != shapes[name]:
            refused.append(f"{name} {tuple(tensor.shape)} (expected {shapes[name]})")
        if not tensor.is_floating_point():  # loading would cast integers into the float parameters
            refused.append(f"{name} {tensor.dtype} (expected a floating-point dtype)")

    ordered = {name: checkpoint.tensors[name] for name in shapes}  # the model's own order
    with atomic_folder(destination) as folder:
        source_dtype = write_safetensors(folder, ordered, dtype, max_shard_bytes, check)
        if refused:
            raise ConversionError("misshaped or mistyped tensors: " + "; ".join(refused))
        config.dtype = str(dtype or source_dtype or torch.float32).removeprefix("torch.")
        config.architectures = [type(model).__name__]
        config.save_pretrained(folder)
        write_remote_code(model, folder, model._remote_code_auto_classes)
        source = checkpoint.source_dir
        if source is not None and (source / "generation_config.json").exists():  # as it is, as exports copy it
            shutil.copy2(source / "generation_config.json", folder / "generation_config.json")
        else:
            GenerationConfig.from_model_config(config).save_pretrained(folder)
        if checkpoint.tokenizer is not None:
            save_tokenizer(checkpoint.tokenizer, folder)
        elif source is not None:
            for name in TOKENIZER_FILES:
                if (source / name).exists():
                    shutil.copy2(source / name, folder / name)
        if checkpoint.base_model:  # card metadata that `shapeformers card` / `publish` keep
            metadata = ModelCardData(base_model=checkpoint.base_model, library_name="transformers").to_yaml()
            (folder / "README.md").write_text(f"---\n{metadata}\n---\n")
