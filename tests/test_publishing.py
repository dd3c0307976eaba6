"""`shapeformers card` and `shapeformers publish`: the card's metadata, usage, cost table and pictures; the checks
before an upload (the folder loads in a Python without shapeformers); the upload itself through huggingface_hub's
real HTTP client against a stand-in for the Hub on 127.0.0.1; and a clear failure, with nothing uploaded, offline."""

import base64
import json
import os
import re
import subprocess
import sys
import textwrap
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import huggingface_hub
import pytest
from huggingface_hub import ModelCard
from PIL import Image
from transformers import AutoConfig, LlamaConfig

from shapeformers import hourglass_llama_preset, match_bottleneck_width
from shapeformers.cli import main
from shapeformers.publishing import (
    PublishError,
    files_to_upload,
    layer_profile,
    matched_baseline,
    upload,
)

from .conftest import tiny_hourglass_config
from .test_bowtieformer_config import tiny_bowtie_config
from .test_pipelines import MODEL_TYPES, save_bundle, tiny_model

# lm-eval's output layout, as `shapeformers eval` writes it (scores are fractions; cards show percentages).
RESULTS = {
    "results": {"arc_easy": {"alias": "arc_easy", "acc,none": 0.3125, "acc_stderr,none": 0.012,
                             "acc_norm,none": 0.2875, "acc_norm_stderr,none": 0.011}},
    "configs": {"arc_easy": {"dataset_path": "allenai/ai2_arc", "dataset_name": "ARC-Easy", "test_split": "test"}},
    "n-shot": {"arc_easy": 0},
}  # fmt: skip


@pytest.fixture(params=MODEL_TYPES)
def bundle(request, tmp_path):
    return save_bundle(tiny_model(request.param), tmp_path / f"tiny-{request.param}")


def card_of(folder):
    return ModelCard.load(Path(folder) / "README.md")


def run_cli(capsys, *argv):
    """`shapeformers ARGV` in this process; returns its printed JSON."""
    capsys.readouterr()
    main([str(arg) for arg in argv])
    return json.loads(capsys.readouterr().out)


def test_card_metadata_usage_cost_table_and_pictures(bundle, tmp_path, capsys):
    results = tmp_path / "results.json"
    results.write_text(json.dumps(RESULTS))
    written = run_cli(capsys, "card", bundle, "--results", results, "--repo-id", "org/tiny", "--base-model",
                      "org/source-model")["written"]  # fmt: skip
    card = card_of(bundle)
    model_type = json.loads((bundle / "config.json").read_text())["model_type"]
    data = card.data
    assert (data.library_name, data.pipeline_tag, data.license) == ("transformers", "text-generation", "apache-2.0")
    assert {model_type, "custom_code"} <= set(data.tags)
    assert data.base_model == "org/source-model"
    assert "Base model: [`org/source-model`](https://huggingface.co/org/source-model)." in card.text
    [acc, acc_norm] = data.eval_results  # the model-index, as the Hub reads it
    assert (acc.dataset_type, acc.dataset_config, acc.dataset_split) == ("allenai/ai2_arc", "ARC-Easy", "test")
    assert (acc.metric_type, acc.metric_value, acc_norm.metric_value) == ("acc", 31.25, 28.75)
    assert "31.25 ± 1.20" in card.text

    assert 'AutoModelForCausalLM.from_pretrained("org/tiny", trust_remote_code=True)' in card.text
    assert 'pipeline("text-generation", model="org/tiny", trust_remote_code=True)' in card.text

    # The cost table: this model and its parameter-matched baseline, the numbers of the configs' accounting.
    config = AutoConfig.from_pretrained(bundle)
    if model_type == "bowtieformer":
        baseline = tiny_bowtie_config(**{key: getattr(config, key) for key in
                                         ("vocab_size", "num_key_value_heads", "pad_token_id", "bos_token_id",
                                          "eos_token_id")}, schedule="uniform")  # fmt: skip
        assert baseline.layer_widths == [config.hidden_size] * config.num_hidden_layers
    else:
        baseline = match_bottleneck_width(config, 1, config.num_hidden_layers, config.hidden_size)
        assert baseline.num_mlp_layers == 1
        # Matched to within half a step of the MLP width (3 * hidden_size parameters per layer).
        assert abs(baseline.non_embedding_parameters() - config.non_embedding_parameters()) <= (
            1.5 * config.hidden_size * config.num_hidden_layers)
    seq = min(2048, config.max_position_embeddings)
    table = card.text[card.text.index("| Parameters |"):]
    for figure in ("num_parameters", "non_embedding_parameters", "flops_per_token", "kv_cache_bytes_per_token"):
        argument = {"flops_per_token": (seq,), "kv_cache_bytes_per_token": ("bfloat16",)}.get(figure, ())
        ours, theirs = (getattr(c, figure)(*argument) for c in (config, baseline))
        row = rf"\| {ours:,} \([^)]*\) \| {theirs:,} \([^)]*\) \| {ours / theirs:.3f} \|"
        assert re.search(row, table), (figure, table)

    # The pictures: written beside the card, linked from it, real PNGs.
    pictures = {"parameter_split.png", "kv_cache_per_layer.png"}
    if model_type == "bowtieformer":
        pictures.add("width_profile.png")
    assert {Path(path).name for path in written} == {"README.md"} | pictures
    for name in pictures:
        assert f"]({name})" in card.text
        with Image.open(bundle / name) as image:
            assert image.format == "PNG" and image.size[0] > 400 and image.size[1] > 200
    # The per-layer figures drawn are the model's own parameters, and add up to the config's count.
    profile = layer_profile(config)
    assert sum(row["attention"] + row["ffn"] for row in profile) + profile[-1]["width"] == (
        config.non_embedding_parameters())
    assert sum(row["kv_bytes"] for row in profile) == config.kv_cache_bytes_per_token("bfloat16")


