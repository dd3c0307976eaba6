"""Evaluation (issue #5): offline copies of lm-eval's arc_easy, arc_challenge, hellaswag and piqa against lm-eval's
own task code on the same rows, a transformers Llama against its HourglassLlama conversion, sliding-window
perplexity against direct computations, and results to model cards. Tiny models, 20 rows per split, offline."""

import json
import math
import re
import shutil
from pathlib import Path

import pytest
import torch

lm_eval = pytest.importorskip("lm_eval", reason="lm-eval is not installed (pip install 'shapeformers[eval]')")

import datasets  # noqa: E402  (lm-eval depends on it)
from lm_eval import simple_evaluate  # noqa: E402
from lm_eval.api.instance import Instance  # noqa: E402
from lm_eval.models.huggingface import HFLM  # noqa: E402
from lm_eval.tasks import TaskManager  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM  # noqa: E402

from shapeformers.cli import main  # noqa: E402
from shapeformers.eval import cards, harness, perplexity, tasks  # noqa: E402

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
EVAL_DATA = DATA / "eval"
WIKITEXT = DATA / "corpus" / "wikitext-2-raw-v1" / "wiki.test.raw"
TASKS = ("arc_easy", "hellaswag", "piqa", "arc_challenge")
ROWS = 20
# Keys an offline task may set differently from lm-eval's: where the data comes from, nothing else.
DATA_KEYS = {"tag", "dataset_path", "dataset_name", "dataset_kwargs", "training_split"}

if not EVAL_DATA.is_dir():
    pytest.skip(f"eval data not found at {EVAL_DATA}", allow_module_level=True)


def same(a, b):
    """Equal values; functions (lm-eval < 0.4.13 imports a YAML's `!function` afresh each time) by their code."""
    if callable(a) and callable(b) and hasattr(a, "__code__") and hasattr(b, "__code__"):
        return (a.__code__.co_filename, a.__code__.co_code) == (b.__code__.co_filename, b.__code__.co_code)
    return a == b


def read_rows(path, count=ROWS):
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for _, line in zip(range(count), handle)]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """The first ROWS lines of every split file of the four tasks, same layout (<task>/<split>.jsonl)."""
    root = tmp_path_factory.mktemp("eval_data")
    for task in TASKS:
        for source in sorted((EVAL_DATA / task).glob("*.jsonl")):
            (root / task).mkdir(exist_ok=True)
            with open(source, encoding="utf-8") as handle:
                lines = [line for _, line in zip(range(ROWS), handle)]
            (root / task / source.name).write_text("".join(lines), encoding="utf-8")
    return root


def in_memory_dataset(monkeypatch, data_dir):
    """Make `datasets.load_dataset` answer lm-eval's own Hub ids with the same local rows (read with `json`, not
    through the `datasets` JSON builder); the Hub stays untouched. Where the local data has no train split, the
    built-in task (which reads `train` for its few-shot pool even at zero shots) gets the evaluated rows there."""
    real = datasets.load_dataset
    hub_ids = {}
    for task in TASKS:
        config = tasks.builtin_config(task, resolve_functions=False)
        hub_ids[(config["dataset_path"], config.get("dataset_name"))] = task

    def load_dataset(path, name=None, **kwargs):
        task = hub_ids.get((path, name))
        if task is None:
            return real(path, name=name, **kwargs)
        splits = {split: read_rows(file) for split, file in tasks.local_split_files(data_dir, task).items()}
        splits.setdefault("train", splits[tasks.evaluated_split(tasks.builtin_config(task, False))])
        return datasets.DatasetDict({split: datasets.Dataset.from_list(rows) for split, rows in splits.items()})

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)


def load_tasks(task_manager, names):
    """{name: Task} (TaskManager.load from lm-eval 0.4.13, get_task_dict before)."""
    if hasattr(task_manager, "load"):
        return task_manager.load(list(names))["tasks"]
    return lm_eval.tasks.get_task_dict(list(names), task_manager)


def offline_manager(data_dir, folder, names=TASKS, **kwargs):
    tasks.write_offline_tasks(names, data_dir, folder, **kwargs)
    return TaskManager(include_path=str(folder), include_defaults=False)


def builtin_manager(names=TASKS):
    """A TaskManager of lm-eval's own YAML files for `names` (indexing only their folders, not every task)."""
    return TaskManager(include_path=sorted({str(tasks.builtin_yaml(name).parent) for name in names}),
                       include_defaults=False)  # fmt: skip


