"""Results JSON (from `shapeformers eval` or `lm_eval --output_path`) to model-card material: a Markdown table and
the `model-index` metadata the Hub reads, built through huggingface_hub's `EvalResult` and `ModelCardData`.

Scores are percentages (0-100, two decimals) by default, as on the Open LLM Leaderboard's cards; pass
`percent=False` for lm-eval's fractions. Offline runs point the metadata at the Hub dataset that lm-eval's own task
reads (e.g. `allenai/ai2_arc`, config `ARC-Easy`, split `test`), since the local files hold the same rows.

    import json
    from shapeformers.eval.cards import markdown_table, model_card_data
    results = json.load(open("results.json"))
    print(markdown_table(results))
    card_data = model_card_data(results, "stories260K-hourglass", license="mit")
    print(card_data.to_yaml())  # the README front matter, `model-index` included
"""

import math

LM_EVAL_URL = "https://github.com/EleutherAI/lm-evaluation-harness"
DATASET_NAMES = {"arc_easy": "ARC-Easy", "arc_challenge": "ARC-Challenge", "hellaswag": "HellaSwag", "piqa": "PIQA"}
METRIC_NAMES = {"acc": "accuracy", "acc_norm": "normalized accuracy"}
DEFAULT_METRICS = ("acc", "acc_norm")


def _number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def task_scores(results, metrics=DEFAULT_METRICS):
    """[{task, n_shot, n_samples, metrics: {name: (value, stderr or None)}}] for each task in `results`, in order."""
    rows = []
    for task, scores in results.get("results", {}).items():
        found = {}
        for metric in metrics:
            value = scores.get(f"{metric},none")
            if _number(value):
                stderr = scores.get(f"{metric}_stderr,none")
                found[metric] = (float(value), float(stderr) if _number(stderr) else None)
        if not found:
            continue
        samples = results.get("n-samples", {}).get(task, {})
        rows.append({"task": task, "n_shot": results.get("n-shot", {}).get(task),
                     "n_samples": samples.get("effective"), "metrics": found})  # fmt: skip
    return rows


def dataset_of(results, task):
    """(Hub dataset path, config, split) that `task`'s scores are about."""
    hub = results.get("shapeformers", {}).get("data", {}).get(task, {}).get("hub_dataset")
    if hub:
        return hub.get("path"), hub.get("name"), hub.get("split")
    config = results.get("configs", {}).get(task, {})
    split = config.get("test_split") or config.get("validation_split")
    return config.get("dataset_path"), config.get("dataset_name"), split


def _format(value, percent):
    return f"{100 * value:.2f}" if percent else f"{value:.4f}"


def markdown_table(results, metrics=DEFAULT_METRICS, percent=True):
    """A Markdown table of each task's metrics (± stderr), then the model's accounting and perplexity if present."""
    lines = []
    rows = task_scores(results, metrics)
    if rows:
        used = [metric for metric in metrics if any(metric in row["metrics"] for row in rows)]
        unit = " (%)" if percent else ""
        lines.append("| Task | Shots | Docs | " + " | ".join(f"{m}{unit}" for m in used) + " |")
        lines.append("|---|---:|---:|" + "---:|" * len(used))
        for row in rows:
            cells = []
            for metric in used:
                if metric not in row["metrics"]:
                    cells.append("")
                    continue
                value, stderr = row["metrics"][metric]
                cells.append(_format(value, percent) + ("" if stderr is None else f" ± {_format(stderr, percent)}"))
            shots = "" if row["n_shot"] is None else str(row["n_shot"])
            docs = "" if row["n_samples"] is None else str(row["n_samples"])
            lines.append(f"| {row['task']} | {shots} | {docs} | " + " | ".join(cells) + " |")
    ppl = results.get("perplexity")
    if ppl:
        if lines:
            lines.append("")
        lines.append("| Text | Tokens | Words | Token PPL | Word PPL | Bits/byte | Window / stride |")
        lines.append("|---|---:|---:|---:|---:|---:|---|")
        name = str(ppl.get("file", "")).rsplit("/", 1)[-1]
        lines.append(f"| {name} | {ppl['tokens']:,} | {ppl['words']:,} | {ppl['token_perplexity']:.3f} | "
                     f"{ppl['word_perplexity']:.3f} | {ppl['bits_per_byte']:.4f} | "
                     f"{ppl['max_length']} / {ppl['stride']} |")  # fmt: skip
    stats = results.get("shapeformers", {})
    facts = []
    if "num_parameters" in stats:
        facts.append(f"parameters {stats['num_parameters']:,}")
    if "flops_per_token" in stats:
        facts.append(f"forward FLOPs/token {stats['flops_per_token']:,} at {stats['flops_seq_len']} tokens")
    if "kv_cache_bytes_per_token" in stats:
        facts.append(f"KV cache {stats['kv_cache_bytes_per_token']:,} bytes/token ({stats['kv_cache_dtype']})")
    if facts:
        lines.extend(["", "Model: " + "; ".join(facts) + "."])
    return "\n".join(lines)


