"""Conversion of foreign checkpoints to HourglassLlama / BowtieFormer Hub folders, and back where the math allows.

One module per source format, each reading a checkpoint into a config plus lazy tensor loaders (`Checkpoint`);
`writer.write_checkpoint` checks and writes every one of them the same way.
"""

from contextlib import contextmanager
from pathlib import Path

import torch
from accelerate.utils import convert_file_size_to_int

from .granite import export_granite, read_granite
from .hourglass_lm import export_hourglass_lm, is_hourglass_lm, read_hourglass_lm
from .io import DEFAULT_MAX_SHARD_BYTES, Checkpoint, ConversionError, read_json
from .llama import export_llama, read_llama
from .llama2c import read_llama2c
from .lm_engine import export_lm_engine, read_lm_engine
from .writer import write_checkpoint

FORMATS = ("lm_engine", "hourglass_lm", "llama", "granite", "llama2c")
READERS = {
    "lm_engine": read_lm_engine,
    "hourglass_lm": read_hourglass_lm,
    "llama": read_llama,
    "granite": read_granite,
    "llama2c": read_llama2c,
}
EXPORTERS = {
    "lm_engine": export_lm_engine,
    "hourglass_lm": export_hourglass_lm,
    "llama": export_llama,
    "granite": export_granite,
}
OUR_MODEL_TYPES = ("hourglass_llama", "bowtieformer")


def detect_format(source):
    """The format of `source` (a folder or a llama2.c file): one of FORMATS, or "shapeformers" for our own folders."""
    source = Path(source)
    if source.is_file():
        return "llama2c"
    config_path = source / "config.json"
    if not config_path.exists():
        raise ConversionError(f"cannot tell the format of {source}: no config.json; pass --from (one of {FORMATS})")
    config = read_json(config_path)
    model_type = config.get("model_type")
    if is_hourglass_lm(config):
        return "hourglass_lm"
    if model_type == "width_varying":
        return "lm_engine"
    if model_type in ("llama", "granite"):
        return model_type
    if model_type in OUR_MODEL_TYPES:
        return "shapeformers"
    raise ConversionError(f"{source}: unknown model_type {model_type!r}; pass --from (one of {FORMATS})")


def parse_dtype(name):
    if name is None:
        return None
    dtype = getattr(torch, str(name).removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ConversionError(f"dtype must be a floating torch dtype such as float32, bfloat16, float16; got {name!r}")
    return dtype


def parse_shard_size(size):
    """Bytes from a byte count or a size in transformers' spelling ("5GB", "500MiB"); None gives the default."""
    if size is None:
        return DEFAULT_MAX_SHARD_BYTES
    try:
        size_bytes = int(size) if str(size).isdigit() else int(convert_file_size_to_int(size))
    except ValueError:
        size_bytes = 0
    if size_bytes <= 0:
        raise ConversionError(f"max_shard_size must be a positive byte count or a size such as '5GB'; got {size!r}")
    return size_bytes


@contextmanager
def reading(source, source_format):
    """Malformed source files (a config.json field of the wrong type or value, an index without its weight map)
    surface deep in a reader as Python errors; report them as a ConversionError that names the source."""
    try:
        yield
    except ConversionError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        message = f"{source} is not a valid {source_format!r} checkpoint: {type(error).__name__}: {error}"
        raise ConversionError(message) from error


def convert(source, destination, from_format=None, to_format=None, tokenizer=None, dtype=None, verify=False,
            max_shard_size=None):  # fmt: skip
    """Convert `source` into `destination` and return a report (a dict).

    Without `to_format`: a foreign checkpoint (format `from_format`, detected when None) becomes one of our Hub
    folders. With `to_format`: one of our folders is exported to that foreign format. `verify` then runs the other
    side's transformers implementation, where there is one, on the same random tokens and fails above tolerance.
    `max_shard_size` bounds each output safetensors file (default 2 GiB).
    """
    detected = from_format or detect_format(source)
    dtype = parse_dtype(dtype)
    max_shard_bytes = parse_shard_size(max_shard_size)
    if to_format is not None:
        if to_format not in EXPORTERS:
            raise ConversionError(f"--to must be one of {tuple(EXPORTERS)}, got {to_format!r}")
        if detected != "shapeformers":
            raise ConversionError(f"--to exports one of our folders; {source} is a {detected!r} checkpoint")
        with reading(source, "shapeformers"):
            EXPORTERS[to_format](source, destination, dtype=dtype, max_shard_bytes=max_shard_bytes)
        report = {"from": "shapeformers", "to": to_format, "destination": str(destination)}
        if verify:
            report["verify"] = verify_logits(destination, to_format, source)
        return report
    if detected not in READERS:
        raise ConversionError(f"--from must be one of {FORMATS}, got {detected!r}")
    if tokenizer is not None and detected != "llama2c":
        raise ConversionError("--tokenizer is for llama2.c checkpoints; other formats carry their tokenizer files")
    with reading(source, detected):
        checkpoint = read_llama2c(source, tokenizer) if detected == "llama2c" else READERS[detected](source)
    write_checkpoint(checkpoint, destination, dtype=dtype, max_shard_bytes=max_shard_bytes)
    report = {"from": detected, "to": checkpoint.config.model_type, "destination": str(destination)}
    if verify:
        report["verify"] = verify_logits(source, detected, destination)
    return report


# Foreign formats whose implementation ships with transformers, and their tolerance in float32.
_TRANSFORMERS_CLASSES = {"llama": "LlamaForCausalLM", "granite": "GraniteForCausalLM"}
VERIFY_TOLERANCE = 1e-4


def verify_logits(foreign_folder, foreign_format, our_folder, sequence_length=32, seed=0):
    """Largest absolute logit difference between the foreign implementation and ours on the same random tokens, in
    float32. Raises ConversionError above VERIFY_TOLERANCE; says so when no foreign implementation is installed."""
    import transformers

    if foreign_format not in _TRANSFORMERS_CLASSES:
        return {"skipped": f"no installed implementation of {foreign_format!r} to compare with"}
    from transformers import AutoModelForCausalLM

    foreign = getattr(transformers, _TRANSFORMERS_CLASSES[foreign_format]).from_pretrained(
        foreign_folder, dtype=torch.float32
    )
    ours = AutoModelForCausalLM.from_pretrained(our_folder, dtype=torch.float32, trust_remote_code=True)
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(0, ours.config.vocab_size, (2, sequence_length), generator=generator)
    with torch.no_grad():
        difference = (foreign.eval()(input_ids).logits - ours.eval()(input_ids).logits).abs().max().item()
    if not difference <= VERIFY_TOLERANCE:
        raise ConversionError(f"logits differ by {difference:.3g} (> {VERIFY_TOLERANCE}) between source and conversion")
    return {"max_abs_logit_difference": difference, "tolerance": VERIFY_TOLERANCE}


__all__ = [
    "FORMATS",
    "Checkpoint",
    "ConversionError",
    "convert",
    "detect_format",
    "verify_logits",
    "write_checkpoint",
]
