"""X-shaped BowtieFormer vs the parameter-matched uniform BowtieFormer (= transformers' Granite): accounting, speed,
KV cache and inference memory, in one run.

The X model has the paper's geometric schedule (bottleneck_ratio 0.3 at bottleneck_position 0.75, symmetric ends,
widths multiples of --quantize-to, solved by BowtieFormerConfig so that its parameter count matches the uniform
model of width --hidden-size); the uniform model has every layer at --hidden-size. Both have random weights. It
prints:

  accounting     parameters, forward FLOPs per token at --seq-len and KV-cache bytes per token, all from the configs
  KV cache       bytes of a VariableWidthCache(config, max_cache_len, batch_size, dtype) after a greedy generate()
                 through it; the script asserts they equal the configs' figure
  prefill        tokens/s of a no_grad forward over batch x seq-len prompt tokens
  decode         tokens/s of greedy generate() of --new-tokens tokens (dynamic cache, min = max new tokens) from a
                 16-token prompt, batch --decode-batch; the time includes the short prefill
  peak memory    of a no_grad, no-cache forward over batch x seq-len tokens, above what is allocated before it: the
                 whole model (logits [batch, seq, vocab] included, the same for both) and the decoder stack alone
  depth check    peak memory of the decoder stack for X models of 1/2, 1 and 2 times --layers layers with the same
                 widths (every other layer of the X model, the X model, each of its layers twice, so that every
                 layer's activations are the same size): the model keeps ONE residual buffer, so its peak must stay
                 flat as depth grows; the naive formulation of carry-forward (keep every layer's output, widen from
                 the newest one that has each coordinate; a few lines below, checked to compute the same function)
                 grows by one [batch, seq, width] output per layer, and is shown for comparison.

Speed: repetitions of the two models are interleaved (A B, B A, ...) after warm-up and each number is the median
over --repeats; ratios are X / uniform, so > 1 means the X model is faster; "paired range" is min..max of the
per-repeat ratios. It reports speed; it never fails on it. On a machine whose cores are busy, use `--threads 1`.

Memory is measured in a child process that runs only the memory measurements. On CUDA: max_memory_allocated minus
memory_allocated before the forward. On CPU (Linux), torch allocates through glibc's malloc, which keeps freed
blocks for reuse, so neither the process size nor its lifetime peak (ru_maxrss) says what a forward needs. The child
therefore runs with MALLOC_MMAP_THRESHOLD_=65536: every block of 64 KiB or more (every activation here) gets its own
mapping and goes back to the OS when the tensor is freed, so the resident set follows the live tensors. Each forward
runs once to warm up (one-time buffers such as thread pools belong to the baseline), then the kernel's high-water
mark VmHWM is reset to the current resident size (/proc/self/clear_refs), the forward runs again, and the peak is
VmHWM minus the resident size before it: activations plus kernel scratch, weights excluded, to a page.

    cd /work/main && HF_HUB_OFFLINE=1 .venv/bin/python bench/bench_bowtieformer_vs_uniform.py --threads 1
    .venv/bin/python bench/bench_bowtieformer_vs_uniform.py --device cuda --dtype bfloat16 --hidden-size 1024
"""

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys

import torch
import torch.nn.functional as F
import transformers
from timing import compare  # noqa: E402  (bench/timing.py, beside this script)

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo, when not installed
from shapeformers import BowtieFormerConfig, BowtieFormerForCausalLM, VariableWidthCache  # noqa: E402
from shapeformers.modeling.compat import CACHE_FIELD  # noqa: E402

parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
parser.add_argument("--hidden-size", type=int, default=256)
parser.add_argument("--layers", type=int, default=16)
parser.add_argument("--heads", type=int, default=8)
parser.add_argument("--quantize-to", type=int, default=32, help="X widths are multiples of this")
parser.add_argument("--vocab", type=int, default=8192)
parser.add_argument("--batch", type=int, default=4)
parser.add_argument("--seq-len", type=int, default=256)
parser.add_argument("--decode-batch", type=int, default=1)
parser.add_argument("--new-tokens", type=int, default=64)
parser.add_argument("--repeats", type=int, default=5)
parser.add_argument("--warmup", type=int, default=1)
parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
parser.add_argument("--device", default="cpu")
parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)), help="torch intra-op threads")
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--memory-child", default=None, help=argparse.SUPPRESS)  # internal: JSON list of specs
args = parser.parse_args()

torch.set_num_threads(args.threads)
torch.manual_seed(args.seed)
device, dtype = torch.device(args.device), getattr(torch, args.dtype)
MiB = 2**20

# -----------------------------------------------------------------------------
# models and the naive reference


def make_config(**fields):
    return BowtieFormerConfig(
        vocab_size=args.vocab,
        hidden_size=args.hidden_size,
        num_attention_heads=args.heads,
        mlp_ratio=4,
        max_position_embeddings=max(2048, args.seq_len + args.new_tokens + 16),
        rope_theta=10000.0,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        **fields,
    )


def make_model(config):
    model = BowtieFormerForCausalLM(config).eval()
    assert model.num_parameters() == config.num_parameters(), "the config's parameter count is not the model's"
    return model


def widen(states, width):
    """The first `width` coordinates, each taken from the newest state that has it, zeros where none has."""
    x = states[-1][..., :width]
    for state in reversed(states[:-1]):
        x = torch.cat((x, state[..., x.shape[-1] : width]), dim=-1)
    return F.pad(x, (0, width - x.shape[-1]))


def naive_stack(decoder, ids):
    """NAIVE carry-forward, as MODELS.md §2.2 states it: keep every layer's output in a list. Same function as
    BowtieFormerModel (asserted below), but its memory grows with depth. Causal through sdpa's is_causal."""
    x = decoder.embed_tokens(ids) * decoder.config.embedding_multiplier
    positions = torch.arange(ids.shape[1], device=ids.device).unsqueeze(0)
    rotary = {int(dim): emb(x, positions) for dim, emb in decoder.rotary_embs.items()}
    states = [x]
    for layer in decoder.layers:
        out, _ = layer(widen(states, layer.width), attention_mask=None, position_embeddings=rotary[layer.head_dim])
        states.append(out)
    return widen(states[:-1] + [decoder.norm(states[-1])], decoder.config.hidden_size)


# -----------------------------------------------------------------------------
# the memory child: peak of each (widths, forward) spec, printed as JSON (see the docstring)


def status_bytes(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field + ":"))


def peak_bytes(fn):
    fn()  # warm-up
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        fn()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current resident size
    base = status_bytes("VmRSS")
    fn()
    return status_bytes("VmHWM") - base


if args.memory_child:
    ids = torch.randint(3, args.vocab, (args.batch, args.seq_len), device=device)
    forwards = {
        "model": lambda model: model(input_ids=ids, use_cache=False),
        "stack": lambda model: model.model(input_ids=ids, use_cache=False),
        "naive": lambda model: naive_stack(model.model, ids),
    }
    peaks = []
    for widths, forward in json.loads(args.memory_child):
        model = make_model(make_config(num_hidden_layers=len(widths), layer_widths=widths)).to(device, dtype)
        with torch.no_grad():
            peaks.append(peak_bytes(lambda: forwards[forward](model)))
        del model
    print(json.dumps(peaks))
    sys.exit()


def measure_peaks(specs):
    """Peak bytes of each (widths, forward) spec, measured in a fresh child process."""
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_=str(64 * 1024))
    command = [sys.executable, os.path.abspath(__file__), *sys.argv[1:], "--memory-child", json.dumps(specs)]
    child = subprocess.run(command, env=env, stdout=subprocess.PIPE, text=True, check=True)
    return json.loads(child.stdout.splitlines()[-1])


