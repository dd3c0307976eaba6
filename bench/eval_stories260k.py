"""Evaluate a converted stories260K folder on the full ARC-Easy test, HellaSwag validation and PIQA validation
splits, offline, through `shapeformers eval`'s code (lm-eval's own task definitions reading local files), and print
each task's acc / acc_norm with its wall-clock time.

    shapeformers convert ../shared/data/checkpoints/stories260K/stories260K.bin out/stories260K
    HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 .venv/bin/python bench/eval_stories260k.py out/stories260K \
        --output runs/eval/stories260K.json

Each task runs on its own (model loaded once per task, which takes well under a second for this model) so that
its time is its own. --limit N evaluates the first N documents of each task, for a quick check.
"""

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

DEFAULT_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "eval"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("model", help="converted stories260K folder")
    parser.add_argument("--data-dir", default=os.environ.get("SHAPEFORMERS_EVAL_DATA", str(DEFAULT_DATA)))
    parser.add_argument("--tasks", default="arc_easy,hellaswag,piqa")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--limit", type=int, help="first N documents per task (default: all)")
    parser.add_argument("--device", help="default: cuda if available, else cpu")
    parser.add_argument("--output", help="write {task: results JSON} here")
    args = parser.parse_args(argv)

    from shapeformers.eval.harness import evaluate, write_results

    print(f"{'task':<14} {'docs':>6} {'acc':>7} {'acc_norm':>9} {'seconds':>8}", flush=True)
    everything = {}
    for task in [name.strip() for name in args.tasks.split(",") if name.strip()]:
        started = time.time()
        results = evaluate(args.model, [task], data_dir=args.data_dir, limit=args.limit, batch_size=args.batch_size,
                           device=args.device, bootstrap_iters=0, progress=False)  # fmt: skip
        seconds = time.time() - started
        scores = results["results"][task]
        docs = results["n-samples"][task]["effective"]
        print(f"{task:<14} {docs:>6} {scores['acc,none']:>7.4f} {scores['acc_norm,none']:>9.4f} {seconds:>8.1f}",
              flush=True)  # fmt: skip
        results["shapeformers"]["seconds"]["wall"] = round(seconds, 3)
        everything[task] = results
    if args.output:
        write_results(everything, args.output)
        print(f"results written to {args.output}")
    return everything


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