def test_card_keeps_earlier_metadata_and_takes_a_llama_baseline(tmp_path, capsys):
    folder = save_bundle(tiny_model("hourglass_llama"), tmp_path / "model")
    results = tmp_path / "results.json"
    results.write_text(json.dumps(RESULTS))
    run_cli(capsys, "card", folder, "--results", results, "--license", "mit")
    # A Llama config, read as the K = 1 HourglassLlama it is, replaces the same-shape baseline.
    llama = LlamaConfig(vocab_size=320, hidden_size=32, intermediate_size=96, num_hidden_layers=4,
                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)  # fmt: skip
    llama.save_pretrained(tmp_path / "llama")
    run_cli(capsys, "card", folder, "--baseline", tmp_path / "llama")  # no --results, no --license this time
    card = card_of(folder)
    assert card.data.license == "mit" and [r.metric_value for r in card.data.eval_results] == [31.25, 28.75]
    assert "given with `--baseline` (hidden size 32, 4 layers)" in card.text
    baseline = tiny_hourglass_config(vocab_size=320, hidden_size=32, num_hidden_layers=4, num_attention_heads=4,
                                     num_key_value_heads=2, head_dim=8, num_mlp_layers=1, mlp_intermediate_sizes=96,
                                     qk_norm=False)  # fmt: skip
    assert f"| {baseline.num_parameters():,} (" in card.text
    assert "Base model:" not in card.text  # none was named


def test_baselines_where_there_is_none_and_for_paper_shapes():
    assert matched_baseline(tiny_hourglass_config(num_mlp_layers=1, mlp_intermediate_sizes=[64]))[0] is None
    assert matched_baseline(tiny_bowtie_config(schedule="uniform"))[0] is None
    baseline, text = matched_baseline(hourglass_llama_preset("906m-hourglass"))
    assert "906m-baseline" in text and baseline.to_dict() == hourglass_llama_preset("906m-baseline").to_dict()


