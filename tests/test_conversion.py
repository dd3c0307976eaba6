"""Conversion from and back to transformers Llama and Granite folders and the official Hourglass_LM layout, the
shared writer's checks, and atomic output."""

import json
import subprocess
import sys
import textwrap

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, GraniteConfig, GraniteForCausalLM, LlamaConfig, LlamaForCausalLM

from shapeformers.cli import main
from shapeformers.conversion import ConversionError, convert, detect_format

from .conftest import LLAMA3_SCALING, perturb_norms
from .test_save_load import write_official_port_checkpoint


def rope_fields(theta, scaling=None):
    if transformers.__version__.startswith("4."):
        return {"rope_theta": theta, "rope_scaling": scaling}
    return {"rope_parameters": {"rope_type": "default", **(scaling or {}), "rope_theta": theta}}


def all_tensors(folder):
    tensors = {}
    for path in sorted(folder.glob("*.safetensors")):
        tensors.update(load_file(path))
    return tensors


def assert_same_logits(a, b, vocab_size, atol=1e-5):
    input_ids = torch.randint(0, vocab_size, (2, 23), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.allclose(a.eval()(input_ids).logits, b.eval()(input_ids).logits, atol=atol, rtol=0)


@pytest.fixture
def llama_folder(tmp_path):
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=101, hidden_size=48, intermediate_size=80, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=False,
        **rope_fields(500000.0, LLAMA3_SCALING),
    )
    model = perturb_norms(LlamaForCausalLM(config))
    folder = tmp_path / "llama"
    model.save_pretrained(folder, max_shard_size="40KB")  # sharded, as large checkpoints are
    assert (folder / "model.safetensors.index.json").exists()
    return folder


def test_llama_to_hourglass_and_back(llama_folder, tmp_path):
    assert detect_format(llama_folder) == "llama"
    report = convert(llama_folder, tmp_path / "ours", verify=True)
    assert report["verify"]["max_abs_logit_difference"] <= 1e-4
    llama = LlamaForCausalLM.from_pretrained(llama_folder)
    ours = AutoModelForCausalLM.from_pretrained(tmp_path / "ours", trust_remote_code=True)
    assert ours.config.model_type == "hourglass_llama" and ours.config.num_mlp_layers == 1
    assert_same_logits(ours, llama, 101)
    assert (tmp_path / "ours" / "generation_config.json").exists()

    convert(tmp_path / "ours", tmp_path / "back", to_format="llama", verify=True)
    original, back = all_tensors(llama_folder), all_tensors(tmp_path / "back")
    assert original.keys() == back.keys()
    assert all(torch.equal(original[name], back[name]) for name in original)
    assert_same_logits(LlamaForCausalLM.from_pretrained(tmp_path / "back"), llama, 101)


def test_granite_to_uniform_bowtieformer_and_back(tmp_path):
    torch.manual_seed(0)
    config = GraniteConfig(
        vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=4, embedding_multiplier=12.0, residual_multiplier=0.22, logits_scaling=8.0,
        attention_multiplier=0.125, tie_word_embeddings=False, **rope_fields(10000.0),
    )
    granite = perturb_norms(GraniteForCausalLM(config))
    granite.save_pretrained(tmp_path / "granite")
    convert(tmp_path / "granite", tmp_path / "ours", verify=True)
    ours = AutoModelForCausalLM.from_pretrained(tmp_path / "ours", trust_remote_code=True)
    assert ours.config.model_type == "bowtieformer" and ours.config.layer_widths == [32, 32]
    assert_same_logits(ours, granite, 97)

    convert(tmp_path / "ours", tmp_path / "back", to_format="granite")
    original, back = all_tensors(tmp_path / "granite"), all_tensors(tmp_path / "back")
    assert original.keys() == back.keys() and all(torch.equal(original[n], back[n]) for n in original)
    assert_same_logits(GraniteForCausalLM.from_pretrained(tmp_path / "back"), granite, 97)


