"""lm-eval's `arc_easy`, `arc_challenge`, `hellaswag` and `piqa`, reading local JSON Lines files instead of the Hub.

Each offline task is a YAML file that `include:`s lm-eval's own YAML and overrides only where the data comes from:
`dataset_path: json`, `dataset_name: null`, `dataset_kwargs.data_files` (absolute paths: lm-eval resolves relative
ones against the working directory) and `tag`; a split the built-in task names but the local folder lacks becomes
`null`. Prompts, choices, targets, `process_docs` (HellaSwag's preprocessing is lm-eval's own function), metrics and
versions therefore come from the installed lm-eval itself, and the task keeps lm-eval's name, so results are keyed
`arc_easy`, `hellaswag`, ... whether the data came from the Hub or from disk.

The data folder holds one sub-folder per task with `{train,validation,test}.jsonl` in the Hugging Face field layout
(`<dir>/arc_easy/test.jsonl`, `<dir>/hellaswag/validation.jsonl`, ...). It is given by `--data-dir` or by the
environment variable `SHAPEFORMERS_EVAL_DATA`.

Few-shot: lm-eval draws the shots from the training split (from `fewshot_split` where a task names one). Where the
local folder has that split, shots are lm-eval's own (same rows, same seeded sampler). Where it lacks it,
`offline_task_config` refuses rather than let lm-eval fall back silently to another split, unless the caller names
one (`fewshot_split`, used only for such tasks); results are then marked as differing from lm-eval's. If that split
is the evaluated one, it is also declared as the task's `test_split` (the same rows are evaluated), because lm-eval
only keeps a document out of its own shots when the shots come from `test_split`.
"""

import hashlib
import os
from pathlib import Path

DATA_ENV = "SHAPEFORMERS_EVAL_DATA"
OFFLINE_TAG = "shapeformers_local_data"
SPLIT_KEYS = ("training_split", "validation_split", "test_split")

# lm-eval task name -> (its YAML inside lm_eval/tasks, the sub-folder of the data folder).
BUILTIN_TASKS = {
    "arc_easy": ("arc/arc_easy.yaml", "arc_easy"),
    "arc_challenge": ("arc/arc_challenge.yaml", "arc_challenge"),
    "hellaswag": ("hellaswag/hellaswag.yaml", "hellaswag"),
    "piqa": ("piqa/piqa.yaml", "piqa"),
}


class OfflineTaskError(ValueError):
    """A task cannot be run from the local data exactly as lm-eval defines it."""


def resolve_data_dir(data_dir=None):
    """`data_dir`, else $SHAPEFORMERS_EVAL_DATA, else None (use lm-eval's built-in tasks and the Hub)."""
    value = data_dir if data_dir is not None else os.environ.get(DATA_ENV) or None
    if value is None:
        return None
    path = Path(value).expanduser().resolve()
    if not path.is_dir():
        raise OfflineTaskError(f"eval data folder {path} does not exist")
    return path


def builtin_yaml(task):
    """Path of lm-eval's own YAML for `task`."""
    if task not in BUILTIN_TASKS:
        raise OfflineTaskError(f"no offline definition for task {task!r}; offline tasks: {', '.join(BUILTIN_TASKS)}")
    import lm_eval.tasks

    path = Path(lm_eval.tasks.__file__).parent / BUILTIN_TASKS[task][0]
    if path.is_file():
        return path
    # Moved in some lm-eval release: ask its index (slower: it parses every task YAML).
    entry = lm_eval.tasks.TaskManager().task_index.get(task)
    if entry is None or entry.yaml_path is None:
        raise OfflineTaskError(f"lm-eval {lm_eval_version()} has no YAML task {task!r}")
    return Path(entry.yaml_path)


def load_task_yaml(path, resolve_functions=True):
    """A task YAML with its `include:`s merged, the way lm-eval's task manager reads it."""
    try:
        from lm_eval.tasks._yaml_loader import load_yaml  # lm-eval >= 0.4.13
    except ImportError:
        from lm_eval.utils import load_yaml_config

        return load_yaml_config(yaml_path=str(path), mode="full" if resolve_functions else "simple")
    return load_yaml(path, resolve_func=resolve_functions)


def builtin_config(task, resolve_functions=True):
    """lm-eval's own configuration of `task` (a dict, includes merged)."""
    return load_task_yaml(builtin_yaml(task), resolve_functions)


def local_split_files(data_dir, task):
    """{split name: path} of the JSON Lines files present for `task` under `data_dir`."""
    folder = Path(data_dir) / BUILTIN_TASKS[task][1]
    return {path.stem: path.resolve() for path in sorted(folder.glob("*.jsonl"))}


def evaluated_split(config):
    """The split lm-eval scores: the test split when the task has one, else the validation split."""
    return config.get("test_split") or config.get("validation_split")


