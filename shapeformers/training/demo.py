"""`shapeformers demo`: the whole story in a few CPU minutes, offline.

Train a byte-level BPE tokenizer on a small English corpus; build a tiny Llama, an HourglassLlama with the same
number of non-embedding parameters and an X-shaped BowtieFormer matched to it as the paper counts; train all three
with the same seed, data order and schedule; save each as a Hub folder (ours carry their own code); reload them
through the Auto classes with `trust_remote_code=True`; generate through a `pipeline`; print one comparison table.
"""

import shutil
import time
from pathlib import Path

import torch
import transformers
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    get_cosine_schedule_with_warmup,
    pipeline,
)

from ..configuration import BowtieFormerConfig, HourglassLlamaConfig, match_bottleneck_width
from ..modeling import BowtieFormerForCausalLM, HourglassLlamaForCausalLM
from ..tokenization import save_tokenizer
from .data import encode, random_batch, read_corpus, sequential_batches, split_text, train_tokenizer

# The baseline: a Llama small enough to train for a few hundred steps on two CPU cores.
BASELINE = dict(
    hidden_size=128, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4, tie_word_embeddings=True
)
# The paper's 906M pair (1536 wide x 24 layers -> 2496 x 12, K = 4, sub-MLP 0.81 x hidden) scaled down: half as
# deep, 1.625x as wide, same attention; the sub-MLP width is solved to match the baseline's non-embedding budget.
HOURGLASS = dict(num_mlp_layers=4, num_hidden_layers=2, hidden_size=208)
# An X-shaped BowtieFormer matched (as the paper counts) to the uniform model of the baseline's width and depth,
# which with MLP ratio 4 is the baseline itself: widths 160 96 64 160.
BOWTIE = dict(schedule="geometric", bottleneck_ratio=0.5, bottleneck_position=0.75, quantize_to=16, mlp_ratio=4)

PROMPT = 'The "while" statement is used'  # its topic lies in the held-out slice of the default corpus
VAL_FRACTION = 0.1
LOSS_WINDOW = 10  # the final training loss is the mean over this many last steps
EVAL_BATCH_TOKENS = 8192  # evaluation is forward-only: big batches, few calls, whatever the training batch


def add_arguments(parser):
    parser.add_argument("--corpus", help="plain-text training corpus (.gz allowed); default: Python's topic help")
    parser.add_argument("--output-dir", default="runs/demo", help="where the two model folders are written")
    parser.add_argument("--steps", type=int, default=300, help="optimizer steps per model")
    parser.add_argument("--seq-len", type=int, default=128, help="tokens per training sequence")
    parser.add_argument("--batch-size", type=int, default=16, help="sequences per step")
    parser.add_argument("--lr", type=float, default=3e-3, help="peak learning rate (cosine decay after warmup)")
    parser.add_argument("--vocab-size", type=int, default=4096, help="BPE vocabulary size")
    parser.add_argument("--max-new-tokens", type=int, default=48, help="tokens generated from the prompt")
    parser.add_argument("--seed", type=int, default=0)


def model_configs(tokenizer, seq_len):
    """{name: (model class, model config, HourglassLlamaConfig that does its accounting)}. HourglassLlama with
    K = 1 is exactly Llama, so one set of formulas counts both."""
    fields = dict(
        BASELINE,
        vocab_size=len(tokenizer),
        max_position_embeddings=seq_len,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    baseline = HourglassLlamaConfig(**fields)
    hourglass = match_bottleneck_width(baseline, **HOURGLASS)
    bowtie_fields = {key: value for key, value in fields.items() if key != "intermediate_size"}
    bowtie = BowtieFormerConfig(**bowtie_fields, **BOWTIE)
    return {
        "llama": (LlamaForCausalLM, LlamaConfig(**fields), baseline),
        "hourglass_llama": (HourglassLlamaForCausalLM, hourglass, hourglass),
        "bowtieformer": (BowtieFormerForCausalLM, bowtie, bowtie),
    }


def make_optimizer(model, lr):
    # No weight decay on norms (the only 1-D weights here), as in nanoGPT.
    params = list(model.parameters())
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95))


