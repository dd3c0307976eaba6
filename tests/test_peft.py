"""PEFT LoRA on both architectures, as on a Llama: Llama's target names (every projection of every layer, the
hourglass sub-MLPs and BowtieFormer layers of any width included) and "all-linear"; training lowers the loss; the
adapter reloads through PeftModel and AutoPeftModelForCausalLM (also in a Python without shapeformers); a merged
model saves as a folder that reloads through remote code with the same logits; LoRA in the Trainer with gradient
checkpointing; sequence classification."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from peft import (
    AutoPeftModelForCausalLM,
    AutoPeftModelForSequenceClassification,
    LoraConfig,
    PeftModel,
    get_peft_model,
)
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

import shapeformers
from shapeformers.training.data import encode, read_corpus

from .test_pipelines import MODEL_TYPES, save_bundle, tiny_model, tiny_tokenizer

# The README's recipe: Llama's projection names match every layer of both architectures.
LLAMA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
HOURGLASS_SUB_MLPS = r".*\.mlp\.\d+\.(gate|up|down)_proj"  # the K sub-MLPs of every layer, nothing else


def lora_config(**overrides):
    return LoraConfig(**dict(dict(r=4, lora_alpha=8, target_modules=LLAMA_TARGETS, task_type="CAUSAL_LM"), **overrides))


def training_batch(batch_size=2, seq_len=24):
    ids = encode(tiny_tokenizer(), read_corpus()[:4000])
    return torch.stack([ids[i * seq_len : (i + 1) * seq_len] for i in range(batch_size)])


def train(model, batch, steps=4, lr=1e-2, labels=None):
    """A few AdamW steps on one batch; returns the losses."""
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    model.train()
    losses = []
    for _ in range(steps):
        loss = model(input_ids=batch, labels=batch if labels is None else labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    model.eval()
    return losses


def lora_wrapped(model):
    """Names (in the base model) of the modules LoRA wrapped."""
    prefix = "base_model.model."
    return {name.removeprefix(prefix) for name, module in model.named_modules() if hasattr(module, "lora_A")}


@pytest.mark.parametrize("model_type", MODEL_TYPES)
@pytest.mark.parametrize("targets", ["llama-names", "all-linear"])
def test_llama_names_and_all_linear_target_every_projection(model_type, targets):
    model = tiny_model(model_type)
    linear = {name for name, module in model.named_modules() if isinstance(module, nn.Linear)} - {"lm_head"}
    target_modules = "all-linear" if targets == "all-linear" else LLAMA_TARGETS
    peft_model = get_peft_model(model, lora_config(target_modules=target_modules))
    assert lora_wrapped(peft_model) == linear
    per_layer = {"hourglass_llama": 4 + 3 * model.config.num_mlp_layers, "bowtieformer": 7}[model_type]
    assert len(linear) == per_layer * model.config.num_hidden_layers
    # Each adapter is as wide as its own layer: BowtieFormer layers of every width get one.
    for layer in peft_model.base_model.model.model.layers:
        width = layer.input_layernorm.weight.shape[0]
        assert layer.self_attn.q_proj.lora_A["default"].in_features == width
        assert layer.self_attn.o_proj.lora_B["default"].out_features == width


def test_a_regex_targets_the_hourglass_sub_mlps():
    model = tiny_model("hourglass_llama")
    peft_model = get_peft_model(model, lora_config(target_modules=HOURGLASS_SUB_MLPS))
    config = model.config
    expected = {f"model.layers.{i}.mlp.{k}.{name}" for i in range(config.num_hidden_layers)
                for k in range(config.num_mlp_layers) for name in ("gate_proj", "up_proj", "down_proj")}  # fmt: skip
    assert lora_wrapped(peft_model) == expected


@pytest.fixture(scope="module")
def adapters(tmp_path_factory):
    """{model_type: (base folder, adapter folder, losses, input_ids, logits)}: a LoRA trained a few steps on each
    architecture, saved, with the trained PeftModel's logits."""
    made = {}
    for model_type in MODEL_TYPES:
        root = tmp_path_factory.mktemp(f"lora-{model_type}")
        base_folder = save_bundle(tiny_model(model_type), root / "base")
        peft_model = get_peft_model(AutoModelForCausalLM.from_pretrained(base_folder), lora_config())
        batch = training_batch()
        losses = train(peft_model, batch)
        peft_model.save_pretrained(root / "adapter")
        with torch.no_grad():
            logits = peft_model(batch).logits
        made[model_type] = (base_folder, root / "adapter", losses, batch, logits)
    return made


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_lora_trains_saves_reloads_and_merges(adapters, model_type, tmp_path):
    base_folder, adapter_folder, losses, batch, logits = adapters[model_type]
    assert losses[-1] < losses[0] - 0.05, losses
    adapter_config = json.loads((adapter_folder / "adapter_config.json").read_text())
    assert adapter_config["base_model_name_or_path"] == str(base_folder)
    saved = load_file(adapter_folder / "adapter_model.safetensors")
    assert saved and all("lora_" in name for name in saved)  # the adapter only, no base weights

    with torch.no_grad():
        reloaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_folder), adapter_folder).eval()
        assert torch.equal(reloaded(batch).logits, logits)
        auto = AutoPeftModelForCausalLM.from_pretrained(adapter_folder, trust_remote_code=True).eval()
        assert torch.equal(auto(batch).logits, logits)
        # Generation goes through PEFT's wrapper of prepare_inputs_for_generation.
        prompt = batch[:1, :5]
        generated = auto.generate(input_ids=prompt, max_new_tokens=6, min_new_tokens=6, do_sample=False)

        merged = auto.merge_and_unload()
        assert type(merged).__name__ == type(tiny_model(model_type)).__name__  # a plain model again, no LoRA
        assert torch.allclose(merged(batch).logits, logits, atol=1e-5, rtol=0)
        merged.save_pretrained(tmp_path / "merged")
        again = AutoModelForCausalLM.from_pretrained(tmp_path / "merged", trust_remote_code=True).eval()
        assert torch.equal(again(batch).logits, merged(batch).logits)
        assert torch.equal(again.generate(prompt, max_new_tokens=6, min_new_tokens=6, do_sample=False), generated)
    assert json.loads((tmp_path / "merged" / "config.json").read_text())["auto_map"]


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_lora_with_the_trainer_and_gradient_checkpointing(model_type, tmp_path):
    from transformers import Trainer, TrainingArguments  # see test_trainer.py: not at module level

    base_folder = save_bundle(tiny_model(model_type), tmp_path / "base")
    model = AutoModelForCausalLM.from_pretrained(base_folder)
    peft_model = get_peft_model(model, lora_config(target_modules="all-linear"))
    frozen = {name: p.detach().clone() for name, p in peft_model.named_parameters() if not p.requires_grad}
    dataset = [{"input_ids": row, "labels": row} for row in training_batch(batch_size=8, seq_len=16)]
    arguments = TrainingArguments(output_dir=str(tmp_path / "run"), max_steps=3, per_device_train_batch_size=4,
                                  learning_rate=1e-2, gradient_checkpointing=True, save_strategy="no", report_to=[],
                                  use_cpu=True, disable_tqdm=True)  # fmt: skip
    Trainer(model=peft_model, args=arguments, train_dataset=dataset).train()
    assert peft_model.base_model.model.model.gradient_checkpointing
    # LoRA's B matrices start at zero: gradients reached every one of them through the checkpointed layers.
    lora_b = {name: p for name, p in peft_model.named_parameters() if "lora_B" in name}
    assert lora_b and all(p.abs().max() > 0 for p in lora_b.values())
    for name, parameter in peft_model.named_parameters():
        if name in frozen:
            assert torch.equal(parameter, frozen[name]), name