def builtin_fewshot_split(config):
    """The split lm-eval draws shots from for this config (`Task.fewshot_docs`' rule)."""
    fewshot = config.get("fewshot_config") or {}
    for split in (fewshot.get("split"), config.get("fewshot_split"), *(config.get(key) for key in SPLIT_KEYS)):
        if split:
            return split
    return None


def offline_task_config(task, data_dir, num_fewshot=None, fewshot_split=None):
    """The YAML content (a dict) of the offline copy of lm-eval's `task` reading `data_dir`.

    Raises OfflineTaskError where the local files cannot reproduce lm-eval's task: the evaluated split is missing,
    or shots are asked for and the split lm-eval draws them from is missing and no `fewshot_split` is named.
    """
    builtin = builtin_config(task, resolve_functions=False)
    files = local_split_files(data_dir, task)
    folder = Path(data_dir) / BUILTIN_TASKS[task][1]
    have = ", ".join(files) or "no .jsonl files"
    target = evaluated_split(builtin)
    if target not in files:
        raise OfflineTaskError(f"{task}: lm-eval scores its {target!r} split; {folder} has {have}")

    config = {"include": str(builtin_yaml(task)), "task": task, "tag": [OFFLINE_TAG], "dataset_path": "json",
              "dataset_name": None}  # fmt: skip
    used = {}
    for key in SPLIT_KEYS:
        split = builtin.get(key)
        if split is None:
            continue
        if split in files:
            used[split] = str(files[split])
        else:
            config[key] = None  # e.g. `training_split: null`: no train split here

    shots = builtin.get("num_fewshot") if num_fewshot is None else num_fewshot
    source = builtin_fewshot_split(builtin)
    if shots and source not in files:
        if fewshot_split is None:
            raise OfflineTaskError(
                f"{task}: lm-eval draws its {shots}-shot examples from the {source!r} split, which {folder} lacks "
                f"(it has {have}). Add {source}.jsonl there, run zero-shot, or name another split with "
                f"--fewshot-split (the scores then differ from lm-eval's {task})."
            )
        if fewshot_split not in files:
            raise OfflineTaskError(f"{task}: no {fewshot_split!r} split to draw shots from in {folder} (has {have})")
        used[fewshot_split] = str(files[fewshot_split])
        config["fewshot_split"] = fewshot_split
        if fewshot_split == target and builtin.get("test_split") is None:
            # Same rows evaluated, now as `test_split`, so that lm-eval drops each document from its own shots.
            config["test_split"] = target
            config["validation_split"] = None
    config["dataset_kwargs"] = {"data_files": used}
    return config


def write_offline_tasks(tasks, data_dir, folder, num_fewshot=None, fewshot_split=None):
    """Write one YAML per task into `folder` (a TaskManager `include_path`); return {task: path}."""
    import yaml

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = {}
    for task in tasks:
        config = offline_task_config(task, data_dir, num_fewshot, fewshot_split)
        paths[task] = folder / f"{task}.yaml"
        paths[task].write_text(yaml.safe_dump(config, sort_keys=False, allow_unicode=True), encoding="utf-8")
    return paths


def offline_task_manager(tasks, data_dir, folder, num_fewshot=None, fewshot_split=None, metadata=None):
    """A TaskManager that knows only the offline copies of `tasks` (written into `folder`, which must outlive it)."""
    from lm_eval.tasks import TaskManager

    write_offline_tasks(tasks, data_dir, folder, num_fewshot, fewshot_split)
    return TaskManager(include_path=str(folder), include_defaults=False, metadata=metadata)


def sha256(path, chunk=1 << 20):
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def data_provenance(tasks, data_dir=None, num_fewshot=None, fewshot_split=None):
    """Where each task's data came from, for the results file and model cards: the Hub dataset lm-eval's own task
    names (path, config, evaluated split) and, offline, every local file used with its sha256."""
    provenance = {}
    for task in tasks:
        try:
            builtin = builtin_config(task, resolve_functions=False)
        except OfflineTaskError:
            if data_dir is not None:
                raise
            provenance[task] = {"source": "hub"}  # some other lm-eval task
            continue
        entry = {
            "source": "local" if data_dir is not None else "hub",
            "hub_dataset": {"path": builtin.get("dataset_path"), "name": builtin.get("dataset_name"),
                            "split": evaluated_split(builtin)},  # fmt: skip
        }
        if data_dir is not None:
            config = offline_task_config(task, data_dir, num_fewshot, fewshot_split)
            entry["files"] = {split: {"path": path, "sha256": sha256(path)}
                              for split, path in config["dataset_kwargs"]["data_files"].items()}  # fmt: skip
            if "fewshot_split" in config:
                entry["fewshot_split"] = config["fewshot_split"]
                entry["differs_from_lm_eval"] = (f"shots drawn from {config['fewshot_split']!r}; lm-eval draws them "
                                                 f"from {builtin_fewshot_split(builtin)!r}")  # fmt: skip
        provenance[task] = entry
    return provenance


def lm_eval_version():
    from importlib.metadata import version

    return version("lm_eval")
