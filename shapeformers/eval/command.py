"""Options and handler of `shapeformers eval` (`shapeformers/cli.py` adds the subcommand from here). Importing this
module is cheap: torch, transformers and lm-eval are imported when the command runs."""

import logging

HELP = """\
Evaluate a model with lm-evaluation-harness (lm-eval's HFLM, trust_remote_code=True) and write its results JSON.

MODEL is a model folder or a repo id (Hub, or the local Hugging Face cache with HF_HUB_OFFLINE=1). Task names are
lm-eval's own: arc_easy, arc_challenge, hellaswag, piqa, or any other lm-eval task when the data comes from the Hub.
With --data-dir DIR (or SHAPEFORMERS_EVAL_DATA=DIR) arc_easy, arc_challenge, hellaswag and piqa read local
JSON Lines files DIR/<task>/{train,validation,test}.jsonl (Hugging Face field layout) through lm-eval's own task
definitions: same prompts, choices, preprocessing and metrics (acc, acc_norm). Few-shot needs the split lm-eval
draws shots from (train); where DIR lacks it, name another with --fewshot-split (scores then differ from lm-eval's).

--perplexity FILE adds token-, word- (lm-eval's wikitext word count), byte-level perplexity and bits per byte of a
text file, with sliding windows of --max-length tokens ending --stride tokens apart (default: --max-length, which is
lm-eval's rolling windows). --tasks may then be omitted.

Examples:
  HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 shapeformers eval out/stories260K \\
      --tasks arc_easy,hellaswag,piqa --data-dir ../shared/data/eval --output results.json
  shapeformers eval out/stories260K --perplexity ../shared/data/corpus/wikitext-2-raw-v1/wiki.test.raw \\
      --stride 128 --output ppl.json
  shapeformers eval org/model --tasks arc_challenge --num-fewshot 25 --batch-size 8 --dtype bfloat16 \\
      --peft path/to/lora --output results.json
"""


def add_arguments(parser):
    parser.add_argument("model", metavar="MODEL", help="model folder or repo id")
    parser.add_argument("--tasks", default="", help="comma-separated lm-eval task names, e.g. arc_easy,hellaswag,piqa")
    parser.add_argument("--data-dir", help="local eval data folder (default: $SHAPEFORMERS_EVAL_DATA; unset: the Hub)")
    parser.add_argument("--limit", type=float, help="first N documents per task (a fraction if < 1); for testing")
    parser.add_argument("--num-fewshot", type=int, help="shots per question (default: the task's, 0 for these)")
    parser.add_argument("--fewshot-split", help="with --data-dir: split to draw shots from for tasks whose local "
                        "data lacks lm-eval's (e.g. validation for hellaswag, piqa)")
    parser.add_argument("--batch-size", default="1", help="an int or 'auto' (default 1)")
    parser.add_argument("--dtype", default="auto", help="float32, bfloat16, float16 or auto (the checkpoint's)")
    parser.add_argument("--device", help="cuda, cuda:N, cpu, mps (default: cuda if available, else cpu)")
    parser.add_argument("--peft", metavar="ADAPTER", help="PEFT adapter (folder or repo id) to load on the model")
    parser.add_argument("--revision", default="main", help="model revision on the Hub (default main)")
    parser.add_argument("--max-length", type=int, help="context length (default: the model config's)")
    parser.add_argument("--perplexity", metavar="FILE", help="also report sliding-window perplexity on this text file")
    parser.add_argument("--stride", type=int, help="perplexity: tokens between window ends (default --max-length)")
    parser.add_argument("--log-samples", action="store_true", help="keep lm-eval's per-document samples in the JSON")
    parser.add_argument("--bootstrap-iters", type=int, default=100000, help="lm-eval stderr bootstrap (0: none)")
    parser.add_argument("--seed", type=int, default=0, help="lm-eval's Python random seed (default 0, as lm-eval's)")
    parser.add_argument("--fewshot-seed", type=int, default=1234, help="lm-eval's few-shot sampler seed (default 1234)")
    parser.add_argument("--verbosity", default="WARNING", help="lm-eval log level (default WARNING)")
    parser.add_argument("--output", "-o", help="results JSON to write (default: print only the table)")


def run(args):
    """The `eval` subcommand's handler (imports torch, transformers and lm-eval only now)."""
    try:
        import lm_eval  # noqa: F401
    except ImportError:
        raise SystemExit("shapeformers eval: error: needs lm-eval: pip install 'shapeformers[eval]'")
    from .cards import markdown_table
    from .harness import evaluate, write_results
    from .tasks import OfflineTaskError

    tasks = [task.strip() for task in args.tasks.split(",") if task.strip()]
    if not tasks and not args.perplexity:
        raise SystemExit("shapeformers eval: error: give --tasks and/or --perplexity")
    batch_size = args.batch_size if args.batch_size == "auto" else int(args.batch_size)
    logging.getLogger("lm-eval").setLevel(args.verbosity.upper())
    logging.getLogger("lm_eval").setLevel(args.verbosity.upper())
    try:
        results = evaluate(
            args.model, tasks, data_dir=args.data_dir, limit=args.limit, num_fewshot=args.num_fewshot,
            fewshot_split=args.fewshot_split, batch_size=batch_size, dtype=args.dtype, device=args.device,
            peft=args.peft, revision=args.revision, max_length=args.max_length, perplexity_file=args.perplexity,
            stride=args.stride, log_samples=args.log_samples, bootstrap_iters=args.bootstrap_iters, seed=args.seed,
            fewshot_seed=args.fewshot_seed,
        )  # fmt: skip
    except (OfflineTaskError, ValueError, FileNotFoundError) as error:
        raise SystemExit(f"shapeformers eval: error: {error}")
    except ConnectionError as error:
        raise SystemExit(f"shapeformers eval: error: {error}. Offline, pass --data-dir DIR or set "
                         "SHAPEFORMERS_EVAL_DATA (arc_easy, arc_challenge, hellaswag, piqa).")  # fmt: skip
    if args.output:
        write_results(results, args.output)
    print(markdown_table(results))
    if args.output:
        print(f"\nresults written to {args.output}")
