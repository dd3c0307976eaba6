"""Saving a model as a self-contained remote-code folder.

On the Hub a model folder must carry its own code: flat `configuration_*.py` / `modeling_*.py` files that import
each other with single-dot relative imports, plus `auto_map` in config.json. transformers' own copier does not
follow our one cross-folder import (`from ..configuration.X import`), so this module writes the folder itself.
It runs from the package and from such a folder alike (a model loaded with trust_remote_code saves the same way),
so it imports only the standard library. transformers 4.57 copies into its module cache only the files that the
configuration and modeling files import themselves, so every helper must be imported directly by one of them (a test
checks it).
"""

import json
import os
import re
import sys
import tempfile
from pathlib import Path

_RELATIVE_IMPORT = re.compile(r"^from (\.\.configuration\.|\.)(\w+) import", re.MULTILINE)


def source_files(module_name):
    """The source file of `module_name` and of every module it reaches through relative imports, each with its text
    rewritten for a flat folder (`from ..configuration.x import` becomes `from .x import`)."""
    files, pending = {}, [Path(sys.modules[module_name].__file__)]
    while pending:
        path = pending.pop()
        if path.name in files:
            continue
        text = path.read_text()
        for prefix, name in _RELATIVE_IMPORT.findall(text):
            folder = path.parent.parent / "configuration" if prefix.startswith("..") else path.parent
            if not (folder / f"{name}.py").exists():  # already flat: everything sits beside us
                folder = path.parent
            pending.append(folder / f"{name}.py")
        files[path.name] = _RELATIVE_IMPORT.sub(r"from .\2 import", text)
    return files


def atomic_write_text(path, text):
    """Write `path` so that a reader sees the old content or the new one, never a partial file."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.chmod(tmp, 0o644)  # mkstemp creates files readable by their owner only
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def write_remote_code(model, save_directory, auto_classes):
    """Copy the model's code into `save_directory` and point config.json's `auto_map` at it.

    `auto_classes` maps Auto class names ("AutoModelForCausalLM") to class names in the model's module.
    """
    save_directory = Path(save_directory)
    config_module = type(model.config).__module__
    model_module = type(model).__module__
    for name, text in {**source_files(config_module), **source_files(model_module)}.items():
        atomic_write_text(save_directory / name, text)

    auto_map = {"AutoConfig": f"{config_module.rsplit('.', 1)[-1]}.{type(model.config).__name__}"}
    model_file = model_module.rsplit(".", 1)[-1]
    auto_map.update({auto: f"{model_file}.{cls}" for auto, cls in auto_classes.items()})
    # A model loaded by repo id carries "org/name--file.Class" entries: the saved copy must use its own files.
    model.config.auto_map = auto_map
    config_path = save_directory / "config.json"
    config = json.loads(config_path.read_text())
    config["auto_map"] = auto_map
    atomic_write_text(config_path, json.dumps(config, indent=2, sort_keys=True) + "\n")


# The options of `push_to_hub` that `save_pretrained(push_to_hub=True, ...)` passes on to it (transformers 4.57-5.x).
PUSH_TO_HUB_OPTIONS = ("repo_id", "private", "token", "commit_message", "commit_description", "create_pr", "revision",
                       "tags")  # fmt: skip


class RemoteCodeMixin:
    """Put first among a PreTrainedModel's bases: `save_pretrained` (and with it `push_to_hub`, Trainer checkpoints
    and PEFT merges) also writes the model's code, so that the folder loads with `trust_remote_code=True`."""

    # Auto class name -> class name in the model's modeling file; set by each model family.
    _remote_code_auto_classes = {}

    def save_pretrained(self, save_directory, is_main_process=True, *args, push_to_hub=False, **kwargs):
        # The upload happens here, after the code is written, rather than inside transformers' save_pretrained.
        hub_kwargs = {key: kwargs.pop(key) for key in PUSH_TO_HUB_OPTIONS if key in kwargs}
        super().save_pretrained(save_directory, is_main_process, *args, **kwargs)
        if not is_main_process:  # as in transformers: in a multi-process save only the main process writes
            return
        write_remote_code(self, save_directory, self._remote_code_auto_classes)
        if push_to_hub:  # push_to_hub saves into a temporary folder through this method, code included
            if "max_shard_size" in kwargs:
                hub_kwargs["max_shard_size"] = kwargs["max_shard_size"]
            self.push_to_hub(hub_kwargs.pop("repo_id", Path(save_directory).resolve().name), **hub_kwargs)