# Runs in a fresh interpreter in which `import shapeformers` fails: the adapter's base model loads from its own code.
REMOTE_PEFT_SCRIPT = textwrap.dedent(
    """
    import sys
    sys.modules["shapeformers"] = None
    import torch
    from peft import AutoPeftModelForCausalLM
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    for adapter, expected_path, merged_folder in zip(*[iter(sys.argv[1:])] * 3):
        expected = load_file(expected_path)
        model = AutoPeftModelForCausalLM.from_pretrained(adapter, trust_remote_code=True).eval()
        base = model.get_base_model()
        assert type(base).__module__.startswith("transformers_modules"), type(base)
        with torch.no_grad():
            assert torch.equal(model(expected["input_ids"]).logits, expected["logits"]), adapter
            merged = model.merge_and_unload()
            assert torch.allclose(merged(expected["input_ids"]).logits, expected["logits"], atol=1e-5, rtol=0)
            merged.save_pretrained(merged_folder)
            again = AutoModelForCausalLM.from_pretrained(merged_folder, trust_remote_code=True).eval()
            assert torch.equal(again(expected["input_ids"]).logits, merged(expected["input_ids"]).logits)
    print("remote PEFT OK")
    """
)


def test_adapter_loads_and_merges_without_shapeformers(adapters, tmp_path):
    arguments = []
    for model_type, (_, adapter_folder, _, batch, logits) in adapters.items():
        save_file({"input_ids": batch, "logits": logits}, tmp_path / f"{model_type}.safetensors")
        arguments += [str(adapter_folder), str(tmp_path / f"{model_type}.safetensors"), str(tmp_path / model_type)]
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_MODULES_CACHE=str(tmp_path / "modules"))
    result = subprocess.run([sys.executable, "-c", REMOTE_PEFT_SCRIPT, *arguments], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=600)  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    assert "remote PEFT OK" in result.stdout
    for model_type in MODEL_TYPES:  # the merged folders are remote-code bundles again
        assert (tmp_path / model_type / f"modeling_{model_type}.py").is_file()


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_lora_sequence_classification(model_type, tmp_path):
    if model_type == "bowtieformer" and not hasattr(shapeformers, "BowtieFormerForSequenceClassification"):
        pytest.skip("BowtieFormer has no sequence-classification head yet")
    base_folder = save_bundle(tiny_model(model_type), tmp_path / "base")
    model = AutoModelForSequenceClassification.from_pretrained(base_folder, num_labels=2)
    peft_model = get_peft_model(model, lora_config(task_type="SEQ_CLS"))
    assert any(name.endswith("score.modules_to_save.default.weight") for name, p in peft_model.named_parameters()
               if p.requires_grad)  # fmt: skip  (the new head trains in full, and is saved with the adapter)

    tokenizer = tiny_tokenizer()
    texts = ["The while statement is used", "Lambda forms", "Boolean operations and comparisons", "Slicings"]
    inputs = tokenizer(texts, return_tensors="pt", padding=True)  # right padding; the model finds the last token
    labels = torch.tensor([0, 1, 0, 1])
    optimizer = torch.optim.AdamW([p for p in peft_model.parameters() if p.requires_grad], lr=1e-2)
    peft_model.train()
    losses = []
    for _ in range(6):
        loss = peft_model(**inputs, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < losses[0], losses

    peft_model.eval().save_pretrained(tmp_path / "adapter")
    with torch.no_grad():
        logits = peft_model(**inputs).logits
        reloaded = AutoPeftModelForSequenceClassification.from_pretrained(
            tmp_path / "adapter", num_labels=2, trust_remote_code=True
        ).eval()
        assert torch.equal(reloaded(**inputs).logits, logits)