def eval_results(results, metrics=DEFAULT_METRICS, percent=True, task_type="text-generation",
                 task_name="Text Generation", source_name=None, perplexity_dataset=None):  # fmt: skip
    """huggingface_hub `EvalResult`s, one per task and metric. `perplexity_dataset` (a dict with `type`, `name` and
    optionally `config`, `split`) also reports the perplexity section as word perplexity on that dataset."""
    from huggingface_hub import EvalResult

    if source_name is None:
        version = results.get("shapeformers", {}).get("versions", {}).get("lm_eval")
        source_name = "lm-evaluation-harness" + (f" {version}" if version else "")
    evals = []
    for row in task_scores(results, metrics):
        task = row["task"]
        path, config, split = dataset_of(results, task)
        for metric, (value, _) in row["metrics"].items():
            evals.append(EvalResult(
                task_type=task_type, task_name=task_name, dataset_type=path or task,
                dataset_name=DATASET_NAMES.get(task, task), dataset_config=config, dataset_split=split,
                dataset_args=None if row["n_shot"] is None else {"num_few_shot": row["n_shot"]},
                metric_type=metric, metric_name=METRIC_NAMES.get(metric, metric),
                metric_value=round(100 * value, 2) if percent else round(value, 4),
                source_name=source_name, source_url=LM_EVAL_URL,
            ))  # fmt: skip
    ppl = results.get("perplexity")
    if ppl and perplexity_dataset:
        evals.append(EvalResult(
            task_type=task_type, task_name=task_name, dataset_type=perplexity_dataset["type"],
            dataset_name=perplexity_dataset["name"], dataset_config=perplexity_dataset.get("config"),
            dataset_split=perplexity_dataset.get("split"),
            dataset_args={"max_length": ppl["max_length"], "stride": ppl["stride"]},
            metric_type="perplexity", metric_name="word perplexity", metric_value=round(ppl["word_perplexity"], 3),
        ))  # fmt: skip
    return evals


def model_index(results, model_name, **kwargs):
    """The `model-index` list (huggingface_hub's `eval_results_to_model_index`); kwargs go to `eval_results`."""
    from huggingface_hub.repocard_data import eval_results_to_model_index

    return eval_results_to_model_index(model_name, eval_results(results, **kwargs))


def model_card_data(results, model_name, eval_kwargs=None, **card_fields):
    """`ModelCardData` carrying the eval results (its `to_dict()` / `to_yaml()` hold `model-index`); other card
    fields (license, tags, base_model, ...) pass through."""
    from huggingface_hub import ModelCardData

    card_fields.setdefault("library_name", "transformers")
    return ModelCardData(model_name=model_name, eval_results=eval_results(results, **(eval_kwargs or {})),
                         **card_fields)  # fmt: skip
