"""Both ways in, for both architectures: natively after `import shapeformers`, and as remote code in a process
that cannot import it, from a folder and by repo id from a local Hugging Face cache."""

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoConfig, AutoModelForCausalLM

from shapeformers import BowtieFormerForCausalLM, HourglassLlamaConfig, HourglassLlamaForCausalLM

from .conftest import perturb_norms, tiny_hourglass_config
from .test_bowtieformer_config import tiny_bowtie_config
from .test_hourglass_llama_equivalence import reference_logits

pytestmark = pytest.mark.matrix

REVISION = "0123456789abcdef0123456789abcdef01234567"


def assert_same_weights(model, folder):
    saved = load_file(Path(folder) / "model.safetensors")
    state = model.state_dict()
    for name, tensor in saved.items():
        assert torch.equal(state[name], tensor), name
    assert set(state) - set(saved) <= {"lm_head.weight"}  # tied heads are stored once


@pytest.fixture(params=["hourglass_llama", "bowtieformer"])
def any_model(request):
    """A tiny model of each architecture with non-default weights everywhere (norms included)."""
    torch.manual_seed(0)
    if request.param == "hourglass_llama":
        model = HourglassLlamaForCausalLM(tiny_hourglass_config())
    else:
        model = BowtieFormerForCausalLM(tiny_bowtie_config(num_key_value_heads=2, embedding_multiplier=2.0))
    return perturb_norms(model).eval()


EXPECTED_AUTO_MAPS = {
    "hourglass_llama": {
        "AutoConfig": "configuration_hourglass_llama.HourglassLlamaConfig",
        "AutoModel": "modeling_hourglass_llama.HourglassLlamaModel",
        "AutoModelForCausalLM": "modeling_hourglass_llama.HourglassLlamaForCausalLM",
        "AutoModelForSequenceClassification": "modeling_hourglass_llama.HourglassLlamaForSequenceClassification",
    },
    "bowtieformer": {
        "AutoConfig": "configuration_bowtieformer.BowtieFormerConfig",
        "AutoModel": "modeling_bowtieformer.BowtieFormerModel",
        "AutoModelForCausalLM": "modeling_bowtieformer.BowtieFormerForCausalLM",
        "AutoModelForSequenceClassification": "modeling_bowtieformer.BowtieFormerForSequenceClassification",
    },
}


def test_folder_is_a_self_contained_remote_code_bundle(any_model, tmp_path):
    any_model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    model_type = config["model_type"]
    assert config["auto_map"] == EXPECTED_AUTO_MAPS[model_type]
    code = {path.name: path.read_text() for path in tmp_path.glob("*.py")}
    assert {f"configuration_{model_type}.py", f"modeling_{model_type}.py"} <= set(code)
    # transformers 4.57 copies only the files that the config and model files import themselves; a helper reached
    # only through another helper is missing from its module cache at load time.
    def relative_imports(name):
        return set(re.findall(r"^from \.(\w+) import", code[name], flags=re.MULTILINE))

    direct = relative_imports(f"configuration_{model_type}.py") | relative_imports(f"modeling_{model_type}.py")
    for name in code:
        assert relative_imports(name) <= direct, f"{name} imports helpers the entry files do not import themselves"
    for name, text in code.items():
        for line in text.splitlines():
            if line.startswith(("import ", "from ")):
                module = line.split()[1]
                assert not module.startswith(".."), f"{name}: {line}"
                top_level = module.split(".")[0]
                assert module.startswith(".") or top_level in {"torch", "transformers", *sys.stdlib_module_names}, (
                    f"{name}: {line}"
                )


def test_native_round_trip_is_bit_exact(any_model, tmp_path):
    any_model.save_pretrained(tmp_path)
    loaded, info = AutoModelForCausalLM.from_pretrained(tmp_path, output_loading_info=True)
    assert type(loaded) is type(any_model)
    assert not any(info.values()), info
    assert_same_weights(loaded, tmp_path)
    input_ids = torch.randint(3, 80, (2, 11))
    with torch.no_grad():
        assert torch.equal(loaded.eval()(input_ids).logits, any_model(input_ids).logits)


def test_only_the_main_process_writes(any_model, tmp_path):
    # accelerate's multi-process save: every process calls save_pretrained(is_main_process=...). The others write
    # neither config nor code (transformers 4.x still has each of them write the weights).
    any_model.save_pretrained(tmp_path / "other", is_main_process=False)
    written = {path.name for path in (tmp_path / "other").glob("*")}
    assert "config.json" not in written and not any(name.endswith(".py") for name in written)
    any_model.save_pretrained(tmp_path / "main", is_main_process=True)
    assert {"config.json", "model.safetensors"} <= {path.name for path in (tmp_path / "main").iterdir()}


def test_tied_embeddings_stay_tied_after_loading(tmp_path):
    HourglassLlamaForCausalLM(tiny_hourglass_config(tie_word_embeddings=True)).save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert loaded.lm_head.weight.data_ptr() == loaded.model.embed_tokens.weight.data_ptr()


def hub_cache(tmp_path, folder, repo_id):
    """Lay `folder` out as the Hugging Face cache would after downloading `repo_id`."""
    repo = tmp_path / "hub" / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / REVISION
    snapshot.mkdir(parents=True)
    for path in Path(folder).iterdir():
        (snapshot / path.name).write_bytes(path.read_bytes())
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(REVISION)
    return tmp_path / "hub"