def offline_tasks(data_dir, folder, names=TASKS, **kwargs):
    return load_tasks(offline_manager(data_dir, folder, names, **kwargs), names)


def builtin_tasks(names=TASKS):
    return load_tasks(builtin_manager(names), names)


def dumped(task):
    """A task's config as lm-eval writes it into results, function addresses left out."""
    return json.loads(re.sub(r" at 0x[0-9a-f]+>", ">", json.dumps(task.dump_config(), default=str)))


def requests(task, num_fewshot=0):
    task.set_config(key="num_fewshot", value=num_fewshot)
    task.set_fewshot_seed(seed=1234)
    task.build_all_requests(rank=0, world_size=1)
    return [(instance.doc_id, instance.idx, instance.arguments) for instance in task.instances]


# Task definitions ------------------------------------------------------------------------------------------------


def test_offline_configs_differ_from_lm_eval_only_in_the_data_source(data_dir, tmp_path):
    paths = tasks.write_offline_tasks(TASKS, data_dir, tmp_path)
    for task in TASKS:
        ours = tasks.load_task_yaml(paths[task])
        builtin = tasks.builtin_config(task)
        differ = {key for key in set(ours) | set(builtin) if not same(ours.get(key), builtin.get(key))}
        assert differ <= DATA_KEYS, (task, differ - DATA_KEYS)
        assert ours["task"] == task and ours["dataset_path"] == "json" and ours["dataset_name"] is None
        for split, file in ours["dataset_kwargs"]["data_files"].items():
            assert Path(file).is_absolute() and Path(file) == data_dir / task / f"{split}.jsonl"
        has_train = (data_dir / task / "train.jsonl").exists()
        assert ("training_split" in differ) == (not has_train)
        assert ours["training_split"] == ("train" if has_train else None)
    # HellaSwag's preprocessing is lm-eval's own function, not a copy.
    ours = tasks.load_task_yaml(paths["hellaswag"])
    from lm_eval.tasks.hellaswag import utils as hellaswag_utils

    defined_in = Path(ours["process_docs"].__code__.co_filename).resolve()
    assert defined_in == Path(hellaswag_utils.__file__).resolve()
    assert ours["process_docs"].__code__.co_code == hellaswag_utils.process_docs.__code__.co_code


def test_offline_and_builtin_tasks_build_identical_requests(data_dir, tmp_path, monkeypatch):
    in_memory_dataset(monkeypatch, data_dir)
    ours, theirs = offline_tasks(data_dir, tmp_path), builtin_tasks()
    for task in TASKS:
        a, b = ours[task], theirs[task]
        assert a.config.dataset_path == "json" and b.config.dataset_path != "json"
        config_a, config_b = dumped(a), dumped(b)
        differ = {key for key in set(config_a) | set(config_b) if config_a.get(key) != config_b.get(key)}
        assert differ <= DATA_KEYS | {"metadata"}, (task, differ)
        assert list(a.eval_docs) == list(b.eval_docs) and len(a.eval_docs) == ROWS
        assert [a.doc_to_target(doc) for doc in a.eval_docs] == [b.doc_to_target(doc) for doc in b.eval_docs]
        zero_shot = requests(a)
        assert zero_shot == requests(b), task
        assert len(zero_shot) >= 2 * ROWS and all(len(arguments) == 2 for _, _, arguments in zero_shot)
    # ARC has its train split locally, so lm-eval's few-shot sampling is reproduced too.
    for task in ("arc_easy", "arc_challenge"):
        shots = requests(ours[task], num_fewshot=2)
        assert shots == requests(theirs[task], num_fewshot=2)
        assert shots[0][2][0].count("Question:") == 3