def test_publish_dry_run_checks_the_folder_in_a_python_without_shapeformers(bundle, capsys):
    report = run_cli(capsys, "publish", bundle, "--repo-id", "org/tiny", "--private", "--dry-run")
    model_type = json.loads((bundle / "config.json").read_text())["model_type"]
    assert report["dry_run"] and "commit_url" not in report
    assert report["check"]["model_class"] == tiny_model(model_type).__class__.__name__
    assert report["check"]["generation_config"]["eos_token_id"] == tiny_model(model_type).config.eos_token_id
    expected = {"README.md", "config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                "tokenizer_config.json", f"modeling_{model_type}.py", "parameter_split.png"}  # fmt: skip
    assert expected <= set(report["files"])
    assert report["files"] == files_to_upload(bundle)
    assert 'from_pretrained("org/tiny", trust_remote_code=True)' in card_of(bundle).text


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda folder: (folder / "tokenizer.json").unlink(), "no tokenizer"),
        (lambda folder: (folder / "generation_config.json").unlink(), "no generation_config.json"),
        (lambda folder: (folder / "tokenizer_config.json").write_text('{"tokenizer_class": "TokenizersBackend"}'),
         "does not load on transformers 4.x"),
        (lambda folder: (folder / "config.json").write_text(
            json.dumps({k: v for k, v in json.loads((folder / "config.json").read_text()).items() if k != "auto_map"})
        ), "auto_map has no AutoModelForCausalLM"),
    ],
)
def test_publish_refuses_an_incomplete_folder(damage, message, tmp_path):
    folder = save_bundle(tiny_model("hourglass_llama"), tmp_path / "model")
    damage(folder)
    with pytest.raises(SystemExit, match=re.escape(message)):
        main(["publish", str(folder), "--repo-id", "org/tiny", "--dry-run"])


def test_publish_refuses_a_folder_whose_code_does_not_load(tmp_path):
    folder = save_bundle(tiny_model("bowtieformer"), tmp_path / "model")
    (folder / "variable_width_cache.py").unlink()  # imported by the modeling file: only loading it can tell
    with pytest.raises(SystemExit, match="does not load through its remote code") as failure:
        main(["publish", str(folder), "--repo-id", "org/tiny", "--dry-run"])
    assert "variable_width_cache" in str(failure.value)


def test_publish_offline_or_unreachable_fails_clearly_and_uploads_nothing(tmp_path, monkeypatch, capsys):
    folder = save_bundle(tiny_model("hourglass_llama"), tmp_path / "model")
    with pytest.raises(PublishError, match="offline mode is on"):  # the tests run with HF_HUB_OFFLINE=1
        upload(folder, "org/tiny")

    # Online, but nothing listens where the Hub should be: the whole command runs, then says why it stopped.
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    with HubStandIn() as hub:
        endpoint = hub.endpoint
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", endpoint)  # closed now: connections are refused
    monkeypatch.setenv("HF_TOKEN", "hf_test_token")
    refused = rf"cannot reach the Hugging Face Hub at {re.escape(endpoint)}.*nothing was uploaded"
    with pytest.raises(SystemExit, match=refused):
        main(["publish", str(folder), "--repo-id", "org/tiny"])
    assert hub.requests == []


class HubStandIn:
    """A recording stand-in for the Hub's upload API on 127.0.0.1 (create repo, validate README metadata, preupload,
    commit), answering as the Hub does, so that huggingface_hub's own client code runs unchanged. Every file goes in
    the commit itself ("regular" upload mode)."""

    def __init__(self):
        self.requests, self.validated, self.commits, self.commit_queries = [], [], {}, {}
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def answer(self, status, payload):
                body = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                stand_in.requests.append(("GET", self.path, self.headers.get("Authorization"), None))
                self.answer(404, {"error": "not found"})

            do_HEAD = do_GET  # a file that is not there yet (an earlier model card, say)

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                path = self.path.split("?")[0]
                stand_in.requests.append(("POST", path, self.headers.get("Authorization"), body))
                if path == "/api/validate-yaml":  # the Hub checks a README's metadata before the upload
                    stand_in.validated.append(json.loads(body))
                    return self.answer(200, {"errors": [], "warnings": []})
                if path == "/api/repos/create":
                    request = json.loads(body)
                    repo_id = f"{request['organization']}/{request['name']}"
                    return self.answer(200, {"url": f"{stand_in.endpoint}/{repo_id}", "name": repo_id})
                if match := re.fullmatch(r"/api/models/(.+)/preupload/(\w+)", path):
                    files = json.loads(body)["files"]
                    return self.answer(200, {"files": [{"path": f["path"], "uploadMode": "regular",
                                                        "shouldIgnore": False} for f in files]})  # fmt: skip
                if match := re.fullmatch(r"/api/models/(.+)/commit/(\w+)", path):
                    lines = [json.loads(line) for line in body.splitlines() if line.strip()]
                    stand_in.commits[match.group(1)] = lines
                    stand_in.commit_queries[match.group(1)] = self.path.partition("?")[2]
                    oid = "c0ffee" * 6 + "c0ff"
                    answer = {"commitUrl": f"{stand_in.endpoint}/{match.group(1)}/commit/{oid}", "commitOid": oid}
                    if "create_pr=1" in self.path:  # the commit went to a new pull request
                        answer["pullRequestUrl"] = f"{stand_in.endpoint}/{match.group(1)}/discussions/1"
                    return self.answer(200, answer)
                self.answer(404, {"error": f"no route {path}"})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self):
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


