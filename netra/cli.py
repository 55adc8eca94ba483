"""`netra <verb>`: one entry point; each area registers its own verbs.

The list below is the only registry of command modules. Each module exposes
``register(subparsers) -> None`` and sets ``func`` on the parsers it adds; ``func(args)``
returns the process exit code.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# Module name -> what it provides (for `netra --help`). Order is the help order.
COMMAND_MODULES: tuple[str, ...] = (
    "netra.dispatch_cli",  # explain
    "netra.build",  # kernels build | verify
    "netra.bench.cli",  # bench kernels | serve | sweep | compare
    "netra.engine.cli",  # engine
    "netra.serve.cli",  # serve (response layer)
    "netra.deploy.cli",  # plan | launch | status | stop | compose
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="netra", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="verb", metavar="VERB")
    for name in COMMAND_MODULES:
        module = importlib.import_module(name)
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    return int(func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
