"""Peak memory of converting a large checkpoint, against the checkpoint's size.

Writes a random transformers Llama folder of a few hundred MB (sharded safetensors, written shard by shard), then
converts it to an HourglassLlama folder in a fresh subprocess and reports that process's peak resident memory next
to the checkpoint size, the largest tensor and the output shard size. The converter reads one tensor at a time and
holds at most one output shard, so the peak should sit near (Python + torch) + largest tensor + one shard, far below
the checkpoint size.

    .venv/bin/python bench/bench_conversion_memory.py [--hidden-size 1024 --layers 12 --shard-mb 64]
"""

import argparse
import json
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from safetensors.torch import save_file

MB = 1024**2

CONVERT = """
import resource, sys, time
from shapeformers.conversion.llama import read_llama
from shapeformers.conversion.writer import write_checkpoint
baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
start = time.perf_counter()
write_checkpoint(read_llama(sys.argv[1]), sys.argv[2], max_shard_bytes=int(sys.argv[3]))
print(baseline, time.perf_counter() - start)
"""


def llama_shapes(hidden, intermediate, layers, vocab):
    shapes = {"model.embed_tokens.weight": (vocab, hidden), "model.norm.weight": (hidden,), "lm_head.weight": (vocab, hidden)}
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes.update({p + "input_layernorm.weight": (hidden,), p + "post_attention_layernorm.weight": (hidden,)})
        shapes.update({p + f"self_attn.{n}_proj.weight": (hidden, hidden) for n in "qkvo"})
        shapes.update({p + "mlp.gate_proj.weight": (intermediate, hidden), p + "mlp.up_proj.weight": (intermediate, hidden),
                       p + "mlp.down_proj.weight": (hidden, intermediate)})
    return shapes


def write_random_llama(folder, args):
    """A Llama folder of random float16 weights, written one shard at a time so that this process stays small."""
    shapes = llama_shapes(args.hidden_size, args.intermediate_size, args.layers, args.vocab)
    weight_map, shard, shard_bytes, files = {}, {}, 0, []
    for name, shape in shapes.items():
        shard[name] = torch.randn(shape, dtype=torch.float16) * 0.02
        shard_bytes += shard[name].numel() * 2
        if shard_bytes >= 100 * MB or name == list(shapes)[-1]:
            files.append(f"model-{len(files) + 1:05d}.safetensors")
            save_file(shard, folder / files[-1], metadata={"format": "pt"})
            weight_map.update({n: files[-1] for n in shard})
            shard, shard_bytes = {}, 0
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    config = {
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": args.vocab,
        "hidden_size": args.hidden_size, "intermediate_size": args.intermediate_size,
        "num_hidden_layers": args.layers, "num_attention_heads": args.hidden_size // 64, "num_key_value_heads":
        args.hidden_size // 64, "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        "tie_word_embeddings": False, "torch_dtype": "float16",
    }
    (folder / "config.json").write_text(json.dumps(config))
    largest = max(torch.Size(s).numel() for s in shapes.values()) * 2
    return sum(torch.Size(s).numel() for s in shapes.values()) * 2, largest


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden-size", type=int, default=1024)
    parser.add_argument("--intermediate-size", type=int, default=2816)
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--shard-mb", type=int, default=64, help="output shard size")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as scratch:
        source, destination = Path(scratch) / "llama", Path(scratch) / "hourglass"
        source.mkdir()
        checkpoint_bytes, largest = write_random_llama(source, args)
        result = subprocess.run(
            [sys.executable, "-c", CONVERT, str(source), str(destination), str(args.shard_mb * MB)],
            capture_output=True, text=True, check=True,
        )
        baseline_kb, seconds = result.stdout.split()
        peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024  # Linux reports KiB
        baseline = int(baseline_kb) * 1024
        written = sum(p.stat().st_size for p in destination.glob("*.safetensors"))

    print(f"torch {torch.__version__} | checkpoint: Llama {args.layers} layers x {args.hidden_size}, float16")
    print(f"checkpoint size           {checkpoint_bytes / MB:9.1f} MB (written {written / MB:.1f} MB)")
    print(f"largest tensor            {largest / MB:9.1f} MB")
    print(f"output shard size         {args.shard_mb:9.1f} MB")
    print(f"process before converting {baseline / MB:9.1f} MB (Python, torch, transformers)")
    print(f"peak resident memory      {peak / MB:9.1f} MB")
    print(f"peak - before             {(peak - baseline) / MB:9.1f} MB = {(peak - baseline) / checkpoint_bytes:.2f} x checkpoint")
    print(f"conversion time           {float(seconds):9.1f} s")


if __name__ == "__main__":
    main()
