"""`shapeformers eval`: lm-eval's `simple_evaluate` with its `HFLM` on one of our Hub folders (or any causal LM),
plus the model's own accounting, and optionally sliding-window perplexity on a text file.

The results keep lm-eval's structure (`results`, `configs`, `versions`, `n-shot`, `higher_is_better`, `n-samples`,
`config`, ...), as `lm_eval --output_path` writes it, with two keys added:
- `shapeformers`: the model's parameter count, FLOPs per token and KV-cache bytes per token (from its config's
  `num_parameters()`, `flops_per_token(seq_len)` and `kv_cache_bytes_per_token(dtype)` where the config has them),
  where each task's data came from (the Hub, or local files with their sha256), versions and wall-clock times;
- `perplexity` (with `--perplexity FILE`): see `shapeformers.eval.perplexity`.
"""

import json
import os
import tempfile
import time
from pathlib import Path

import torch

from .tasks import data_provenance, lm_eval_version, offline_task_manager, resolve_data_dir


def default_device():
    return "cuda" if torch.cuda.is_available() else "cpu"


def config_max_length(config):
    """The context length lm-eval's HFLM would read from the config (n_positions, max_position_embeddings, n_ctx)."""
    config = getattr(config, "text_config", None) or config
    for name in ("n_positions", "max_position_embeddings", "n_ctx"):
        value = getattr(config, name, None)
        if value is not None:
            return int(value)
    return None


def model_accounting(config, seq_len, dtype):
    """Parameter count, FLOPs per token at `seq_len` and KV bytes per token in `dtype`, where the config has them."""
    stats = {}
    if callable(getattr(config, "num_parameters", None)):
        stats["num_parameters"] = int(config.num_parameters())
        try:
            stats["num_parameters_without_embeddings"] = int(config.num_parameters(exclude_embeddings=True))
        except TypeError:
            pass
    if callable(getattr(config, "flops_per_token", None)) and seq_len:
        stats["flops_per_token"] = int(config.flops_per_token(int(seq_len)))
        stats["flops_seq_len"] = int(seq_len)
    if callable(getattr(config, "kv_cache_bytes_per_token", None)) and dtype is not None:
        stats["kv_cache_bytes_per_token"] = int(config.kv_cache_bytes_per_token(dtype))
        stats["kv_cache_dtype"] = str(dtype).removeprefix("torch.")
    return stats


def evaluate(model, tasks=(), *, data_dir=None, limit=None, num_fewshot=None, fewshot_split=None, batch_size=1,
             dtype="auto", device=None, peft=None, revision="main", max_length=None, perplexity_file=None,
             stride=None, log_samples=False, bootstrap_iters=100000, seed=0, fewshot_seed=1234,
             perplexity_batch_size=None, progress=True):  # fmt: skip
    """Evaluate `model` (folder or repo id) on lm-eval `tasks` and/or the perplexity of `perplexity_file`.

    Returns lm-eval's results dict (what `lm_eval --output_path` writes) with `shapeformers` (accounting, data
    provenance, timings) and, when asked, `perplexity` added. `data_dir` (default $SHAPEFORMERS_EVAL_DATA) switches
    arc_easy, arc_challenge, hellaswag and piqa to local files (see `shapeformers.eval.tasks`).
    """
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager
    from transformers import AutoConfig

    tasks = list(tasks)
    if limit is not None and float(limit) >= 1:
        limit = int(limit)
    data_dir = resolve_data_dir(data_dir)
    if fewshot_split is not None and data_dir is None:
        raise ValueError("--fewshot-split only applies to local data (--data-dir or $SHAPEFORMERS_EVAL_DATA)")
    if perplexity_file is not None and not Path(perplexity_file).is_file():
        raise FileNotFoundError(f"no such text file: {perplexity_file}")
    device = device or default_device()
    config = AutoConfig.from_pretrained(model, trust_remote_code=True, revision=revision)
    if max_length is None:
        max_length = config_max_length(config)
    model_args = {"pretrained": str(model), "trust_remote_code": True, "dtype": dtype, "revision": revision}
    if max_length is not None:
        model_args["max_length"] = int(max_length)
    if peft is not None:
        model_args["peft"] = str(peft)

    # Checks the local data (and the few-shot split) before the model is loaded.
    provenance = data_provenance(tasks, data_dir, num_fewshot, fewshot_split) if tasks else {}
    started = time.time()
    lm = HFLM(**model_args, batch_size=batch_size, device=device)
    load_seconds = time.time() - started
    model_dtype = getattr(lm.model, "dtype", None)

    eval_seconds = 0.0
    if tasks:
        started = time.time()
        with tempfile.TemporaryDirectory(prefix="shapeformers-tasks-") as folder:
            if data_dir is None:
                task_manager = TaskManager(metadata=dict(model_args))
            else:
                task_manager = offline_task_manager(tasks, data_dir, folder, num_fewshot, fewshot_split,
                                                    metadata=dict(model_args))  # fmt: skip
                unknown = sorted(set(tasks) - set(task_manager.all_subtasks))
                if unknown:
                    raise ValueError(f"no offline definition for {unknown}")
            results = simple_evaluate(
                model=lm, tasks=tasks, num_fewshot=num_fewshot, batch_size=batch_size, device=device, limit=limit,
                bootstrap_iters=bootstrap_iters, log_samples=log_samples, task_manager=task_manager,
                random_seed=seed, fewshot_random_seed=fewshot_seed,  # numpy and torch: lm-eval's defaults (1234)
            )  # fmt: skip
        eval_seconds = time.time() - started
        # As `lm_eval --model hf --model_args ...` records it (simple_evaluate saw a ready-made LM).
        results["config"]["model"] = "hf"
        results["config"]["model_args"] = dict(model_args)
    else:
        results = {"config": {"model": "hf", "model_args": dict(model_args), "device": device}}

    if perplexity_file is not None:
        started = time.time()
        from .perplexity import file_perplexity

        lm.model.eval()
        results["perplexity"] = file_perplexity(
            lm.model, lm.tokenizer, perplexity_file, max_length=lm.max_length, stride=stride,
            batch_size=perplexity_batch_size or (batch_size if isinstance(batch_size, int) else 1), progress=progress,
        )  # fmt: skip
        results["perplexity"]["seconds"] = round(time.time() - started, 3)

    import transformers

    results["shapeformers"] = {
        "model": str(model),
        "model_type": getattr(config, "model_type", None),
        "peft": None if peft is None else str(peft),
        **model_accounting(config, max_length, model_dtype),
        "max_length": lm.max_length,
        "data_dir": None if data_dir is None else str(data_dir),
        "data": provenance,
        "versions": {"lm_eval": lm_eval_version(), "transformers": transformers.__version__,
                     "torch": torch.__version__},  # fmt: skip
        "seconds": {"load": round(load_seconds, 3), "tasks": round(eval_seconds, 3)},
    }
    return results


def write_results(results, path):
    """Write `results` as lm-eval does (its JSON fallback for numpy values, dtypes and functions)."""
    from lm_eval.utils import handle_non_serializable

    path = Path(path)
    if path.parent != Path(""):
        path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(results, indent=2, default=handle_non_serializable, ensure_ascii=False) + "\n")
    tmp.replace(path)
    return path
