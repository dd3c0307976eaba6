"""Read a llama2.c checkpoint (karpathy/llama2.c, legacy "version 0" export) and its tokenizer `.bin` as a K = 1
HourglassLlama, i.e. a plain Llama, plus a Hugging Face fast tokenizer.

Checkpoint layout: 7 little-endian int32 (dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len; a
negative vocab_size means the classifier is not shared with the token embedding and is stored last), then float32
arrays: token_embedding [V, d], rms_att [L, d], wq [L, d, d], wk [L, kv, d], wv [L, kv, d], wo [L, d, d],
rms_ffn [L, d], w1 [L, h, d], w2 [L, d, h], w3 [L, h, d], rms_final [d], freq_cis_real and freq_cis_imag
[seq_len, head_size / 2] each (unused), and wcls [V, d] when not shared. Matrices are [out, in] like nn.Linear.

llama2.c rotates adjacent pairs (x[2i], x[2i+1]) of each head (Meta's layout); transformers' Llama rotates
(x[i], x[i + head_size / 2]). Rows 2i and 2i + 1 of each head of wq and wk therefore move to rows i and
i + head_size / 2, which gives the same attention scores (the permutation is applied to q and k alike).

Tokenizer layout: int32 max_token_length, then per token: float32 score, int32 byte length, the bytes. Pieces use
" " where SentencePiece uses "▁", BOS and EOS are stored as "\\n<s>\\n" and "\\n</s>\\n", byte-fallback pieces are
"<0xXX>". llama2.c encodes by prepending " ", splitting into UTF-8 characters (unknown ones become their bytes,
id = byte + 3), then repeatedly merging the adjacent pair whose concatenation is a piece of the highest score; the
BPE built here has, for every piece, a merge for each split of it into two pieces, ranked by that piece's score.
"""

import struct
from pathlib import Path

import numpy as np
import torch

from ..configuration import HourglassLlamaConfig
from .io import Checkpoint, ConversionError