def test_fewshot_without_the_train_split_is_refused_or_explicit(data_dir):
    with pytest.raises(tasks.OfflineTaskError, match="--fewshot-split"):
        tasks.offline_task_config("hellaswag", data_dir, num_fewshot=5)
    assert tasks.offline_task_config("hellaswag", data_dir, num_fewshot=0)["training_split"] is None
    config = tasks.offline_task_config("piqa", data_dir, num_fewshot=5, fewshot_split="validation")
    # The evaluated rows are declared test_split, so that lm-eval keeps each one out of its own shots.
    assert (config["fewshot_split"], config["test_split"], config["validation_split"]) == ("validation",) * 2 + (None,)
    # ARC has lm-eval's train split here: its shots stay lm-eval's own, whatever split is named for the others.
    assert "fewshot_split" not in tasks.offline_task_config("arc_easy", data_dir, num_fewshot=5)
    arc = tasks.offline_task_config("arc_easy", data_dir, num_fewshot=5, fewshot_split="validation")
    assert arc == tasks.offline_task_config("arc_easy", data_dir, num_fewshot=0)
    assert "differs_from_lm_eval" not in tasks.data_provenance(["arc_easy"], data_dir, 5, "validation")["arc_easy"]
    provenance = tasks.data_provenance(["piqa"], data_dir, num_fewshot=5, fewshot_split="validation")["piqa"]
    assert "differs_from_lm_eval" in provenance and provenance["hub_dataset"]["split"] == "validation"
    missing = data_dir.parent / "missing_test"
    (missing / "arc_easy").mkdir(parents=True)
    shutil.copy(data_dir / "arc_easy" / "train.jsonl", missing / "arc_easy")
    with pytest.raises(tasks.OfflineTaskError, match="'test'"):
        tasks.offline_task_config("arc_easy", missing)
    with pytest.raises(ValueError, match="only applies to local data"):
        harness.evaluate("unused", ["piqa"], fewshot_split="validation")


# Models ------------------------------------------------------------------------------------------------------------


def train_tokenizer(text, vocab_size=320):
    """A small byte-level BPE tokenizer, as shapeformers.training.data trains one."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<s>", "</s>", "<pad>"],
                                  initial_alphabet=alphabet, show_progress=False)  # fmt: skip
    tokenizer.train_from_iterator(text.splitlines(keepends=True), trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", pad_token="<pad>")


def save_tokenizer(tokenizer, folder):
    tokenizer.save_pretrained(folder)
    path = Path(folder) / "tokenizer_config.json"
    config = json.loads(path.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"  # loadable by transformers 4.x too
    path.write_text(json.dumps(config, indent=2))


def hourglass_from_llama(llama_folder, destination):
    """HourglassLlama with K = 1 from a Llama folder's weights: what `convert` does, if it cannot be imported."""
    import shapeformers

    llama = LlamaForCausalLM.from_pretrained(llama_folder)
    fields = {key: value for key, value in llama.config.to_dict().items()
              if key not in ("architectures", "model_type", "transformers_version", "auto_map")}  # fmt: skip
    model = shapeformers.HourglassLlamaForCausalLM(shapeformers.HourglassLlamaConfig(**fields, num_mlp_layers=1))
    renamed = {}
    for name, tensor in llama.state_dict().items():
        name = re.sub(r"\.mlp\.", ".mlp.0.", name)
        name = name.replace("post_attention_layernorm.weight", "post_attention_layernorm.0.weight")
        renamed[name] = tensor
    model.load_state_dict(renamed, strict=True)
    model.save_pretrained(destination)
    save_tokenizer(AutoTokenizer.from_pretrained(llama_folder), destination)


@pytest.fixture(scope="module")
def models(data_dir, tmp_path_factory):
    """{"llama": folder, "hourglass": folder}: a tiny random Llama with a BPE tokenizer trained on the eval text,
    and its HourglassLlama (K = 1) conversion."""
    root = tmp_path_factory.mktemp("models")
    text = "".join(path.read_text(encoding="utf-8") for path in sorted(data_dir.glob("*/*.jsonl")))
    tokenizer = train_tokenizer(text)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=56, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=1024, initializer_range=0.2, tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    llama_folder, hourglass_folder = root / "llama", root / "hourglass"
    LlamaForCausalLM(config).save_pretrained(llama_folder)
    save_tokenizer(tokenizer, llama_folder)
    try:
        from shapeformers.conversion import convert
    except ImportError:
        hourglass_from_llama(llama_folder, hourglass_folder)
    else:
        convert(llama_folder, hourglass_folder)
    assert json.loads((hourglass_folder / "config.json").read_text())["model_type"] == "hourglass_llama"
    return {"llama": llama_folder, "hourglass": hourglass_folder}


def scores(results, task):
    return {metric: results["results"][task][f"{metric},none"] for metric in ("acc", "acc_norm")}