def train(name, model, ids, args):
    """Train in place; return (per-step losses, training tokens per second)."""
    generator = torch.Generator().manual_seed(args.seed)  # the same batches, in the same order, for every model
    optimizer = make_optimizer(model, args.lr)
    schedule = get_cosine_schedule_with_warmup(optimizer, max(1, args.steps // 10), args.steps)
    log_every = max(1, args.steps // 5)
    model.train()
    losses = []
    start = time.perf_counter()
    for step in range(1, args.steps + 1):
        batch = random_batch(ids, args.batch_size, args.seq_len, generator)
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
        if step % log_every == 0 or step == args.steps:
            print(f"{name}: step {step}/{args.steps}, loss {losses[-1]:.3f}", flush=True)
    elapsed = time.perf_counter() - start
    return losses, args.steps * args.batch_size * args.seq_len / elapsed


@torch.no_grad()
def evaluate(model, ids, args):
    """Mean next-token loss over the held-out tokens, in windows of the training length."""
    model.eval()
    total, count = 0.0, 0
    for batch in sequential_batches(ids, max(1, EVAL_BATCH_TOKENS // args.seq_len), args.seq_len):
        total += model(input_ids=batch, labels=batch).loss.item() * batch.numel()
        count += batch.numel()
    return total / count


def save_atomically(model, tokenizer, directory):
    """Write the model folder beside `directory`, then rename it into place: a reader finds the whole folder or
    none, never a partial one."""
    directory = Path(directory)
    staging = directory.with_name(f".{directory.name}.tmp")
    shutil.rmtree(staging, ignore_errors=True)
    model.save_pretrained(staging)
    save_tokenizer(tokenizer, staging)
    shutil.rmtree(directory, ignore_errors=True)
    staging.rename(directory)


def generate(directory, prompt, max_new_tokens):
    """Reload `directory` the way a Hub user would and continue `prompt` greedily; return (text, tokens/s)."""
    model = AutoModelForCausalLM.from_pretrained(directory, trust_remote_code=True)
    tokenizer = AutoTokenizer.from_pretrained(directory, trust_remote_code=True)
    generator = pipeline("text-generation", model=model, tokenizer=tokenizer)
    # min_new_tokens: always time the same number of tokens, even if the model emits its end token.
    options = dict(max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens, do_sample=False)
    generator(prompt, **options)  # warm-up: the first call pays one-time setup costs
    start = time.perf_counter()
    text = generator(prompt, return_full_text=False, **options)[0]["generated_text"]
    return text, max_new_tokens / (time.perf_counter() - start)


def format_table(rows):
    """`rows` (dicts with the same keys) as a Markdown table with aligned columns."""
    columns = list(rows[0])
    cells = [columns] + [[str(row[column]) for column in columns] for row in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    lines = ["| " + " | ".join(cell.ljust(width) for cell, width in zip(line, widths)) + " |" for line in cells]
    lines.insert(1, "|" + "|".join("-" * (width + 2) for width in widths) + "|")
    return "\n".join(lines)


def run(args):
    transformers.utils.logging.disable_progress_bar()  # keep the log to the steps, the samples and the table
    train_text, val_text = split_text(read_corpus(args.corpus), VAL_FRACTION)
    tokenizer = train_tokenizer(train_text, args.vocab_size)  # on the training slice only: validation stays unseen
    train_ids, val_ids = encode(tokenizer, train_text), encode(tokenizer, val_text)
    print(f"corpus: {len(train_ids):,} training and {len(val_ids):,} validation tokens, vocabulary {len(tokenizer):,}")

    rows = []
    for name, (model_class, config, accounting) in model_configs(tokenizer, args.seq_len).items():
        torch.manual_seed(args.seed)
        model = model_class(config)
        losses, train_speed = train(name, model, train_ids, args)
        val_loss = evaluate(model, val_ids, args)
        directory = Path(args.output_dir) / name
        save_atomically(model, tokenizer, directory)
        text, generate_speed = generate(directory, PROMPT, args.max_new_tokens)
        print(f"{name}, reloaded, generates: {PROMPT + text!r}", flush=True)
        train_loss = sum(losses[-LOSS_WINDOW:]) / len(losses[-LOSS_WINDOW:])
        rows.append(
            {
                "model": name,
                "params": f"{accounting.num_parameters():,}",
                "non-emb params": f"{accounting.non_embedding_parameters():,}",
                "FLOPs/token": f"{accounting.flops_per_token(args.seq_len) / 1e6:.2f}M",
                "KV bytes/token (bf16)": accounting.kv_cache_bytes_per_token(torch.bfloat16),
                "train loss": f"{train_loss:.3f}",
                "val loss": f"{val_loss:.3f}",
                "train tok/s": f"{train_speed:,.0f}",
                "generate tok/s": f"{generate_speed:,.1f}",
            }
        )
    print(format_table(rows))
