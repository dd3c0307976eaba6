"""The `shapeformers` command line: `shapeformers <command> [options]`.

Each command is a function that takes the parsed arguments; `build_parser` wires its options and sets it as the
subparser's `handler`, so a new command is one more `add_parser` block.
"""

import argparse
import json
import sys

from .training import demo

CONVERT_HELP = """\
Convert a checkpoint into an HourglassLlama or BowtieFormer Hub folder (with its code, tokenizer and generation
config), or export one of ours back to a foreign format with --to.

Sources (--from; recognised from SRC when omitted):
  lm_engine     official ><former (BowtieFormer) training code, model_type "width_varying" -> BowtieFormer
  hourglass_lm  official Hourglass_LM Hugging Face port (model_type "llama" + num_mlp_layers) -> HourglassLlama
  llama         transformers Llama folder (single or sharded safetensors) -> HourglassLlama with K = 1
  granite       transformers Granite folder -> BowtieFormer with uniform widths
  llama2c       llama2.c checkpoint file (legacy format) + its tokenizer .bin -> HourglassLlama with K = 1

Exports (--to): lm_engine, hourglass_lm, llama (K = 1 only), granite (uniform widths only).

The destination is written atomically: it appears complete or not at all. Examples:
  shapeformers convert path/to/llama-folder out/hourglass-k1 --verify
  shapeformers convert stories260K.bin out/stories260K --tokenizer tok512.bin
  shapeformers convert out/hourglass-k1 out/llama-again --to llama
"""


def run_convert(args):
    from .conversion import ConversionError, convert

    try:
        report = convert(args.source, args.destination, args.from_format, args.to_format, args.tokenizer,
                         args.dtype, args.verify, args.max_shard_size)
    except ConversionError as error:
        sys.exit(f"shapeformers convert: error: {error}")
    print(json.dumps(report, indent=2))


def build_parser():
    parser = argparse.ArgumentParser(prog="shapeformers", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True, metavar="command")

    demo_parser = commands.add_parser(
        "demo",
        help="train, save, reload and compare a tiny Llama, HourglassLlama and BowtieFormer on CPU",
        description=demo.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    demo.add_arguments(demo_parser)
    demo_parser.set_defaults(handler=demo.run)

    convert_parser = commands.add_parser(
        "convert",
        help="convert lm_engine, Hourglass_LM, Llama, Granite or llama2.c checkpoints (and back)",
        description=CONVERT_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    formats = ("lm_engine", "hourglass_lm", "llama", "granite", "llama2c")
    convert_parser.add_argument("source", metavar="SRC", help="checkpoint folder or llama2.c file")
    convert_parser.add_argument("destination", metavar="DST", help="new folder to write (must not exist)")
    convert_parser.add_argument("--from", dest="from_format", choices=formats, help="source format")
    convert_parser.add_argument("--to", dest="to_format", choices=formats[:4], help="export one of ours to this")
    convert_parser.add_argument("--tokenizer", help="llama2.c tokenizer .bin (default: found beside SRC)")
    convert_parser.add_argument("--dtype", help="cast weights to this dtype (default: keep the source's)")
    convert_parser.add_argument("--max-shard-size", metavar="SIZE",
                                help="largest safetensors file written, e.g. 5GB or 500MB (default: 2GiB)")
    convert_parser.add_argument("--verify", action="store_true",
                                help="compare logits with the source's transformers implementation; fail above 1e-4")
    convert_parser.set_defaults(handler=run_convert)

    from .eval import command as eval_command  # options only: lm-eval is imported when `eval` runs

    eval_parser = commands.add_parser(
        "eval",
        help="lm-eval tasks (ARC, HellaSwag, PIQA, offline from local files too) and perplexity, to a results JSON",
        description=eval_command.HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    eval_command.add_arguments(eval_parser)
    eval_parser.set_defaults(handler=eval_command.run)

    # `card` and `publish` (shapeformers/publishing.py, imported only when one of them runs) share the card options.
    card_options = argparse.ArgumentParser(add_help=False)
    card_options.add_argument("model_dir", metavar="MODEL_DIR", help="model folder written by save_pretrained")
    card_options.add_argument("--results", help="results JSON of `shapeformers eval` or lm-eval, for the model-index")
    card_options.add_argument("--base-model", help="Hub id of the model this one was converted from")
    card_options.add_argument("--license", help="license of the weights (default: the card's, else apache-2.0)")
    card_options.add_argument("--baseline", metavar="CONFIG",
                              help="config.json (or folder) of the baseline to compare with, instead of the "
                                   "parameter-matched one (uniform BowtieFormer, K = 1 HourglassLlama)")  # fmt: skip

    def run_card(args):
        from .publishing import card_command

        card_command(args)

    card_parser = commands.add_parser(
        "card",
        parents=[card_options],
        help="write a model card (README.md + PNG pictures) into a model folder",
        description="Write MODEL_DIR/README.md from model_cards/template.md: Hub metadata, usage, cost table against "
        "the parameter-matched baseline, evaluation results, and pictures beside it.",
    )
    card_parser.add_argument("--repo-id", help="Hub id to show in the usage snippet (default: your-org/<folder>)")
    card_parser.set_defaults(handler=run_card)

    def run_publish(args):
        from .publishing import publish_command

        publish_command(args)

    publish_parser = commands.add_parser(
        "publish",
        parents=[card_options],
        help="write the card, check that the folder loads without shapeformers, upload it to the Hugging Face Hub",
        description="Write the model card (as `shapeformers card`), check MODEL_DIR as a Hub user will meet it "
        "(loads through its remote code in a Python without shapeformers; tokenizer, generation config and card "
        "present), then upload it with huggingface_hub (log in with `hf auth login` or set HF_TOKEN).",
    )
    publish_parser.add_argument("--repo-id", required=True, help="Hub repository, org/name (created if missing)")
    publish_parser.add_argument("--private", action="store_true", help="create the repository as private")
    publish_parser.add_argument("--dry-run", action="store_true", help="do everything but the upload")
    publish_parser.add_argument("--keep-card", action="store_true", help="upload the folder's README.md as it is")
    publish_parser.add_argument("--commit-message", help="commit message on the Hub")
    publish_parser.set_defaults(handler=run_publish)
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    args.handler(args)


if __name__ == "__main__":
    main()
