"""The `shapeformers` command line: `shapeformers <command> [options]`.

Each command is a function that takes the parsed arguments; `build_parser` wires its options and sets it as the
subparser's `handler`, so a new command is one more `add_parser` block.
"""

import argparse

from .training import demo


def build_parser():
    parser = argparse.ArgumentParser(prog="shapeformers", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True, metavar="command")

    demo_parser = commands.add_parser(
        "demo",
        help="train, save, reload and compare a tiny HourglassLlama and Llama on CPU",
        description=demo.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    demo.add_arguments(demo_parser)
    demo_parser.set_defaults(handler=demo.run)
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    args.handler(args)


if __name__ == "__main__":
    main()