HEADER_FIELDS = ("dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "seq_len")
HEADER_BYTES = 4 * len(HEADER_FIELDS)
VERSIONED_MAGIC = 0x616B3432  # "ak42": llama2.c's version 1 / 2 exports, which have another layout
FLOAT_BYTES = 4
BYTE_PIECE = "<0x{:02X}>"
SPACE = "\u2581"  # SentencePiece's "▁"
SPECIAL_PIECES = {"\n<s>\n": "<s>", "\n</s>\n": "</s>", "<s>": "<s>", "</s>": "</s>", "<unk>": "<unk>"}
SPECIAL_IDS = {"<unk>": 0, "<s>": 1, "</s>": 2}  # run.c's fixed ids: BOS 1 starts and ends texts, byte ids are + 3


def read_header(path):
    """The 7 header ints of a llama2.c legacy checkpoint, as a dict; refuses versioned exports and implausible
    values."""
    with open(path, "rb") as handle:
        raw = handle.read(HEADER_BYTES)
    if len(raw) < HEADER_BYTES:
        raise ConversionError(f"{path} is too short for a llama2.c header ({len(raw)} bytes, need {HEADER_BYTES})")
    if struct.unpack("<I", raw[:4])[0] == VERSIONED_MAGIC:
        raise ConversionError(
            f"{path} is a versioned llama2.c export (magic 'ak42'); only the legacy (version 0) format is supported: "
            "export with `python export.py --version 0`"
        )
    header = dict(zip(HEADER_FIELDS, struct.unpack("<7i", raw)))
    bad = [f"{name}={value}" for name, value in header.items() if name != "vocab_size" and value <= 0]
    if header["vocab_size"] == 0:
        bad.append("vocab_size=0")
    if bad:
        raise ConversionError(f"{path} is not a llama2.c checkpoint: implausible header values {', '.join(bad)}")
    dim, n_heads, n_kv_heads = header["dim"], header["n_heads"], header["n_kv_heads"]
    if dim % n_heads:
        raise ConversionError(f"{path}: dim {dim} is not divisible by n_heads {n_heads}")
    if n_heads % n_kv_heads:
        raise ConversionError(f"{path}: n_heads {n_heads} is not divisible by n_kv_heads {n_kv_heads}")
    if (dim // n_heads) % 2:
        raise ConversionError(f"{path}: head size {dim // n_heads} is odd, which rotary embeddings cannot use")
    return header


def layout(header):
    """[(name, shape)] of the float32 arrays in file order (None for the skipped RoPE tables); shapes of per-layer
    arrays include the layer axis."""
    dim, hidden, layers = header["dim"], header["hidden_dim"], header["n_layers"]
    head_size = dim // header["n_heads"]
    kv_dim = header["n_kv_heads"] * head_size
    vocab = abs(header["vocab_size"])
    arrays = [
        ("token_embedding", (vocab, dim)),
        ("rms_att", (layers, dim)),
        ("wq", (layers, dim, dim)),
        ("wk", (layers, kv_dim, dim)),
        ("wv", (layers, kv_dim, dim)),
        ("wo", (layers, dim, dim)),
        ("rms_ffn", (layers, dim)),
        ("w1", (layers, hidden, dim)),
        ("w2", (layers, dim, hidden)),
        ("w3", (layers, hidden, dim)),
        ("rms_final", (dim,)),
        (None, (header["seq_len"], head_size // 2)),  # freq_cis_real
        (None, (header["seq_len"], head_size // 2)),  # freq_cis_imag
    ]
    if header["vocab_size"] < 0:
        arrays.append(("wcls", (vocab, dim)))
    return arrays


def pairs_to_halves(weight, num_heads):
    """Reorder the output rows of a q or k projection from llama2.c's pairwise RoPE layout (rows 2i, 2i + 1 of a
    head rotate together) to transformers' rotate-half layout (rows i, i + head_size / 2)."""
    out_features, in_features = weight.shape
    head_size = out_features // num_heads
    return weight.reshape(num_heads, head_size // 2, 2, in_features).transpose(1, 2).reshape(out_features, in_features)


class _Array:
    """One float32 array of the checkpoint, read from its offset only when asked for."""

    def __init__(self, path, offset, shape):
        self.path, self.offset, self.shape = path, offset, shape

    def load(self, layer=None, permute_heads=None):
        shape = self.shape if layer is None else self.shape[1:]
        offset = self.offset if layer is None else self.offset + layer * FLOAT_BYTES * int(np.prod(shape))
        array = np.memmap(self.path, dtype="<f4", mode="r", offset=offset, shape=shape)
        tensor = torch.from_numpy(np.array(array, dtype=np.float32))  # a copy: the file stays closed afterwards
        del array
        if permute_heads is not None:
            tensor = pairs_to_halves(tensor, permute_heads)
        return tensor


def find_tokenizer(checkpoint_path):
    """The llama2.c tokenizer beside a checkpoint (`tokenizer.bin` or `tok*.bin`), None if there is none."""
    folder = checkpoint_path.parent
    candidates = sorted(
        {path for path in [*folder.glob("tok*.bin"), folder / "tokenizer.bin"] if path.is_file()}
        - {checkpoint_path}
    )
    if len(candidates) > 1:
        names = ", ".join(path.name for path in candidates)
        raise ConversionError(
            f"several llama2.c tokenizers beside {checkpoint_path} ({names}); pass the one to use as tokenizer_path"
        )
    return candidates[0] if candidates else None


def read_tokenizer_bin(path, vocab_size=None):
    """(pieces as bytes, scores, max_token_length) of a llama2.c tokenizer file. The file does not store its size;
    every entry up to the end is read and the count must equal `vocab_size` when given."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ConversionError(f"{path} not found") from None
    if len(data) < 4:
        raise ConversionError(f"{path} is too short for a llama2.c tokenizer ({len(data)} bytes)")
    (max_token_length,) = struct.unpack_from("<i", data, 0)
    pieces, scores, offset = [], [], 4
    while offset < len(data):
        if offset + 8 > len(data):
            raise ConversionError(f"{path} is truncated: entry {len(pieces)} ends after byte {len(data)}")
        score, length = struct.unpack_from("<fi", data, offset)
        offset += 8
        if length < 0 or offset + length > len(data):
            raise ConversionError(
                f"{path} is truncated or not a llama2.c tokenizer: entry {len(pieces)} claims {length} bytes at "
                f"offset {offset} of {len(data)}"
            )
        pieces.append(data[offset : offset + length])
        scores.append(score)
        offset += length
    if vocab_size is not None and len(pieces) != vocab_size:
        raise ConversionError(f"{path} has {len(pieces)} tokens but the checkpoint's vocabulary has {vocab_size}")
    return pieces, scores, max_token_length


def build_tokenizer(pieces, scores, source="tokenizer", model_max_length=None):
    """A `PreTrainedTokenizerFast` that encodes and decodes like llama2.c with this vocabulary (a SentencePiece-style
    BPE with byte fallback), adding BOS in front of every text."""
    from tokenizers import AddedToken, Tokenizer, decoders, normalizers, processors
    from tokenizers.models import BPE
    from transformers import PreTrainedTokenizerFast

    vocab, special = {}, {}
    for index, raw in enumerate(pieces):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise ConversionError(f"{source}: token {index} ({raw!r}) is not valid UTF-8") from None
        if text in SPECIAL_PIECES:
            text = SPECIAL_PIECES[text]
            special[text] = text
        else:
            text = text.replace(" ", SPACE)
        if text in vocab:
            raise ConversionError(f"{source}: token {index} ({raw!r}) repeats token {vocab[text]}")
        vocab[text] = index
    for name, expected in SPECIAL_IDS.items():
        if vocab.get(name, expected) != expected or (name != "</s>" and name not in vocab):
            raise ConversionError(f"{source}: llama2.c needs {name} as token {expected}, found {vocab.get(name)}")
    byte_pieces = {BYTE_PIECE.format(byte) for byte in range(256)}
    missing = byte_pieces - set(vocab)
    if missing:  # byte fallback needs every byte; llama2.c would emit id byte + 3 regardless
        raise ConversionError(f"{source} lacks {len(missing)} byte-fallback tokens, e.g. {sorted(missing)[0]}")

    # llama2.c merges any adjacent pair whose concatenation is a token, the highest-scoring result first.
    excluded = byte_pieces | set(special.values())
    ordinary = {text: index for text, index in vocab.items() if text not in excluded}
    merges = []
    for text, index in ordinary.items():
        for cut in range(1, len(text)):
            left, right = text[:cut], text[cut:]
            if left in ordinary and right in ordinary:
                merges.append((-scores[index], index, ordinary[left], ordinary[right], left, right))
    merges.sort()
    model = BPE(
        vocab=vocab,
        merges=[(left, right) for *_, left, right in merges],
        unk_token="<unk>",
        fuse_unk=True,
        byte_fallback=True,
    )
    backend = Tokenizer(model)
    backend.add_special_tokens([AddedToken(name, special=True, normalized=False) for name in special.values()])
    backend.normalizer = normalizers.Sequence([normalizers.Prepend(SPACE), normalizers.Replace(" ", SPACE)])
    backend.decoder = decoders.Sequence(
        [decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    backend.post_processor = processors.TemplateProcessing(
        single="<s>:0 $A:0", pair="<s>:0 $A:0 <s>:1 $B:1", special_tokens=[("<s>", vocab["<s>"])]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<s>",
        eos_token=special.get("</s>"),
        unk_token="<unk>",
        add_bos_token=True,
        add_eos_token=False,
        clean_up_tokenization_spaces=False,
        model_max_length=model_max_length,
    )


def read_llama2c(checkpoint_path, tokenizer_path=None):
    """A llama2.c legacy checkpoint as a `Checkpoint` of a K = 1 HourglassLlama (tensors read lazily from the file)
    with the llama2.c tokenizer given, or found beside it, as a Hugging Face fast tokenizer."""
    path = Path(checkpoint_path)
    if not path.is_file():
        raise ConversionError(f"{path} is not a file; a llama2.c checkpoint is one .bin file")
    header = read_header(path)
    arrays, offset = {}, HEADER_BYTES
    for name, shape in layout(header):
        if name is not None:
            arrays[name] = _Array(path, offset, shape)
        offset += FLOAT_BYTES * int(np.prod(shape))
    actual = path.stat().st_size
    if actual != offset:
        described = ", ".join(f"{name} {value}" for name, value in header.items())
        raise ConversionError(
            f"{path} has {actual} bytes but its llama2.c header ({described}) implies {offset}: "
            + ("the file is truncated" if actual < offset else "the file has extra data or is not a legacy export")
        )

    vocab = abs(header["vocab_size"])
    tied = header["vocab_size"] > 0
    n_heads, n_kv_heads = header["n_heads"], header["n_kv_heads"]
    config = HourglassLlamaConfig(
        vocab_size=vocab,
        hidden_size=header["dim"],
        intermediate_size=header["hidden_dim"],
        num_hidden_layers=header["n_layers"],
        num_attention_heads=n_heads,
        num_key_value_heads=n_kv_heads,
        head_dim=header["dim"] // n_heads,
        num_mlp_layers=1,
        mlp_intermediate_sizes=header["hidden_dim"],
        max_position_embeddings=header["seq_len"],
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=tied,
        bos_token_id=1,
        # run.c stops at BOS too: TinyStories-style training data separates documents with BOS alone, so BOS is
        # what these models emit at the end of a text (stories260K does, 346 tokens in from BOS, greedy).
        eos_token_id=[2, 1],
        pad_token_id=None,
    )

    def loader(name, layer=None, permute_heads=None):
        return lambda: arrays[name].load(layer, permute_heads)

    tensors = {"model.embed_tokens.weight": loader("token_embedding")}
    for i in range(header["n_layers"]):
        prefix = f"model.layers.{i}."
        tensors[prefix + "input_layernorm.weight"] = loader("rms_att", i)
        tensors[prefix + "self_attn.q_proj.weight"] = loader("wq", i, n_heads)
        tensors[prefix + "self_attn.k_proj.weight"] = loader("wk", i, n_kv_heads)
        tensors[prefix + "self_attn.v_proj.weight"] = loader("wv", i)
        tensors[prefix + "self_attn.o_proj.weight"] = loader("wo", i)
        tensors[prefix + "post_attention_layernorm.0.weight"] = loader("rms_ffn", i)
        tensors[prefix + "mlp.0.gate_proj.weight"] = loader("w1", i)
        tensors[prefix + "mlp.0.down_proj.weight"] = loader("w2", i)
        tensors[prefix + "mlp.0.up_proj.weight"] = loader("w3", i)
    tensors["model.norm.weight"] = loader("rms_final")
    if not tied:
        tensors["lm_head.weight"] = loader("wcls")

    checkpoint = Checkpoint(config=config, tensors=tensors, base_model=f"{path.name} (llama2.c)")
    tokenizer_path = Path(tokenizer_path) if tokenizer_path is not None else find_tokenizer(path)
    if tokenizer_path is None:
        checkpoint.notes.append(
            f"no llama2.c tokenizer (tokenizer.bin or tok*.bin) beside {path.name}; the folder has no tokenizer"
        )
    else:
        pieces, scores, _ = read_tokenizer_bin(tokenizer_path, vocab)
        checkpoint.tokenizer = build_tokenizer(
            pieces, scores, source=str(tokenizer_path), model_max_length=header["seq_len"]
        )
        checkpoint.notes.append(f"tokenizer from {tokenizer_path.name}")
    return checkpoint