# -----------------------------------------------------------------------------
# two parameter-matched models

configs = {
    "X": make_config(
        num_hidden_layers=args.layers,
        schedule="geometric",
        bottleneck_ratio=0.3,
        bottleneck_position=0.75,
        symmetric=True,
        quantize_to=args.quantize_to,
    ),
    "uniform": make_config(num_hidden_layers=args.layers, schedule="uniform"),
}
models = {name: make_model(config) for name, config in configs.items()}
with torch.no_grad():  # the naive reference is the same function, checked in float32 before any cast
    ids = torch.randint(3, args.vocab, (2, 64))
    decoder = models["X"].model
    naive_diff = (naive_stack(decoder, ids) - decoder(ids, use_cache=False).last_hidden_state).abs().max().item()
assert naive_diff <= 1e-4, f"the naive reference differs from the model by {naive_diff:.3g}"
for model in models.values():
    model.to(device=device, dtype=dtype)
x_widths = configs["X"].layer_widths

# -----------------------------------------------------------------------------
# workloads and the KV cache

prompts = torch.randint(3, args.vocab, (args.batch, args.seq_len), device=device)
decode_prompt = torch.randint(3, args.vocab, (args.decode_batch, 16), device=device)


def prefill(model):
    with torch.no_grad():
        model(input_ids=prompts)


def decode(model, **cache):
    n = args.new_tokens
    out = model.generate(decode_prompt, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0, **cache)
    assert out.shape[1] == decode_prompt.shape[1] + n


def kv_cache_bytes(name):
    """Bytes of a preallocated VariableWidthCache after a generate() through it; must equal the config's figure."""
    config, length = configs[name], decode_prompt.shape[1] + args.new_tokens
    cache = VariableWidthCache(config, max_cache_len=length, batch_size=args.decode_batch, dtype=dtype, device=device)
    decode(models[name], **{CACHE_FIELD: cache})
    assert cache.get_seq_length() == length - 1
    expected = config.kv_cache_bytes_per_token(dtype) * args.decode_batch * length
    assert cache.nbytes == expected, f"{name}: cache holds {cache.nbytes} bytes, the config says {expected}"
    return cache.nbytes


print(
    f"torch {torch.__version__} | transformers {transformers.__version__} | device {args.device} | "
    f"threads {torch.get_num_threads()} | dtype {args.dtype} | "
    f"load avg {os.getloadavg()[0]:.1f} on {os.cpu_count()} cpus"
)
print(
    f"models: hidden {args.hidden_size}, layers {args.layers}, heads {args.heads}, vocab {args.vocab}, MLP 4 x width, "
    f"untied embeddings"
)
print(f"X widths (geometric, r_d 0.3, r_l 0.75, symmetric, quantize_to {args.quantize_to}): {x_widths}")
print(f"X head_dims: {[w // args.heads for w in x_widths]}; uniform: {args.layers} x {args.hidden_size}")
print(
    f"work: prefill/memory batch {args.batch} x {args.seq_len}, decode batch {args.decode_batch} x {args.new_tokens} "
    f"new tokens, {args.warmup} warm-up + {args.repeats} interleaved repeats, medians"
)
print(f"naive reference vs model, last hidden state max |diff| in float32: {naive_diff:.2e}")

kv_measured = {name: kv_cache_bytes(name) for name in models}
prefill_s = compare(
    {name: lambda m=m: prefill(m) for name, m in models.items()}, args.warmup, args.repeats, device
)
decode_s = compare(
    {name: lambda m=m: decode(m) for name, m in models.items()}, args.warmup, args.repeats, device
)
specs = [(configs[name].layer_widths, forward) for forward in ("model", "stack") for name in models]
# the depth check's family: every other X layer, the X layers, each X layer twice; the same widths at every depth
depths = {len(widths): widths for widths in (x_widths[::2], x_widths, [w for w in x_widths for _ in range(2)])}
depth_specs = [(widths, forward) for forward in ("stack", "naive") for widths in depths.values()]
peaks = measure_peaks(specs + depth_specs)
model_peak, stack_peak = dict(zip(models, peaks[0:2])), dict(zip(models, peaks[2:4]))
carry_peaks, naive_peaks = peaks[4 : 4 + len(depths)], peaks[4 + len(depths) :]