def test_hourglass_lm_port_is_detected_and_round_trips(tmp_path):
    official = tmp_path / "official"
    official.mkdir()
    tensors = write_official_port_checkpoint(official)
    assert detect_format(official) == "hourglass_lm"
    with pytest.raises(ConversionError, match="Hourglass_LM checkpoint"):  # not silently a plain Llama
        convert(official, tmp_path / "as-llama", from_format="llama")
    assert not (tmp_path / "as-llama").exists()

    convert(official, tmp_path / "ours")
    ours = AutoModelForCausalLM.from_pretrained(tmp_path / "ours", trust_remote_code=True)
    assert ours.config.mlp_intermediate_sizes == [24, 40]
    convert(tmp_path / "ours", tmp_path / "back", to_format="hourglass_lm")
    back = all_tensors(tmp_path / "back")
    assert back.keys() == tensors.keys() and all(torch.equal(back[n], tensors[n]) for n in tensors)
    assert json.loads((tmp_path / "back" / "config.json").read_text())["model_type"] == "llama"


def test_dtype_is_kept_unless_asked(llama_folder, tmp_path):
    half = tmp_path / "half"
    LlamaForCausalLM.from_pretrained(llama_folder, dtype=torch.float16).save_pretrained(half)
    convert(half, tmp_path / "kept")
    assert {t.dtype for t in all_tensors(tmp_path / "kept").values()} == {torch.float16}
    convert(half, tmp_path / "cast", dtype="bfloat16")
    assert {t.dtype for t in all_tensors(tmp_path / "cast").values()} == {torch.bfloat16}
    saved = json.loads((tmp_path / "cast" / "config.json").read_text())
    assert saved.get("dtype", saved.get("torch_dtype")) == "bfloat16"  # 5.x writes `dtype`, 4.x `torch_dtype`


def rewrite_tensors(folder, edit):
    """Apply `edit` to the tensors of a sharded safetensors folder in place (keeping the index consistent)."""
    index_path = folder / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    for shard in sorted(set(index["weight_map"].values())):
        tensors = load_file(folder / shard)
        edit(tensors)
        save_file(tensors, folder / shard, metadata={"format": "pt"})
    index["weight_map"] = {n: s for s in set(index["weight_map"].values()) for n in load_file(folder / s)}
    index_path.write_text(json.dumps(index))


def edit_json(path, **changes):
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda f: rewrite_tensors(f, lambda t: t.pop("model.layers.1.mlp.up_proj.weight", None)),
         "missing: model.layers.1.mlp.0.up_proj.weight"),
        (lambda f: rewrite_tensors(f, lambda t: t.update({"model.extra.weight": torch.zeros(2)})),
         "unexpected: model.extra.weight"),
        (lambda f: rewrite_tensors(
            f, lambda t: t.update({"model.norm.weight": torch.ones(47)}) if "model.norm.weight" in t else None),
         r"model.norm.weight \(47,\) \(expected \(48,\)\)"),
        (lambda f: rewrite_tensors(f, lambda t: t.update({"model.norm.weight": t["model.norm.weight"].to(torch.int32)})
                                   if "model.norm.weight" in t else None),
         r"model.norm.weight torch.int32 \(expected a floating-point dtype\)"),
        (lambda f: (f / sorted(json.loads((f / "model.safetensors.index.json").read_text())["weight_map"].values())[0])
         .write_bytes(b"\x10\x00\x00"), "not a readable safetensors file"),
        (lambda f: (f / "config.json").write_text(json.dumps({"model_type": "gpt2"})), "unknown model_type 'gpt2'"),
        (lambda f: edit_json(f / "config.json", num_key_value_heads=3),
         "not a valid 'llama' checkpoint: ValueError: `num_key_value_heads`"),
        (lambda f: edit_json(f / "model.safetensors.index.json", weight_map=None),
         "not a valid 'llama' checkpoint"),
    ],
    ids=["missing", "unexpected", "misshaped", "mistyped", "truncated", "unknown-format", "bad-config-value", "bad-index"],
)
def test_bad_input_is_refused_and_leaves_nothing(llama_folder, tmp_path, damage, message):
    damage(llama_folder)
    destination = tmp_path / "out"
    with pytest.raises(ConversionError, match=message):
        convert(llama_folder, destination)
    assert not destination.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out")]


