"""llama2.c checkpoints and tokenizers: stories260K converts into a folder whose own model and tokenizer reproduce
llama2.c's greedy output byte for byte; the conversion is a plain Llama; a random llama2.c checkpoint with an
unshared classifier matches a llama2.c forward pass written here from the format; the tokenizer encodes like
llama2.c's `encode`; broken files are refused."""

import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer, pipeline

from shapeformers.conversion.io import ConversionError
from shapeformers.conversion.llama2c import read_llama2c
from shapeformers.conversion.writer import write_checkpoint

from .test_hourglass_llama_equivalence import llama_twin, to_llama_names

pytestmark = pytest.mark.matrix  # a few seconds, and it loads, generates and tokenizes through the Auto classes

DATA = Path(__file__).parents[1].parent / "shared" / "data"
STORIES = DATA / "checkpoints" / "stories260K"
needs_stories = pytest.mark.skipif(
    not (STORIES / "stories260K.bin").exists() or not (STORIES / "tok512.bin").exists(),
    reason=f"the stories260K llama2.c checkpoint is not at {STORIES} (the shared data folder beside the repository)",
)

# karpathy/llama2.c test_all.py: `./run stories260K.bin -z tok512.bin -t 0.0 -n 200` prints exactly this.
EXPECTED_STORIES260K = (
    b"Once upon a time, there was a little girl named Lily. She loved to play outside in the park. One day, she saw "
    b"a big, red ball. She wanted to play with it, but it was too high.\nLily's mom said, \"Lily, let's go to the "
    b"park.\" Lily was sad and didn't know what to do. She said, \"I want to play with your ball, but I can't find "
    b"it.\"\nLily was sad and didn't know what to do. She said, \"I'm sorry, Lily. I didn't know what to do.\"\nLily "
    b"didn't want to help her mom, so she"
)

SENTENCES = [
    "Once upon a time, there was a little girl named Lily.",
    'Lily\'s mom said, "Let\'s go to the park!"\nThey went.\n\nThe end.',
    "  two leading spaces, and   three inside  ",
    "Café naïve — “quoted” ‘single’ … ñ 3 + 4 = 7 (100%)",
    "日本語 and emoji 😀🎉 and a tab\there",
    "\n",
    " ",
    "a",
]


# --- llama2.c, written plainly from its format and its run.c -------------------------------------------------------


def read_tokenizer_plainly(path):
    data = Path(path).read_bytes()
    pieces, scores, offset = [], [], 4
    while offset < len(data):
        score, length = struct.unpack_from("<fi", data, offset)
        pieces.append(data[offset + 8 : offset + 8 + length])
        scores.append(score)
        offset += 8 + length
    return pieces, scores


def llama2c_encode(text, pieces, scores):
    """run.c's encode(text, bos=1, eos=0): a " " prefix, UTF-8 characters (unknown ones as their bytes + 3), then
    the adjacent pair whose concatenation is a token of the highest score is merged until none is."""
    lookup = {piece: index for index, piece in enumerate(pieces)}
    tokens = [1]
    if text:
        tokens.append(lookup[b" "])
    for char in text:
        raw = char.encode("utf-8")
        tokens.extend([lookup[raw]] if raw in lookup else [byte + 3 for byte in raw])
    while True:
        best_score, best_id, best_index = -1e10, None, None
        for index in range(len(tokens) - 1):
            merged = lookup.get(pieces[tokens[index]] + pieces[tokens[index + 1]])
            if merged is not None and scores[merged] > best_score:
                best_score, best_id, best_index = scores[merged], merged, index
        if best_id is None:
            return tokens
        tokens[best_index : best_index + 2] = [best_id]


