"""Text and tokens for the small training runs: a corpus every machine has, a byte-level BPE tokenizer trained on
it, and batches of random windows (nanoGPT style)."""

import gzip

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

BOS, EOS, PAD = "<s>", "</s>", "<pad>"


def read_corpus(path=None):
    """The text of `path` (plain text, optionally .gz), or by default the English text of Python's own topic help,
    which ships with every CPython install, so the demo needs no download."""
    if path is None:
        from pydoc_data.topics import topics

        return "\n\n".join(topics.values())
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as handle:
        return handle.read()


def split_text(text, val_fraction):
    """(train, validation): the last `val_fraction` of `text`, cut at a line break, is held out."""
    cut = text.rfind("\n", 0, int(len(text) * (1 - val_fraction)))
    cut = cut if cut > 0 else int(len(text) * (1 - val_fraction))
    return text[:cut], text[cut:]


def train_tokenizer(text, vocab_size):
    """A byte-level BPE tokenizer (GPT-2 style: any byte sequence encodes, no special tokens added on encode)."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[BOS, EOS, PAD],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(text.splitlines(keepends=True), trainer)
    # Left padding, so that batched generation continues every prompt from its last token on every release.
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        padding_side="left",
        model_input_names=["input_ids", "attention_mask"],
    )


def encode(tokenizer, text):
    """`text` as one 1-D tensor of token ids."""
    return torch.tensor(tokenizer.backend_tokenizer.encode(text).ids, dtype=torch.long)


def random_batch(ids, batch_size, seq_len, generator):
    """`batch_size` windows of `seq_len` tokens at random offsets; the model shifts labels itself."""
    starts = torch.randint(len(ids) - seq_len, (batch_size,), generator=generator)
    return torch.stack([ids[start : start + seq_len] for start in starts])


def sequential_batches(ids, batch_size, seq_len):
    """Every whole window of `seq_len` tokens in order, `batch_size` at a time (for evaluation)."""
    windows = ids[: len(ids) // seq_len * seq_len].view(-1, seq_len)
    return windows.split(batch_size)