# -----------------------------------------------------------------------------
# report

print()
print(f"{'metric':<34}{'X':>12}{'uniform':>12}{'X/uniform':>11}{'paired range':>15}")
for metric, value, fmt in [
    ("parameters (M)", lambda c: c.num_parameters() / 1e6, ".3f"),
    ("non-embedding parameters (M)", lambda c: c.non_embedding_parameters() / 1e6, ".3f"),
    (f"forward MFLOPs/token at s={args.seq_len}", lambda c: c.flops_per_token(args.seq_len) / 1e6, ".2f"),
    (f"KV bytes/token ({args.dtype}), config", lambda c: c.kv_cache_bytes_per_token(dtype), ".0f"),
]:
    x, u = value(configs["X"]), value(configs["uniform"])
    print(f"{metric:<34}{x:>12{fmt}}{u:>12{fmt}}{x / u:>11.3f}")
x, u = kv_measured["X"], kv_measured["uniform"]
metric = f"KV bytes, {args.decode_batch} x {decode_prompt.shape[1] + args.new_tokens} cache"
print(f"{metric:<34}{x:>12}{u:>12}{x / u:>11.3f}")
for metric, seconds, tokens in [
    ("prefill tokens/s", prefill_s, args.batch * args.seq_len),
    ("decode tokens/s", decode_s, args.decode_batch * args.new_tokens),
]:
    x, u = tokens / statistics.median(seconds["X"]), tokens / statistics.median(seconds["uniform"])
    paired = [b / a for a, b in zip(seconds["X"], seconds["uniform"])]
    print(f"{metric:<34}{x:>12.1f}{u:>12.1f}{x / u:>11.3f}{min(paired):>9.2f}..{max(paired):<4.2f}")
for metric, peak in [("peak MiB, forward with logits", model_peak), ("peak MiB, decoder stack", stack_peak)]:
    x, u = peak["X"] / MiB, peak["uniform"] / MiB
    ratio = f"{x / u:>11.3f}" if u else f"{'n/a':>11}"  # toy sizes can stay under the allocator's mmap threshold
    print(f"{metric:<34}{x:>12.2f}{u:>12.2f}{ratio}")
print("ratios X / uniform: > 1 means more for the X model (for tokens/s: faster); KV bytes: config == measured")

print()
print(f"depth check: decoder-stack peak MiB, batch {args.batch} x {args.seq_len}, {args.dtype}, same widths per depth")
buffer = args.batch * args.seq_len * configs["X"].residual_width * dtype.itemsize
print(f"{'layers':>8}{'carry-forward':>15}{'naive':>10}{'naive kept outputs':>20}")
for (layers, widths), carry, naive in zip(depths.items(), carry_peaks, naive_peaks):
    kept = args.batch * args.seq_len * (args.hidden_size + sum(widths)) * dtype.itemsize
    print(f"{layers:>8}{carry / MiB:>15.2f}{naive / MiB:>10.2f}{kept / MiB:>20.2f}")
spread = max(carry_peaks) - min(carry_peaks)
verdict = "flat" if spread < buffer else "NOT flat"
print(
    f"carry-forward peak spread over depths: {spread / MiB:.2f} MiB, {verdict} (threshold: one residual buffer "
    f"[batch, seq, {configs['X'].residual_width}] = {buffer / MiB:.2f} MiB); naive grows "
    f"{(naive_peaks[-1] - naive_peaks[0]) / MiB:.2f} MiB from {min(depths)} to {max(depths)} layers"
)