def test_offline_and_builtin_tasks_score_the_same(models, data_dir, tmp_path, monkeypatch):
    in_memory_dataset(monkeypatch, data_dir)
    lm = HFLM(pretrained=str(models["hourglass"]), trust_remote_code=True, device="cpu", batch_size=8)
    runs = {}
    for name, manager in (("ours", offline_manager(data_dir, tmp_path)), ("builtin", builtin_manager())):
        task_objects = load_tasks(manager, TASKS)
        runs[name] = simple_evaluate(model=lm, tasks=[task_objects[task] for task in TASKS], bootstrap_iters=0,
                                     log_samples=True, task_manager=manager)  # fmt: skip
    for task in TASKS:
        assert scores(runs["ours"], task) == scores(runs["builtin"], task), task
        assert runs["ours"]["n-samples"][task]["effective"] == ROWS
        ours = [sample["resps"] for sample in runs["ours"]["samples"][task]]
        assert ours == [sample["resps"] for sample in runs["builtin"]["samples"][task]]


def test_llama_and_its_hourglass_conversion_score_the_same(models, data_dir, tmp_path, capsys):
    llama = harness.evaluate(models["llama"], TASKS, data_dir=data_dir, batch_size=8, bootstrap_iters=0,
                             log_samples=True, progress=False)  # fmt: skip
    output = tmp_path / "hourglass.json"
    main(["eval", str(models["hourglass"]), "--tasks", ",".join(TASKS), "--data-dir", str(data_dir),
          "--batch-size", "8", "--bootstrap-iters", "0", "--log-samples", "--output", str(output)])  # fmt: skip
    hourglass = json.loads(output.read_text())
    assert "| arc_easy | 0 | 20 |" in capsys.readouterr().out
    for task in TASKS:
        assert scores(hourglass, task) == scores(llama, task), task
        for a, b in zip(llama["samples"][task], hourglass["samples"][task], strict=True):
            assert [r[0][0] for r in a["resps"]] == pytest.approx([r[0][0] for r in b["resps"]], rel=1e-5)
    # lm-eval's structure, plus the model's own accounting from its config.
    for key in ("results", "configs", "versions", "n-shot", "higher_is_better", "n-samples", "config"):
        assert key in hourglass
    assert hourglass["configs"]["hellaswag"]["dataset_path"] == "json"
    extra = hourglass["shapeformers"]
    assert extra["num_parameters"] == AutoModelForCausalLM.from_pretrained(models["hourglass"]).num_parameters()
    assert extra["flops_per_token"] > 0 and extra["flops_seq_len"] == 1024
    assert extra["kv_cache_bytes_per_token"] == 2 * 2 * 8 * 2 * 4  # K and V, 2 kv heads x 8, 2 layers, float32
    piqa = extra["data"]["piqa"]["files"]["validation"]
    assert piqa["sha256"] == tasks.sha256(data_dir / "piqa" / "validation.jsonl")
    assert "num_parameters" not in llama["shapeformers"]  # a Llama config has no accounting methods


# Perplexity --------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def loaded(models):
    model = AutoModelForCausalLM.from_pretrained(models["hourglass"], trust_remote_code=True).eval()
    return model, AutoTokenizer.from_pretrained(models["hourglass"])


def wikitext_sample(characters=1000):
    return WIKITEXT.read_text(encoding="utf-8")[:characters]