def test_publish_uploads_through_huggingface_hub(tmp_path):
    folder = save_bundle(tiny_model("bowtieformer"), tmp_path / "tiny-bowtie")
    with HubStandIn() as hub:
        env = dict(os.environ, HF_HUB_OFFLINE="0", HF_ENDPOINT=hub.endpoint, HF_TOKEN="hf_test_token",
                   HF_HOME=str(tmp_path / "hf"))  # fmt: skip
        env.pop("HF_HUB_CACHE", None)
        result = subprocess.run(
            [sys.executable, "-m", "shapeformers.cli", "publish", str(folder), "--repo-id", "org/tiny-bowtie",
             "--private", "--commit-message", "First upload"],
            env=env, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    report = json.loads(result.stdout)
    assert report["commit_url"].startswith(f"{hub.endpoint}/org/tiny-bowtie/commit/")

    create = [body for method, path, _, body in hub.requests if path == "/api/repos/create"]
    assert len(create) == 1
    request = json.loads(create[0])
    assert (request["organization"], request["name"], request["type"]) == ("org", "tiny-bowtie", "model")
    assert request.get("visibility") == "private" or request.get("private") is True
    assert {auth for method, _, auth, _ in hub.requests if method == "POST"} == {"Bearer hf_test_token"}

    [validated] = hub.validated
    assert validated == {"content": (folder / "README.md").read_text(), "repoType": "model"}
    header, *files = hub.commits["org/tiny-bowtie"]
    assert header == {"key": "header", "value": {"summary": "First upload", "description": ""}}
    uploaded = {item["value"]["path"]: base64.b64decode(item["value"]["content"]) for item in files}
    assert sorted(uploaded) == report["files"] == files_to_upload(folder)
    for name, content in uploaded.items():
        assert content == (folder / name).read_bytes(), name
    assert {"README.md", "width_profile.png", "modeling_bowtieformer.py", "tokenizer.json"} <= set(uploaded)


def test_save_pretrained_pushes_the_code_with_the_hub_options(tmp_path):
    """`save_pretrained(push_to_hub=True, ...)` uploads the remote-code files too, and passes push_to_hub's own
    options (here create_pr and commit_description) on, as transformers' own save_pretrained does."""
    folder = save_bundle(tiny_model("hourglass_llama"), tmp_path / "tiny")
    push = textwrap.dedent(f"""
        import shapeformers
        from transformers import AutoModelForCausalLM
        model = AutoModelForCausalLM.from_pretrained({str(folder)!r})
        model.save_pretrained({str(tmp_path / "saved")!r}, push_to_hub=True, repo_id="org/tiny",
                              commit_message="Add model", commit_description="Why", create_pr=True)
    """)
    with HubStandIn() as hub:
        env = dict(os.environ, HF_HUB_OFFLINE="0", HF_ENDPOINT=hub.endpoint, HF_TOKEN="hf_test_token",
                   HF_HOME=str(tmp_path / "hf"))  # fmt: skip
        env.pop("HF_HUB_CACHE", None)
        result = subprocess.run([sys.executable, "-c", push], env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    header, *files = hub.commits["org/tiny"]
    assert header["value"] == {"summary": "Add model", "description": "Why"}
    assert "create_pr=1" in hub.commit_queries["org/tiny"].split("&")
    uploaded = {item["value"]["path"] for item in files}
    code = {path.name for path in (tmp_path / "saved").glob("*.py")}
    assert {"configuration_hourglass_llama.py", "modeling_hourglass_llama.py"} <= code <= uploaded
    assert {"config.json", "generation_config.json"} <= uploaded and any(p.endswith(".safetensors") for p in uploaded)