KILLED_MIDWAY = textwrap.dedent(
    """
    import os, signal, sys
    import shapeformers.conversion.io as io
    from shapeformers.conversion import convert
    from shapeformers.conversion.llama import read_llama
    from shapeformers.conversion.writer import write_checkpoint

    real_save, calls = io.save_file, []
    def save_then_die(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            os.kill(os.getpid(), signal.SIGKILL)
        return real_save(*args, **kwargs)
    io.save_file = save_then_die
    write_checkpoint(read_llama(sys.argv[1]), sys.argv[2], max_shard_bytes=20_000)
    """
)


def test_a_conversion_killed_midway_leaves_no_destination(llama_folder, tmp_path):
    result = subprocess.run([sys.executable, "-c", KILLED_MIDWAY, str(llama_folder), str(tmp_path / "out")],
                            capture_output=True, timeout=300)
    assert result.returncode == -9, result.stderr.decode()[-2000:]
    assert not (tmp_path / "out").exists()


def test_command_line(llama_folder, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["convert", "--help"])
    assert exit_info.value.code == 0
    help_text = capsys.readouterr().out
    for name in ("lm_engine", "hourglass_lm", "llama", "granite", "llama2c", "--verify", "--tokenizer", "--dtype"):
        assert name in help_text

    main(["convert", str(llama_folder), str(tmp_path / "ours"), "--verify"])
    assert json.loads(capsys.readouterr().out)["to"] == "hourglass_llama"
    with pytest.raises(SystemExit, match="already exists"):
        main(["convert", str(llama_folder), str(tmp_path / "ours")])


def test_max_shard_size_bounds_every_output_file(llama_folder, tmp_path, capsys):
    llama_bytes = sum(path.stat().st_size for path in llama_folder.glob("*.safetensors"))
    main(["convert", str(llama_folder), str(tmp_path / "ours"), "--max-shard-size", "30KB", "--verify"])
    shards = sorted((tmp_path / "ours").glob("*.safetensors"))
    # A shard holds at least one tensor; the largest here (the 101 x 48 embedding, 19 KB) is under the bound.
    assert len(shards) > llama_bytes // 30_000 and all(path.stat().st_size <= 30_000 + 4096 for path in shards)
    assert (tmp_path / "ours" / "model.safetensors.index.json").exists()

    main(["convert", str(tmp_path / "ours"), str(tmp_path / "back"), "--to", "llama", "--max-shard-size", "1GB"])
    assert [path.name for path in (tmp_path / "back").glob("*.safetensors")] == ["model.safetensors"]
    original, back = all_tensors(llama_folder), all_tensors(tmp_path / "back")
    assert original.keys() == back.keys() and all(torch.equal(original[name], back[name]) for name in original)
    capsys.readouterr()

    for bad in ("0", "-5MB", "large"):
        with pytest.raises(SystemExit, match="max_shard_size must be a positive byte count"):
            main(["convert", str(llama_folder), str(tmp_path / "refused"), f"--max-shard-size={bad}"])
    assert not (tmp_path / "refused").exists()


def test_the_source_generation_config_is_kept_both_ways(llama_folder, tmp_path):
    from transformers import GenerationConfig

    # as an instruct model ships it: several stop tokens and sampling defaults that config.json does not hold
    chat = GenerationConfig(bos_token_id=1, eos_token_id=[2, 7, 9], do_sample=True, temperature=0.6, top_p=0.9)
    chat.save_pretrained(llama_folder)
    convert(llama_folder, tmp_path / "ours")
    convert(tmp_path / "ours", tmp_path / "back", to_format="llama")
    for folder in (tmp_path / "ours", tmp_path / "back"):
        assert (folder / "generation_config.json").read_bytes() == (llama_folder / "generation_config.json").read_bytes()
    ours = AutoModelForCausalLM.from_pretrained(tmp_path / "ours", trust_remote_code=True)
    assert ours.generation_config.eos_token_id == [2, 7, 9] and ours.generation_config.temperature == 0.6