# Runs in a fresh interpreter in which `import shapeformers` fails.
REMOTE_SCRIPT = textwrap.dedent(
    """
    import sys
    sys.modules["shapeformers"] = None
    import torch
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM

    folder, resaved, repo_id, expected_path = sys.argv[1:]
    expected = load_file(expected_path)
    for source in (folder, repo_id):
        model = AutoModelForCausalLM.from_pretrained(source, trust_remote_code=True).eval()
        assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
        config_class = type(AutoConfig.from_pretrained(source, trust_remote_code=True))
        assert config_class.__module__.startswith("transformers_modules"), config_class
        for name, tensor in load_file(folder + "/model.safetensors").items():
            assert torch.equal(model.state_dict()[name], tensor), name
        with torch.no_grad():
            assert torch.equal(model(expected["input_ids"]).logits, expected["logits"]), source
        tokens = model.generate(expected["prompt"], attention_mask=torch.ones_like(expected["prompt"]),
                                max_new_tokens=8, min_new_tokens=8, do_sample=False, pad_token_id=0)
        assert torch.equal(tokens, expected["tokens"]), source

    model.save_pretrained(resaved)
    again = AutoModelForCausalLM.from_pretrained(resaved, trust_remote_code=True).eval()
    with torch.no_grad():
        assert torch.equal(again(expected["input_ids"]).logits, expected["logits"])
    print("remote code OK")
    """
)


def test_remote_code_loads_without_shapeformers(any_model, tmp_path):
    folder = tmp_path / "model"
    any_model.save_pretrained(folder)
    input_ids = torch.randint(3, 80, (2, 11))
    prompt = torch.tensor([[1, 5, 9, 14]])
    with torch.no_grad():
        expected = {
            "input_ids": input_ids,
            "logits": any_model(input_ids).logits,
            "prompt": prompt,
            "tokens": any_model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=8,
                                          min_new_tokens=8, do_sample=False, pad_token_id=0),
        }
    save_file(expected, tmp_path / "expected.safetensors")
    repo_id = f"shapeformers-test/tiny-{any_model.config.model_type}"
    env = dict(
        os.environ,
        OMP_NUM_THREADS=str(torch.get_num_threads()),  # the same reduction order as here: bit-identical logits
        HF_HUB_OFFLINE="1",
        HF_HUB_CACHE=str(hub_cache(tmp_path, folder, repo_id)),
        HF_MODULES_CACHE=str(tmp_path / "modules"),
    )
    result = subprocess.run(
        [sys.executable, "-c", REMOTE_SCRIPT, str(folder), str(tmp_path / "resaved"), repo_id,
         str(tmp_path / "expected.safetensors")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert "remote code OK" in result.stdout
    resaved_config = json.loads((tmp_path / "resaved" / "config.json").read_text())
    assert resaved_config["auto_map"] == EXPECTED_AUTO_MAPS[any_model.config.model_type]


def write_official_port_checkpoint(folder):
    """A checkpoint as the official Hourglass_LM port writes it (MODELS.md §1.3): a Llama config with two extra keys
    and `post_attention_layernorm.{k}` / `mlp.{k}.*` tensors. Returns the tensors."""
    torch.manual_seed(0)
    d, layers, widths, vocab = 32, 2, [24, 40], 61
    tensors = {"model.embed_tokens.weight": torch.randn(vocab, d), "model.norm.weight": 1 + 0.1 * torch.randn(d),
               "lm_head.weight": 0.1 * torch.randn(vocab, d)}
    for i in range(layers):
        p = f"model.layers.{i}."
        tensors[p + "input_layernorm.weight"] = 1 + 0.1 * torch.randn(d)
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            tensors[p + f"self_attn.{name}.weight"] = 0.2 * torch.randn(d, d)
        for k, width in enumerate(widths):
            tensors[p + f"post_attention_layernorm.{k}.weight"] = 1 + 0.1 * torch.randn(d)
            tensors[p + f"mlp.{k}.gate_proj.weight"] = 0.2 * torch.randn(width, d)
            tensors[p + f"mlp.{k}.up_proj.weight"] = 0.2 * torch.randn(width, d)
            tensors[p + f"mlp.{k}.down_proj.weight"] = 0.2 * torch.randn(d, width)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    official = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": vocab, "hidden_size": d,
        "intermediate_size": 64, "num_hidden_layers": layers, "num_attention_heads": 4, "num_key_value_heads": 4,
        "max_position_embeddings": 64, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "rope_scaling": None,
        "tie_word_embeddings": False, "hidden_act": "silu", "num_mlp_layers": 2, "mlp_intermediate_sizes": widths,
        "torch_dtype": "float32",
    }
    (folder / "config.json").write_text(json.dumps(official))
    return tensors


def test_official_port_checkpoint_loads_after_a_model_type_rewrite(tmp_path):
    tensors = write_official_port_checkpoint(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(dict(config, model_type="hourglass_llama")))

    model, info = AutoModelForCausalLM.from_pretrained(tmp_path, output_loading_info=True)
    assert not any(info.values()), info
    assert isinstance(model.config, HourglassLlamaConfig) and model.config.mlp_intermediate_sizes == [24, 40]
    input_ids = torch.randint(0, 61, (2, 9))
    with torch.no_grad():
        logits = model.eval()(input_ids).logits
    assert torch.allclose(logits, reference_logits(tensors, model.config, input_ids), atol=1e-5, rtol=0)
    assert type(AutoConfig.from_pretrained(tmp_path)) is HourglassLlamaConfig
