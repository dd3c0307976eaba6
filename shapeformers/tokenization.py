"""Saving tokenizers so that every supported transformers release loads them."""

import json
from pathlib import Path


def save_tokenizer(tokenizer, directory):
    """`save_pretrained`, with the class named so that transformers 4.x loads it too: 5.x writes its new
    `TokenizersBackend` name (or none), which 4.x does not know."""
    tokenizer.save_pretrained(directory)
    config_path = Path(directory) / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    if config.get("tokenizer_class") in (None, "TokenizersBackend"):
        config["tokenizer_class"] = "PreTrainedTokenizerFast"
        # 4.x's PreTrainedTokenizerFast would otherwise also return token_type_ids, which generate() refuses.
        config.setdefault("model_input_names", ["input_ids", "attention_mask"])
        config_path.write_text(json.dumps(config, indent=2, sort_keys=True, ensure_ascii=False) + "\n")
