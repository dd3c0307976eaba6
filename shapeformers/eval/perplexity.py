"""Perplexity of a causal LM on a text file, with a sliding window.

The text is tokenized whole (no special tokens) and, as lm-eval's `loglikelihood_rolling` does, a prefix token
(BOS, else EOS) is put in front so that the first token is scored too. Windows of at most `max_length` tokens end
`stride` tokens apart; each window scores only the tokens no earlier window scored, so every token is scored once,
with between `max_length - stride + 1` and `max_length` tokens of context (except near the start). `stride =
max_length` (the default) is lm-eval's own rolling windows, token for token; a smaller stride gives every token more
context at more compute (Hugging Face's perplexity guide uses `stride = max_length / 2`).

Reported, from the total negative log-likelihood NLL (nats) over the scored tokens:
- token perplexity `exp(NLL / tokens)`: depends on the tokenizer;
- word perplexity `exp(NLL / words)` with `words = len(re.split(r"\\s+", text))`, which is how lm-eval's `wikitext`
  task counts words (on the text as given, before any detokenization);
- byte perplexity `exp(NLL / utf-8 bytes)` and bits per byte `NLL / bytes / ln 2`, also as lm-eval reports them.
"""

import gzip
import math
import re
from pathlib import Path

import torch


def read_text(path):
    """The text of `path` (UTF-8, `.gz` allowed), line endings kept as they are in the file."""
    data = Path(path).read_bytes()
    if str(path).endswith(".gz"):
        data = gzip.decompress(data)
    return data.decode("utf-8")


def count_words(text):
    """Words as lm-eval's wikitext task counts them."""
    return len(re.split(r"\s+", text))


def default_prefix_token_id(tokenizer):
    """lm-eval's choice (`HFLM.prefix_token_id`): BOS, else EOS."""
    return tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id


def windows(num_ids, max_length, stride):
    """(input start, input end, tokens scored) of each window over ids[0:num_ids], whose ids[0] is context only.

    Targets 1..num_ids-1 are cut into chunks of `stride`; the chunk of targets [a, b) reads ids[max(0, b - 1 -
    max_length) : b - 1] and scores the last b - a of its logits."""
    if not 1 <= stride <= max_length:
        raise ValueError(f"stride must be between 1 and max_length ({max_length}), got {stride}")
    result = []
    for start in range(1, num_ids, stride):
        end = min(start + stride, num_ids)
        result.append((max(0, end - 1 - max_length), end - 1, end - start))
    return result


@torch.no_grad()
def sliding_window_nll(model, ids, max_length, stride=None, batch_size=1, progress=True):
    """(total NLL in nats as a float, number of tokens scored) of ids[1:] given what precedes each."""
    from tqdm.auto import tqdm

    stride = max_length if stride is None else stride
    ids = torch.as_tensor(ids, dtype=torch.long)
    device = next(model.parameters()).device
    spans = windows(len(ids), max_length, stride)
    # Windows of the same length batch together (all but possibly the first and the last are max_length long).
    by_length = {}
    for span in spans:
        by_length.setdefault(span[1] - span[0], []).append(span)
    total, count = torch.zeros((), dtype=torch.float64), 0
    bar = tqdm(total=len(spans), desc="perplexity windows", unit="window", disable=not progress)
    for length, group in by_length.items():
        for first in range(0, len(group), batch_size):
            batch = group[first : first + batch_size]
            inputs = torch.stack([ids[start:end] for start, end, _ in batch]).to(device)
            targets = torch.stack([ids[start + 1 : end + 1] for start, end, _ in batch]).to(device)
            logits = model(input_ids=inputs).logits.float()
            log_probs = torch.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
            for row, (_, _, scored) in enumerate(batch):
                total -= log_probs[row, length - scored :].double().sum().cpu()
                count += scored
            bar.update(len(batch))
    bar.close()
    return total.item(), count


def perplexity(model, tokenizer, text, max_length, stride=None, batch_size=1, prefix_token_id="auto", progress=True):
    """Token, word and byte perplexity of `text` (see the module docstring). `prefix_token_id`: "auto" for lm-eval's
    choice, None to score from the second token on."""
    if prefix_token_id == "auto":
        prefix_token_id = default_prefix_token_id(tokenizer)
    ids = tokenizer(text, add_special_tokens=False, return_attention_mask=False, verbose=False)["input_ids"]
    if prefix_token_id is not None:
        ids = [prefix_token_id] + list(ids)
    if len(ids) < 2:
        raise ValueError("the text has too few tokens to score")
    stride = max_length if stride is None else stride
    nll, tokens = sliding_window_nll(model, ids, max_length, stride, batch_size, progress)
    words, num_bytes = count_words(text), len(text.encode("utf-8"))
    return {
        "max_length": max_length,
        "stride": stride,
        "prefix_token_id": prefix_token_id,
        "tokens": tokens,
        "words": words,
        "bytes": num_bytes,
        "nll": nll,
        "token_perplexity": math.exp(nll / tokens),
        "word_perplexity": math.exp(nll / words),
        "byte_perplexity": math.exp(nll / num_bytes),
        "bits_per_byte": nll / num_bytes / math.log(2),
    }


def file_perplexity(model, tokenizer, path, max_length, stride=None, batch_size=1, prefix_token_id="auto",
                    progress=True):  # fmt: skip
    """`perplexity` of the text in `path`, with the file's path and sha256 in the result."""
    from .tasks import sha256

    result = perplexity(model, tokenizer, read_text(path), max_length, stride, batch_size, prefix_token_id, progress)
    return {"file": str(Path(path).resolve()), "sha256": sha256(path), **result}
