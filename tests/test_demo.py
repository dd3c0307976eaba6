"""`shapeformers demo` end to end with tiny settings: tokenizer, training, save, remote-code reload, table."""

import json
import math

from shapeformers.cli import main

MODELS = ("llama", "hourglass_llama")


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
    assert (tmp_path / "hourglass_llama" / "modeling_hourglass_llama.py").is_file()
    assert (tmp_path / "hourglass_llama" / "configuration_hourglass_llama.py").is_file()
    assert "auto_map" in json.loads((tmp_path / "hourglass_llama" / "config.json").read_text())
    assert not list(tmp_path.glob(".*")), "a staging folder was left behind"

    rows = table_rows(capsys.readouterr().out)
    assert set(rows) == set(MODELS)
    for row in rows.values():
        assert math.isfinite(float(row["train loss"])) and math.isfinite(float(row["val loss"]))
    # Matched budgets: the same non-embedding parameters to 1%, half the KV cache (half the layers, same attention).
    llama, hourglass = (int(rows[name]["non-emb params"].replace(",", "")) for name in MODELS)
    assert abs(hourglass - llama) < 0.01 * llama
    assert int(rows["llama"]["KV bytes/token (bf16)"]) == 2 * int(rows["hourglass_llama"]["KV bytes/token (bf16)"])
