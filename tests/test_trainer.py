"""Training and inference machinery on both architectures, as on a Llama: transformers' Trainer with gradient
checkpointing (the loss goes down, a checkpoint resumes to the same weights), `accelerate launch` data parallelism on
CPU (gloo) whose first step equals one process on the whole batch, `device_map="auto"` offloading to disk, bf16."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from shapeformers.training.data import encode, read_corpus

from .test_pipelines import MODEL_TYPES, save_bundle, tiny_model, tiny_tokenizer

DDP_SCRIPT = Path(__file__).with_name("accelerate_ddp_step.py")


@pytest.fixture(params=MODEL_TYPES)
def folder(request, tmp_path):
    return save_bundle(tiny_model(request.param), tmp_path / request.param)


def token_windows(count, seq_len):
    ids = encode(tiny_tokenizer(), read_corpus()[: 200 * count * seq_len // 16])
    assert len(ids) >= count * seq_len
    return ids[: count * seq_len].view(count, seq_len)


def training_arguments(output_dir, **overrides):
    from transformers import TrainingArguments

    return TrainingArguments(**dict(
        output_dir=str(output_dir), max_steps=4, per_device_train_batch_size=4, learning_rate=1e-2,
        gradient_checkpointing=True, save_strategy="steps", save_steps=2, logging_steps=1, report_to=[],
        use_cpu=True, seed=0, disable_tqdm=True, dataloader_num_workers=0, **overrides,
    ))  # fmt: skip


def gradients(model, batch):
    model.zero_grad()
    model(input_ids=batch, labels=batch).loss.backward()
    return {name: parameter.grad.clone() for name, parameter in model.named_parameters()}


def test_gradient_checkpointing_keeps_the_gradients(folder):
    model = AutoModelForCausalLM.from_pretrained(folder).train()
    batch = token_windows(2, 24)
    plain = gradients(model, batch)
    model.gradient_checkpointing_enable()
    assert all(layer.gradient_checkpointing for layer in model.model.layers)
    checkpointed = gradients(model, batch)
    for name, gradient in plain.items():
        assert torch.allclose(checkpointed[name], gradient, atol=1e-6, rtol=1e-5), name


def test_trainer_with_gradient_checkpointing_trains_and_resumes(folder, tmp_path):
    # Imported here: on the transformers 4.57 leg of CI, `transformers.trainer` imports the venv's `datasets`, which
    # needs a newer huggingface_hub than that leg has, and a module-level import would break its test collection.
    from transformers import Trainer

    windows = token_windows(12, 24)  # 3 batches per epoch: the resumed run crosses an epoch boundary
    dataset = [{"input_ids": row, "labels": row} for row in windows]  # the model shifts the labels itself

    model = AutoModelForCausalLM.from_pretrained(folder)
    trainer = Trainer(model=model, args=training_arguments(tmp_path / "run"), train_dataset=dataset)
    trainer.train()
    assert model.model.gradient_checkpointing and all(layer.gradient_checkpointing for layer in model.model.layers)
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert len(losses) == 4 and losses[-1] < losses[0] - 0.1, losses

    # A checkpoint is a remote-code bundle too, and resuming from it ends where the uninterrupted run ended.
    checkpoint = tmp_path / "run" / "checkpoint-2"
    assert (checkpoint / f"modeling_{model.config.model_type}.py").is_file()
    state_files = {"optimizer.pt", "scheduler.pt", "rng_state.pth", "trainer_state.json"}
    assert state_files <= {path.name for path in checkpoint.iterdir()}
    resumed_model = AutoModelForCausalLM.from_pretrained(folder)
    resumed = Trainer(model=resumed_model, args=training_arguments(tmp_path / "resumed"), train_dataset=dataset)
    resumed.train(resume_from_checkpoint=str(checkpoint))
    assert [entry["loss"] for entry in resumed.state.log_history if "loss" in entry] == losses
    final = dict(model.named_parameters())
    for name, parameter in resumed_model.named_parameters():
        assert torch.allclose(parameter, final[name], atol=1e-6, rtol=0), name


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_accelerate_data_parallel_step_equals_one_process_on_the_whole_batch(tmp_path):
    folders = [str(save_bundle(tiny_model(model_type), tmp_path / model_type)) for model_type in MODEL_TYPES]
    batch = token_windows(4, 16)  # two sequences per process
    save_file({"input_ids": batch}, tmp_path / "batch.safetensors")
    (tmp_path / "out").mkdir()
    command = [
        sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
        "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
        "--main_process_port", str(free_port()), "--monitor_interval", "1",
        str(DDP_SCRIPT), str(tmp_path / "out"), str(tmp_path / "batch.safetensors"), *folders,
    ]  # fmt: skip
    # GLOO_SOCKET_IFNAME keeps gloo on the loopback interface (it otherwise takes the address the host name resolves
    # to): the test talks to this machine only.
    env = dict(os.environ, ACCELERATE_USE_CPU="true", OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", GLOO_SOCKET_IFNAME="lo",
               HF_HOME=str(tmp_path / "hf"), HF_MODULES_CACHE=str(tmp_path / "modules"))  # fmt: skip
    launcher = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _, stderr = launcher.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        # torchrun starts the workers in sessions of their own: kill them by ancestry, then the launcher.
        for process in [*psutil.Process(launcher.pid).children(recursive=True), launcher]:
            process.kill()
        _, stderr = launcher.communicate()
        pytest.fail(f"accelerate launch did not finish in 300 s; its stderr ends with:\n{stderr[-4000:]}")
    assert launcher.returncode == 0, stderr[-4000:]
    run = json.loads((tmp_path / "out" / "run.json").read_text())
    assert run == {"num_processes": 2, "distributed_type": "DistributedType.MULTI_CPU", "backend": "gloo"}

    for index, folder in enumerate(folders):
        ddp = load_file(tmp_path / "out" / f"{index}.safetensors")
        assert torch.equal(ddp["seen"], batch)  # the two processes together saw the whole batch, once
        model = AutoModelForCausalLM.from_pretrained(folder).train()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)  # as in the script
        model(input_ids=batch, labels=batch).loss.backward()
        for name, parameter in model.named_parameters():
            assert torch.allclose(ddp[f"grad.{name}"], parameter.grad, atol=1e-6, rtol=1e-4), name
        optimizer.step()
        for name, parameter in model.named_parameters():
            assert torch.allclose(ddp[f"param.{name}"], parameter, atol=1e-6, rtol=0), name


def test_device_map_auto_offloads_to_disk_and_generates_the_same_tokens(folder, tmp_path):
    plain = AutoModelForCausalLM.from_pretrained(folder).eval()
    size = sum(parameter.numel() * parameter.element_size() for parameter in plain.parameters())
    offloaded = AutoModelForCausalLM.from_pretrained(
        folder, device_map="auto", max_memory={"cpu": int(0.8 * size)}, offload_folder=str(tmp_path / "offload")
    ).eval()
    assert set(offloaded.hf_device_map.values()) == {"cpu", "disk"}, offloaded.hf_device_map
    prompt = token_windows(1, 6)
    options = dict(attention_mask=torch.ones_like(prompt), max_new_tokens=8, min_new_tokens=8, do_sample=False)
    with torch.no_grad():
        assert torch.equal(offloaded(prompt).logits, plain(prompt).logits)
        assert torch.equal(offloaded.generate(prompt, **options), plain.generate(prompt, **options))


def test_bfloat16_inference(folder):
    fp32 = AutoModelForCausalLM.from_pretrained(folder).eval()
    bf16 = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16).eval()
    assert {parameter.dtype for parameter in bf16.parameters()} == {torch.bfloat16}
    batch = token_windows(2, 24)
    with torch.no_grad():
        reference, logits = fp32(batch).logits, bf16(batch).logits
        assert logits.dtype == torch.bfloat16
        assert (logits.float() - reference).abs().max() <= 0.02 * reference.abs().max()
        assert (logits.argmax(-1) == reference.argmax(-1)).float().mean() >= 0.9
        prompt = batch[:1, :6]
        options = dict(attention_mask=torch.ones_like(prompt), max_new_tokens=8, min_new_tokens=8, do_sample=False)
        dynamic = bf16.generate(prompt, **options)
        static = bf16.generate(prompt, cache_implementation="static", **options)
    assert dynamic.shape == (1, 14) and torch.equal(static, dynamic)
