"""What every converter shares: a checkpoint as a config plus lazy tensor loaders, lazy safetensors reading, sharded
safetensors writing and atomic output folders."""

import json
import os
import shutil
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Callable

import torch
from safetensors import safe_open
from safetensors.torch import save_file

DEFAULT_MAX_SHARD_BYTES = 2 * 1024**3


class ConversionError(ValueError):
    """A checkpoint that cannot be converted as asked; the message says what is wrong and with which file or tensor."""


@dataclass
class Checkpoint:
    """A model read from some format: its config and, for each tensor name, a function that loads that tensor (so
    that converting never holds more than one tensor of the source at a time).

    `tokenizer` is a tokenizer object to save with the model. `source_dir` is the source checkpoint's folder, whose
    tokenizer files and generation_config.json (stop tokens, sampling defaults) are carried over; without one, the
    generation config is made from `config`. `base_model` names what the checkpoint was converted from (for cards).
    """

    config: object
    tensors: dict[str, Callable[[], torch.Tensor]]
    tokenizer: object = None
    source_dir: Path | None = None
    base_model: str | None = None
    notes: list[str] = field(default_factory=list)


def read_json(path):
    path = Path(path)
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise ConversionError(f"{path} not found") from None
    except json.JSONDecodeError as error:
        raise ConversionError(f"{path} is not valid JSON: {error}") from None


def _load_tensor(path, name):
    with safe_open(path, framework="pt") as handle:
        return handle.get_tensor(name)


def safetensors_headers(folder):
    """{file path: {tensor name: shape}} of a folder's `model.safetensors` or sharded `model-*.safetensors` files
    (through `model.safetensors.index.json` when present). Only headers are read, so truncated files fail here."""
    folder = Path(folder)
    index = folder / "model.safetensors.index.json"
    files = sorted(set(read_json(index)["weight_map"].values())) if index.exists() else ["model.safetensors"]
    headers = {}
    for name in files:
        path = folder / name
        if not path.exists():
            raise ConversionError(f"{path} not found (no safetensors weights in {folder})")
        try:
            with safe_open(path, framework="pt") as handle:
                headers[path] = {key: tuple(handle.get_slice(key).get_shape()) for key in handle.keys()}
        except Exception as error:  # safetensors raises its own error types for truncated or corrupt headers
            raise ConversionError(f"{path} is not a readable safetensors file: {error}") from None
    return headers


def safetensors_loaders(folder):
    """{tensor name: loader} for every tensor of a folder's safetensors files (see safetensors_headers)."""
    return {
        key: partial(_load_tensor, path, key) for path, shapes in safetensors_headers(folder).items() for key in shapes
    }


def write_safetensors(folder, loaders, dtype=None, max_shard_bytes=DEFAULT_MAX_SHARD_BYTES, check=None):
    """Write `loaders`' tensors (in their order) as `model.safetensors`, or as shards of at most `max_shard_bytes`
    plus the Hugging Face index when they do not fit one. One tensor is loaded at a time; at most one shard is held.
    `check(name, tensor)` may raise on a bad tensor before anything of it is written. Returns the source dtype."""
    folder = Path(folder)
    shards, current, current_bytes, source_dtype = [], {}, 0, None

    def flush():
        nonlocal current, current_bytes
        shard_path = folder / f".shard-{len(shards)}.safetensors"
        save_file(current, shard_path, metadata={"format": "pt"})
        shards.append((shard_path, list(current)))
        current, current_bytes = {}, 0

    for name, load in loaders.items():
        tensor = load()
        if check is not None:
            check(name, tensor)
        if tensor.is_floating_point():
            source_dtype = source_dtype or tensor.dtype
            if dtype is not None:
                tensor = tensor.to(dtype)
        size = tensor.numel() * tensor.element_size()
        if current and current_bytes + size > max_shard_bytes:
            flush()
        current[name] = tensor.contiguous()
        current_bytes += size
    if current or not shards:
        flush()

    if len(shards) == 1:
        shards[0][0].rename(folder / "model.safetensors")
        return source_dtype
    weight_map, total = {}, 0
    for number, (path, names) in enumerate(shards, start=1):
        final = folder / f"model-{number:05d}-of-{len(shards):05d}.safetensors"
        path.rename(final)
        total += final.stat().st_size
        weight_map.update({name: final.name for name in names})
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    return source_dtype


@contextmanager
def atomic_folder(destination):
    """Yield a temporary folder beside `destination` and rename it into place when the block succeeds: the
    destination appears complete or not at all, even if the process is killed midway. An existing destination is
    refused rather than overwritten."""
    destination = Path(destination).absolute()
    if destination.exists():
        raise ConversionError(f"{destination} already exists; choose a new destination")
    destination.parent.mkdir(parents=True, exist_ok=True)
    staging = destination.parent / f".{destination.name}.partial-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    try:
        yield staging
        os.rename(staging, destination)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def renamed(loaders, rename):
    """`loaders` under new names; `rename(name)` returns the new name, or None to drop the tensor."""
    result = {}
    for name, load in loaders.items():
        new_name = rename(name)
        if new_name is not None:
            result[new_name] = load
    return result


def write_foreign_folder(
    source_folder, destination, config, loaders, dtype=None, max_shard_bytes=DEFAULT_MAX_SHARD_BYTES
):
    """Export: write `config` (a dict, saved as config.json) and `loaders`' tensors as a Hugging Face folder in some
    other format, atomically, with the source folder's tokenizer and generation config copied alongside."""
    source_folder = Path(source_folder)
    with atomic_folder(destination) as folder:
        write_safetensors(folder, loaders, dtype, max_shard_bytes)
        (folder / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        for path in source_folder.iterdir():
            if path.name.startswith("tokenizer") or path.name in ("special_tokens_map.json", "generation_config.json"):
                shutil.copy2(path, folder / path.name)
