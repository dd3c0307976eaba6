"""`pipeline("text-generation")` and streaming for both architectures, as for a Llama: from a folder, by repo id from
a local Hub cache in a Python without shapeformers, with TextStreamer and TextIteratorStreamer. Also the helpers the
other integration tests share: a tiny byte-level BPE tokenizer and tiny models whose vocabulary is the tokenizer's."""

import functools
import json
import os
import subprocess
import sys
import textwrap
import threading

import pytest
import torch
from transformers import GenerationConfig, TextIteratorStreamer, TextStreamer, pipeline

from shapeformers import BowtieFormerForCausalLM, HourglassLlamaForCausalLM
from shapeformers.tokenization import save_tokenizer
from shapeformers.training.data import read_corpus, train_tokenizer

from .conftest import tiny_hourglass_config
from .test_bowtieformer_config import tiny_bowtie_config
from .test_save_load import hub_cache

MODEL_TYPES = ("hourglass_llama", "bowtieformer")
PROMPT = "The while statement is used"
NEW_TOKENS = 12


@functools.lru_cache(maxsize=1)
def tiny_tokenizer():
    """A 320-token byte-level BPE tokenizer trained on a slice of Python's topic help (every machine has it)."""
    return train_tokenizer(read_corpus()[:20000], 320)


def tiny_model(model_type, seed=0, **overrides):
    """A tiny model of `model_type` with the tokenizer's vocabulary and special tokens: HourglassLlama with K = 3
    unequal sub-MLPs, QK-norm and GQA; BowtieFormer with widths 96 64 40 32 16 96 and GQA."""
    tokenizer = tiny_tokenizer()
    fields = dict(vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                  pad_token_id=tokenizer.pad_token_id, **overrides)  # fmt: skip
    torch.manual_seed(seed)
    if model_type == "hourglass_llama":
        return HourglassLlamaForCausalLM(tiny_hourglass_config(**fields)).eval()
    return BowtieFormerForCausalLM(tiny_bowtie_config(**dict({"num_key_value_heads": 2}, **fields))).eval()


def save_bundle(model, folder):
    """What a user publishes: save_pretrained (weights, code, generation config) plus the tokenizer."""
    model.save_pretrained(folder)
    save_tokenizer(tiny_tokenizer(), folder)
    return folder


@pytest.fixture(params=MODEL_TYPES)
def bundle(request, tmp_path):
    """(folder, model): a tiny model of each architecture saved with its tokenizer."""
    model = tiny_model(request.param)
    return save_bundle(model, tmp_path / request.param), model


def greedy_text(model, prompt=PROMPT, new_tokens=NEW_TOKENS):
    """Prompt and continuation as the model generates them greedily, decoded."""
    tokenizer = tiny_tokenizer()
    inputs = tokenizer(prompt, return_tensors="pt")  # on transformers 4.x with token_type_ids, which generate() rejects
    with torch.no_grad():
        tokens = model.generate(inputs.input_ids, attention_mask=inputs.attention_mask, max_new_tokens=new_tokens,
                                min_new_tokens=new_tokens, do_sample=False)  # fmt: skip
    return tokenizer.decode(tokens[0], skip_special_tokens=True)


def test_bundle_has_a_generation_config_and_a_tokenizer_4x_can_load(bundle):
    folder, model = bundle
    generation_config = GenerationConfig.from_pretrained(folder)
    tokenizer = tiny_tokenizer()
    assert (generation_config.bos_token_id, generation_config.eos_token_id, generation_config.pad_token_id) == (
        tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id)  # fmt: skip
    # transformers 5 writes `TokenizersBackend`, a class 4.x does not have; the matrix run loads it on 4.57.
    assert json.loads((folder / "tokenizer_config.json").read_text())["tokenizer_class"] == "PreTrainedTokenizerFast"


def test_pipeline_from_a_folder_generates_what_the_model_generates(bundle):
    folder, model = bundle
    generator = pipeline("text-generation", model=str(folder), trust_remote_code=True)
    assert type(generator.model).__name__ == type(model).__name__
    options = dict(max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False)
    assert generator(PROMPT, **options)[0]["generated_text"] == greedy_text(model)
    # Batched: transformers 5's pipeline pads on the left (4.x uses the tokenizer's side, right here, as for a Llama).
    batch = generator([PROMPT, "Lambda forms"], batch_size=2, **options)
    assert [result[0]["generated_text"] for result in batch] == [greedy_text(model), greedy_text(model, "Lambda forms")]


def test_streamers_yield_the_generated_text(bundle, capsys):
    _, model = bundle
    tokenizer = tiny_tokenizer()
    generator = pipeline("text-generation", model=model, tokenizer=tokenizer)
    options = dict(max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False, return_full_text=False)
    expected = generator(PROMPT, **options)[0]["generated_text"]
    assert PROMPT + expected == greedy_text(model)

    capsys.readouterr()
    generator(PROMPT, streamer=TextStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True), **options)
    assert capsys.readouterr().out == expected + "\n"  # TextStreamer ends the stream with a newline

    streamer = TextIteratorStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True, timeout=120)
    thread = threading.Thread(target=generator, args=(PROMPT,), kwargs=dict(streamer=streamer, **options))
    thread.start()
    pieces = list(streamer)
    thread.join()
    assert len(pieces) > 1 and "".join(pieces) == expected


# Runs in a fresh interpreter in which `import shapeformers` fails.
REMOTE_PIPELINE_SCRIPT = textwrap.dedent(
    """
    import json, sys
    sys.modules["shapeformers"] = None
    from transformers import pipeline

    for case in json.loads(sys.argv[1]):
        for source in (case["folder"], case["repo_id"]):
            generator = pipeline("text-generation", model=source, trust_remote_code=True)
            assert type(generator.model).__module__.startswith("transformers_modules"), type(generator.model)
            text = generator(case["prompt"], max_new_tokens=case["new_tokens"], min_new_tokens=case["new_tokens"],
                             do_sample=False)[0]["generated_text"]
            assert text == case["expected"], (source, text, case["expected"])
    print("remote pipelines OK")
    """
)


@pytest.mark.matrix
def test_pipeline_by_repo_id_without_shapeformers(tmp_path):
    cases = []
    for model_type in MODEL_TYPES:
        model = tiny_model(model_type)
        folder = save_bundle(model, tmp_path / model_type)
        repo_id = f"shapeformers-test/pipeline-{model_type}"
        hub = hub_cache(tmp_path, folder, repo_id)
        cases.append(dict(folder=str(folder), repo_id=repo_id, prompt=PROMPT, new_tokens=NEW_TOKENS,
                          expected=greedy_text(model)))  # fmt: skip
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(hub), HF_MODULES_CACHE=str(tmp_path / "modules"))
    result = subprocess.run([sys.executable, "-c", REMOTE_PIPELINE_SCRIPT, json.dumps(cases)], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=600)  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    assert "remote pipelines OK" in result.stdout