def test_perplexity_agrees_with_direct_computation(loaded):
    model, tokenizer = loaded
    text = wikitext_sample()
    ids = [tokenizer.bos_token_id] + tokenizer(text, add_special_tokens=False)["input_ids"]
    assert len(ids) < 1024
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0]
    nll = torch.nn.functional.cross_entropy(logits[:-1].double(), torch.tensor(ids[1:]), reduction="sum").item()
    result = perplexity.perplexity(model, tokenizer, text, max_length=1024, progress=False)
    assert result["tokens"] == len(ids) - 1
    assert result["nll"] == pytest.approx(nll, rel=1e-5)
    assert result["token_perplexity"] == pytest.approx(math.exp(nll / (len(ids) - 1)), rel=1e-5)
    words = len(re.split(r"\s+", text))  # lm-eval's wikitext word count
    assert result["words"] == words and result["word_perplexity"] == pytest.approx(math.exp(nll / words), rel=1e-5)
    assert result["bits_per_byte"] == pytest.approx(nll / len(text.encode()) / math.log(2), rel=1e-5)

    # Sliding windows: each token scored once, from the context its window gives it, computed one token at a time.
    text = text[:300]
    ids = [tokenizer.bos_token_id] + tokenizer(text, add_special_tokens=False)["input_ids"]
    max_length, stride = 24, 8
    expected = 0.0
    with torch.no_grad():
        for target in range(1, len(ids)):
            end = min(1 + ((target - 1) // stride + 1) * stride, len(ids))
            start = max(0, end - 1 - max_length)
            log_probs = model(torch.tensor([ids[start:target]])).logits[0, -1].double().log_softmax(-1)
            expected -= log_probs[ids[target]].item()
    windowed = perplexity.perplexity(model, tokenizer, text, max_length=max_length, stride=stride, batch_size=3,
                                     progress=False)  # fmt: skip
    assert windowed["tokens"] == len(ids) - 1 and windowed["nll"] == pytest.approx(expected, rel=1e-5)
    full = perplexity.perplexity(model, tokenizer, text, max_length=1024, progress=False)
    assert windowed["nll"] != pytest.approx(full["nll"], rel=1e-6)  # the windows do cut the context


def test_perplexity_with_stride_max_length_is_lm_evals_rolling_loglikelihood(loaded):
    model, tokenizer = loaded
    text = wikitext_sample()
    lm = HFLM(pretrained=model, tokenizer=tokenizer, max_length=32, batch_size=4)
    request = Instance(request_type="loglikelihood_rolling", doc={}, arguments=(text,), idx=0)
    (loglikelihood,) = lm.loglikelihood_rolling([request], disable_tqdm=True)
    result = perplexity.perplexity(model, tokenizer, text, max_length=32, batch_size=4, progress=False)
    assert result["stride"] == 32 and result["nll"] == pytest.approx(-loglikelihood, rel=1e-5)


def test_eval_perplexity_option(models, tmp_path):
    text = tmp_path / "sample.txt"
    text.write_text(wikitext_sample(800), encoding="utf-8")
    output = tmp_path / "ppl.json"
    main(["eval", str(models["hourglass"]), "--perplexity", str(text), "--max-length", "64", "--stride", "32",
          "--output", str(output)])  # fmt: skip
    result = json.loads(output.read_text())
    assert "results" not in result and result["perplexity"]["stride"] == 32
    assert result["perplexity"]["max_length"] == 64 and result["perplexity"]["sha256"] == tasks.sha256(text)
    assert result["shapeformers"]["flops_seq_len"] == 64


# Cards -------------------------------------------------------------------------------------------------------------

RESULTS = {
    "results": {
        "arc_easy": {"alias": "arc_easy", "acc,none": 0.25, "acc_stderr,none": 0.01, "acc_norm,none": 0.3,
                     "acc_norm_stderr,none": 0.0095},
        "hellaswag": {"alias": "hellaswag", "acc,none": 0.2612, "acc_stderr,none": "N/A", "acc_norm,none": 0.27,
                      "acc_norm_stderr,none": "N/A"},
    },
    "configs": {"arc_easy": {"dataset_path": "json", "test_split": "test"},
                "hellaswag": {"dataset_path": "Rowan/hellaswag", "dataset_name": None,
                              "validation_split": "validation"}},
    "n-shot": {"arc_easy": 0, "hellaswag": 10},
    "n-samples": {"arc_easy": {"original": 2376, "effective": 2376},
                  "hellaswag": {"original": 10042, "effective": 10042}},
    "shapeformers": {
        "num_parameters": 260032, "flops_per_token": 1174016, "flops_seq_len": 512, "kv_cache_bytes_per_token": 1280,
        "kv_cache_dtype": "float32", "versions": {"lm_eval": "0.4.13"},
        "data": {"arc_easy": {"source": "local", "hub_dataset": {"path": "allenai/ai2_arc", "name": "ARC-Easy",
                                                                 "split": "test"}}},
    },
}  # fmt: skip


def test_markdown_table():
    table = cards.markdown_table(RESULTS)
    lines = table.splitlines()
    assert lines[0] == "| Task | Shots | Docs | acc (%) | acc_norm (%) |"
    assert lines[2] == "| arc_easy | 0 | 2376 | 25.00 ± 1.00 | 30.00 ± 0.95 |"
    assert lines[3] == "| hellaswag | 10 | 10042 | 26.12 | 27.00 |"
    assert "parameters 260,032" in table and "1,280 bytes/token (float32)" in table
    assert "| arc_easy | 0 | 2376 | 0.2500 ± 0.0100 |" in cards.markdown_table(RESULTS, percent=False)


def test_model_index_through_huggingface_hub():
    from huggingface_hub import ModelCard
    from huggingface_hub.repocard_data import model_index_to_eval_results

    index = cards.model_index(RESULTS, "tiny-hourglass")
    assert index[0]["name"] == "tiny-hourglass"
    arc, hellaswag = index[0]["results"]
    # Offline runs point at the Hub dataset lm-eval's own task reads.
    assert arc["dataset"] == {"name": "ARC-Easy", "type": "allenai/ai2_arc", "config": "ARC-Easy", "split": "test",
                              "args": {"num_few_shot": 0}}  # fmt: skip
    assert [(m["type"], m["value"]) for m in arc["metrics"]] == [("acc", 25.0), ("acc_norm", 30.0)]
    assert hellaswag["dataset"]["type"] == "Rowan/hellaswag" and hellaswag["dataset"]["split"] == "validation"
    assert hellaswag["dataset"]["args"] == {"num_few_shot": 10}
    assert arc["source"]["name"] == "lm-evaluation-harness 0.4.13"

    data = cards.model_card_data(RESULTS, "tiny-hourglass", license="apache-2.0")
    assert data.to_dict()["model-index"] == index
    card = ModelCard(f"---\n{data.to_yaml()}\n---\n\n# tiny-hourglass\n\n{cards.markdown_table(RESULTS)}\n")
    assert card.data.to_dict()["model-index"] == index  # the card parses back to the same metadata
    name, results = model_index_to_eval_results(index)
    assert name == "tiny-hourglass" and len(results) == 4


def test_eval_with_a_peft_adapter_scores_as_the_merged_model(models, data_dir, tmp_path):
    from peft import LoraConfig, PeftModel, get_peft_model

    base = AutoModelForCausalLM.from_pretrained(models["hourglass"], trust_remote_code=True)
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"], init_lora_weights=False)
    get_peft_model(base, lora).save_pretrained(tmp_path / "adapter")
    merged = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(models["hourglass"], trust_remote_code=True), tmp_path / "adapter"
    ).merge_and_unload()
    merged.save_pretrained(tmp_path / "merged")
    AutoTokenizer.from_pretrained(models["hourglass"]).save_pretrained(tmp_path / "merged")

    def loglikelihoods(model, **kwargs):
        results = harness.evaluate(model, ["piqa"], data_dir=data_dir, limit=8, batch_size=8, bootstrap_iters=0,
                                   log_samples=True, **kwargs)  # fmt: skip
        return results, [r[0][0] for sample in results["samples"]["piqa"] for r in sample["resps"]]

    adapted, with_adapter = loglikelihoods(models["hourglass"], peft=tmp_path / "adapter")
    assert adapted["config"]["model_args"]["peft"] == str(tmp_path / "adapter")
    assert with_adapter == pytest.approx(loglikelihoods(tmp_path / "merged")[1], rel=1e-5)
    assert with_adapter != pytest.approx(loglikelihoods(models["hourglass"])[1], rel=1e-3)


def test_eval_bowtieformer_reports_its_own_accounting(models, data_dir, tmp_path):
    import shapeformers

    tokenizer = AutoTokenizer.from_pretrained(models["llama"])
    config = shapeformers.BowtieFormerConfig(
        vocab_size=len(tokenizer), hidden_size=64, num_hidden_layers=4, num_attention_heads=4, quantize_to=8,
        max_position_embeddings=256, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    torch.manual_seed(0)
    model = shapeformers.BowtieFormerForCausalLM(config)
    model.save_pretrained(tmp_path / "bowtie")
    save_tokenizer(tokenizer, tmp_path / "bowtie")
    text = tmp_path / "sample.txt"
    text.write_text(wikitext_sample(600), encoding="utf-8")
    output = tmp_path / "bowtie.json"
    main(["eval", str(tmp_path / "bowtie"), "--tasks", "piqa", "--limit", "8", "--data-dir", str(data_dir),
          "--perplexity", str(text), "--bootstrap-iters", "0", "--output", str(output)])  # fmt: skip
    result = json.loads(output.read_text())
    extra = result["shapeformers"]
    assert extra["model_type"] == "bowtieformer" and extra["num_parameters"] == model.num_parameters()
    assert extra["flops_per_token"] == config.flops_per_token(256)
    assert extra["kv_cache_bytes_per_token"] == config.kv_cache_bytes_per_token(torch.float32)
    assert result["n-samples"]["piqa"]["effective"] == 8 and math.isfinite(result["perplexity"]["word_perplexity"])