def read_llama2c_plainly(path):
    """The header and the float32 arrays of a legacy llama2.c checkpoint, as run.c's memory_map_weights lays them."""
    data = Path(path).read_bytes()
    dim, hidden, layers, heads, kv_heads, vocab, seq_len = struct.unpack_from("<7i", data, 0)
    floats = np.frombuffer(data, dtype="<f4", offset=28)
    head_size, shared = dim // heads, vocab > 0
    vocab = abs(vocab)
    position = 0

    def take(*shape):
        nonlocal position
        count = int(np.prod(shape))
        array = floats[position : position + count].reshape(shape)
        position += count
        return array

    w = {}
    w["embedding"] = take(vocab, dim)
    w["rms_att"] = take(layers, dim)
    w["wq"] = take(layers, heads * head_size, dim)
    w["wk"] = take(layers, kv_heads * head_size, dim)
    w["wv"] = take(layers, kv_heads * head_size, dim)
    w["wo"] = take(layers, dim, heads * head_size)
    w["rms_ffn"] = take(layers, dim)
    w["w1"] = take(layers, hidden, dim)
    w["w2"] = take(layers, dim, hidden)
    w["w3"] = take(layers, hidden, dim)
    w["rms_final"] = take(dim)
    take(seq_len, head_size // 2)  # freq_cis_real
    take(seq_len, head_size // 2)  # freq_cis_imag
    w["wcls"] = w["embedding"] if shared else take(vocab, dim)
    assert position == floats.size
    params = dict(dim=dim, layers=layers, heads=heads, kv_heads=kv_heads, head_size=head_size, vocab=vocab)
    return params, w


def llama2c_logits(path, tokens):
    """run.c's forward() for each position in turn (float64): RMSNorm eps 1e-5, RoPE on adjacent pairs of each
    head with theta 10000, grouped-query attention over the cache, SwiGLU, classifier."""
    p, w = read_llama2c_plainly(path)
    w = {name: array.astype(np.float64) for name, array in w.items()}
    hs = p["head_size"]
    kv_mul = p["heads"] // p["kv_heads"]

    def rmsnorm(x, weight):
        return weight * (x / np.sqrt(np.mean(x * x) + 1e-5))

    def rope(vec, pos):
        vec = vec.copy()
        for i in range(0, vec.size, 2):
            freq = 1.0 / 10000.0 ** ((i % hs) / hs)
            c, s = np.cos(pos * freq), np.sin(pos * freq)
            v0, v1 = vec[i], vec[i + 1]
            vec[i], vec[i + 1] = v0 * c - v1 * s, v0 * s + v1 * c
        return vec

    key_cache = [[] for _ in range(p["layers"])]
    value_cache = [[] for _ in range(p["layers"])]
    logits = []
    for pos, token in enumerate(tokens):
        x = w["embedding"][token].copy()
        for layer in range(p["layers"]):
            xb = rmsnorm(x, w["rms_att"][layer])
            q = rope(w["wq"][layer] @ xb, pos)
            key_cache[layer].append(rope(w["wk"][layer] @ xb, pos))
            value_cache[layer].append(w["wv"][layer] @ xb)
            out = np.zeros(p["heads"] * hs)
            for h in range(p["heads"]):
                kv = h // kv_mul
                qh = q[h * hs : (h + 1) * hs]
                keys = np.stack([k[kv * hs : (kv + 1) * hs] for k in key_cache[layer]])
                values = np.stack([v[kv * hs : (kv + 1) * hs] for v in value_cache[layer]])
                att = keys @ qh / np.sqrt(hs)
                att = np.exp(att - att.max())
                out[h * hs : (h + 1) * hs] = (att / att.sum()) @ values
            x = x + w["wo"][layer] @ out
            xb = rmsnorm(x, w["rms_ffn"][layer])
            h1, h3 = w["w1"][layer] @ xb, w["w3"][layer] @ xb
            x = x + w["w2"][layer] @ (h1 / (1 + np.exp(-h1)) * h3)
        logits.append(w["wcls"] @ rmsnorm(x, w["rms_final"]))
    return np.stack(logits)


def write_llama2c(path, dim=32, hidden=48, layers=2, heads=4, kv_heads=2, vocab=37, seq_len=16, shared=False, seed=0):
    """A random legacy llama2.c checkpoint; the unused RoPE tables are NaN so that reading them would show."""
    rng = np.random.default_rng(seed)
    head_size = dim // heads

    def randn(*shape, scale=0.2):
        return (scale * rng.standard_normal(shape)).astype("<f4")

    def norms(*shape):
        return (1 + 0.1 * rng.standard_normal(shape)).astype("<f4")

    arrays = [
        randn(vocab, dim, scale=0.5),
        norms(layers, dim),
        randn(layers, dim, dim),
        randn(layers, kv_heads * head_size, dim),
        randn(layers, kv_heads * head_size, dim),
        randn(layers, dim, dim),
        norms(layers, dim),
        randn(layers, hidden, dim),
        randn(layers, dim, hidden),
        randn(layers, hidden, dim),
        norms(dim),
        np.full((seq_len, head_size // 2), np.nan, dtype="<f4"),
        np.full((seq_len, head_size // 2), np.nan, dtype="<f4"),
    ]
    if not shared:
        arrays.append(randn(vocab, dim))
    with open(path, "wb") as handle:
        handle.write(struct.pack("<7i", dim, hidden, layers, heads, kv_heads, vocab if shared else -vocab, seq_len))
        for array in arrays:
            handle.write(array.tobytes())
    return path


# --- stories260K ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def stories_folder(tmp_path_factory):
    if not (STORIES / "stories260K.bin").exists() or not (STORIES / "tok512.bin").exists():
        pytest.skip(f"the stories260K llama2.c checkpoint is not at {STORIES}")
    checkpoint = read_llama2c(STORIES / "stories260K.bin")
    destination = tmp_path_factory.mktemp("llama2c") / "stories260K"
    write_checkpoint(checkpoint, destination)
    return destination


@pytest.fixture
def one_thread():
    """200 steps of a 260K-parameter model are overhead-bound: one thread is several times faster on a busy host."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@needs_stories
def test_stories260k_greedy_text_matches_llama2c(stories_folder, one_thread):
    model = AutoModelForCausalLM.from_pretrained(stories_folder, trust_remote_code=True).eval()
    tokenizer = AutoTokenizer.from_pretrained(stories_folder, trust_remote_code=True)
    assert model.config.model_type == "hourglass_llama" and model.config.num_mlp_layers == 1
    assert model.config.tie_word_embeddings and model.config.vocab_size == 512
    # llama2.c's run loop with -n 200: positions 0..199 each produce one token after BOS, printed unless it is BOS.
    with torch.no_grad():
        output = model.generate(torch.tensor([[tokenizer.bos_token_id]]), max_new_tokens=200, do_sample=False)
    assert output.shape == (1, 201) and 1 not in output[0, 1:].tolist()
    text = tokenizer.decode(output[0], skip_special_tokens=True)
    assert text.encode("utf-8") == EXPECTED_STORIES260K


@needs_stories
def test_stories260k_stops_where_llama2c_stops(stories_folder, one_thread):
    """run.c ends a text at BOS as well as EOS; so does the converted folder's generation config."""
    model = AutoModelForCausalLM.from_pretrained(stories_folder, trust_remote_code=True).eval()
    assert model.generation_config.eos_token_id == [2, 1]
    with torch.no_grad():
        output = model.generate(torch.tensor([[1]]), max_new_tokens=500, do_sample=False)[0].tolist()
        unstopped = model.generate(torch.tensor([[1]]), max_new_tokens=500, do_sample=False, eos_token_id=2)[0]
    assert output[-1] == 1 and 1 not in output[1:-1] and 2 not in output[1:]  # the story ends at its BOS
    assert len(output) < 501 and unstopped.tolist()[: len(output)] == output and len(unstopped) == 501


@needs_stories
def test_stories260k_in_a_text_generation_pipeline(stories_folder, one_thread):
    generator = pipeline("text-generation", model=str(stories_folder), trust_remote_code=True)
    text = generator("Once upon a time", max_new_tokens=20, do_sample=False)[0]["generated_text"]
    assert text.startswith("Once upon a time") and len(text) > len("Once upon a time") + 10
    # the pipeline starts from BOS, as llama2.c does with a prompt
    assert generator.tokenizer("Once upon a time").input_ids[0] == 1


@needs_stories
def test_stories260k_is_a_plain_llama(stories_folder):
    ours = AutoModelForCausalLM.from_pretrained(stories_folder, trust_remote_code=True).eval()
    llama = llama_twin(ours.config)
    state_dict = to_llama_names(load_file(stories_folder / "model.safetensors"))
    missing, unexpected = llama.load_state_dict(state_dict, strict=False)
    assert missing == ["lm_head.weight"] and not unexpected  # tied: the head is the embedding
    llama.tie_weights()
    assert torch.equal(llama.lm_head.weight, llama.model.embed_tokens.weight)
    input_ids = torch.randint(0, 512, (2, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        difference = (llama.eval()(input_ids).logits - ours(input_ids).logits).abs().max().item()
    assert difference <= 1e-5


@needs_stories
def test_stories260k_logits_match_llama2c_forward(stories_folder):
    ours = AutoModelForCausalLM.from_pretrained(stories_folder, trust_remote_code=True).eval()
    tokens = [1, 403, 407, 261, 378, 432, 383, 286, 261, 376]  # BOS "Once upon a time, there was a little"
    expected = llama2c_logits(STORIES / "stories260K.bin", tokens)
    with torch.no_grad():
        logits = ours(torch.tensor([tokens])).logits[0].double().numpy()
    assert np.abs(logits - expected).max() <= 1e-4  # logits of about 10 in float32


@needs_stories
@pytest.mark.parametrize("text", SENTENCES)
def test_tokenizer_encodes_like_llama2c(stories_folder, text):
    pieces, scores = read_tokenizer_plainly(STORIES / "tok512.bin")
    tokenizer = AutoTokenizer.from_pretrained(stories_folder, trust_remote_code=True)
    ids = tokenizer(text).input_ids
    assert ids == llama2c_encode(text, pieces, scores)
    assert tokenizer.decode(ids, skip_special_tokens=True) == text


@needs_stories
def test_tokenizer_special_tokens(stories_folder):
    tokenizer = AutoTokenizer.from_pretrained(stories_folder, trust_remote_code=True)
    assert (tokenizer.unk_token, tokenizer.bos_token, tokenizer.eos_token) == ("<unk>", "<s>", "</s>")
    assert (tokenizer.unk_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id) == (0, 1, 2)
    assert len(tokenizer) == 512
    assert tokenizer("").input_ids == [1]
    assert tokenizer("hi", add_special_tokens=False).input_ids == tokenizer("hi").input_ids[1:]
    assert tokenizer.convert_ids_to_tokens([13, 259, 410]) == ["<0x0A>", "\u2581t", "\u2581"]


# --- a random llama2.c checkpoint -------------------------------------------------------------------------------


@pytest.mark.parametrize("shared", [False, True], ids=["unshared-classifier", "shared-classifier"])
def test_random_checkpoint_matches_llama2c_forward(tmp_path, shared):
    source = write_llama2c(tmp_path / "model.bin", shared=shared)
    checkpoint = read_llama2c(source)
    assert checkpoint.tokenizer is None and any("no llama2.c tokenizer" in note for note in checkpoint.notes)
    config = checkpoint.config
    assert (config.vocab_size, config.hidden_size, config.num_hidden_layers) == (37, 32, 2)
    assert (config.num_attention_heads, config.num_key_value_heads, config.head_dim) == (4, 2, 8)
    assert config.mlp_intermediate_sizes == [48] and config.max_position_embeddings == 16
    assert config.tie_word_embeddings == shared and config.rms_norm_eps == 1e-5
    assert ("lm_head.weight" in checkpoint.tensors) != shared
    write_checkpoint(checkpoint, tmp_path / "converted")

    model = AutoModelForCausalLM.from_pretrained(tmp_path / "converted", trust_remote_code=True).eval()
    tokens = [1, 5, 36, 0, 17, 17, 2, 30, 9, 11, 4, 33]
    with torch.no_grad():
        logits = model(torch.tensor([tokens])).logits[0].double().numpy()
    expected = llama2c_logits(source, tokens)
    assert np.abs(logits - expected).max() <= 1e-5


def test_multiple_tokenizers_need_an_explicit_path(tmp_path):
    source = write_llama2c(tmp_path / "model.bin")
    pieces = [b"<unk>", b"\n<s>\n", b"\n</s>\n"] + [f"<0x{byte:02X}>".encode() for byte in range(256)]
    with open(tmp_path / "tok.bin", "wb") as handle:  # 259 tokens: does not fit the 37-token model
        handle.write(struct.pack("<i", 6))
        for piece in pieces:
            handle.write(struct.pack("<fi", 0.0, len(piece)) + piece)
    with pytest.raises(ConversionError, match="259 tokens .* 37"):
        read_llama2c(source)
    shutil.copy(tmp_path / "tok.bin", tmp_path / "tokenizer.bin")
    with pytest.raises(ConversionError, match="several llama2.c tokenizers.*tok.bin, tokenizer.bin"):
        read_llama2c(source)


@needs_stories
def test_explicit_tokenizer_path(tmp_path):
    shutil.copy(STORIES / "stories260K.bin", tmp_path / "model.bin")
    assert read_llama2c(tmp_path / "model.bin").tokenizer is None
    checkpoint = read_llama2c(tmp_path / "model.bin", tokenizer_path=STORIES / "tok512.bin")
    assert checkpoint.tokenizer("Once upon a time").input_ids == [1, 403, 407, 261, 378]


# --- broken files -----------------------------------------------------------------------------------------------


def test_truncated_checkpoint_is_refused_and_leaves_nothing(tmp_path):
    source = write_llama2c(tmp_path / "model.bin")
    size = source.stat().st_size
    data = source.read_bytes()
    source.write_bytes(data[:-4])
    with pytest.raises(ConversionError, match=f"model.bin has {size - 4} bytes .* implies {size}.*truncated"):
        write_checkpoint(read_llama2c(source), tmp_path / "out")
    source.write_bytes(data + b"\0" * 8)
    with pytest.raises(ConversionError, match=f"{size + 8} bytes .* implies {size}.*extra data"):
        write_checkpoint(read_llama2c(source), tmp_path / "out")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["model.bin"]


@pytest.mark.parametrize(
    "header, message",
    [
        ((32, 48, 2, 4, 2, 0, 16), "vocab_size=0"),
        ((32, 48, 0, 4, 2, 37, 16), "n_layers=0"),
        ((32, 48, 2, 5, 5, 37, 16), "not divisible by n_heads"),
        ((32, 48, 2, 4, 3, 37, 16), "not divisible by n_kv_heads"),
        ((0x616B3432, 1, 0, 0, 0, 0, 0), "versioned llama2.c export"),
    ],
)
def test_bad_headers_are_refused(tmp_path, header, message):
    path = tmp_path / "model.bin"
    path.write_bytes(struct.pack("<7i", *header) + b"\0" * 64)
    with pytest.raises(ConversionError, match=message):
        read_llama2c(path)
