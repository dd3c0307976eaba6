"""`shapeformers demo` end to end with tiny settings: tokenizer, training, save, remote-code reload, table."""

import json
import math

from shapeformers.cli import main

MODELS = ("llama", "hourglass_llama", "bowtieformer")


def table_rows(output):
    """{model: {column: cell}} from the Markdown table the demo prints last."""
    lines = [line for line in output.splitlines() if line.startswith("| ")]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    rows = [dict(zip(header, (cell.strip() for cell in line.strip("|").split("|")))) for line in lines[1:]]
    return {row["model"]: row for row in rows}


def test_demo_end_to_end(tmp_path, capsys):
    main(["demo", "--steps", "3", "--seq-len", "32", "--batch-size", "2", "--max-new-tokens", "4",
          "--output-dir", str(tmp_path)])  # fmt: skip

    for name in MODELS:
        folder = tmp_path / name
        for file in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
            assert (folder / file).is_file(), f"{name}/{file} missing"
        tokenizer_config = json.loads((folder / "tokenizer_config.json").read_text())
        assert tokenizer_config["tokenizer_class"] == "PreTrainedTokenizerFast"
    for name in MODELS[1:]:
        assert (tmp_path / name / f"modeling_{name}.py").is_file()
        assert (tmp_path / name / f"configuration_{name}.py").is_file()
        assert "auto_map" in json.loads((tmp_path / name / "config.json").read_text())
    assert not list(tmp_path.glob(".*")), "a staging folder was left behind"

    rows = table_rows(capsys.readouterr().out)
    assert set(rows) == set(MODELS)
    for row in rows.values():
        assert math.isfinite(float(row["train loss"])) and math.isfinite(float(row["val loss"]))
    # Matched budgets: the same non-embedding parameters to 1%, half the KV cache (half the layers, same attention).
    llama, hourglass, bowtie = (int(rows[name]["non-emb params"].replace(",", "")) for name in MODELS)
    assert abs(hourglass - llama) < 0.01 * llama
    assert abs(bowtie - llama) < 0.05 * llama  # matched as the paper counts (no norms, padded columns)
    assert int(rows["llama"]["KV bytes/token (bf16)"]) == 2 * int(rows["hourglass_llama"]["KV bytes/token (bf16)"])
    # The X shape's average width (160 + 96 + 64 + 160) / 4 = 120 against 128.
    assert int(rows["bowtieformer"]["KV bytes/token (bf16)"]) * 128 == int(rows["llama"]["KV bytes/token (bf16)"]) * 120
