"""`netra bench <kernels|serve|sweep|compare|step>`.

Each verb lives in its own module exposing ``add_arguments(parser)`` and ``main(args) -> int``;
modules are imported when the verb runs, so `netra --help` stays cheap and torch-free.
"""

from __future__ import annotations

import argparse
import importlib
from typing import Any

VERBS: dict[str, tuple[str, str]] = {
    "kernels": ("netra.bench.kernels", "kernel timing: graph replay, rotated inputs, peers interleaved"),
    "serve": ("netra.bench.serve", "serving load generator: synchronized client processes, exact checks"),
    "sweep": ("netra.bench.sweep", "serving sweep over concurrencies, with a plot"),
    "compare": ("netra.bench.compare", "ABBA comparison of two arms with a statistical verdict"),
    "step": ("netra.bench.step", "the engine's full-shape decode step in graph replay, against its byte floor"),
}


def _run(module_name: str) -> Any:
    def func(args: argparse.Namespace) -> int:
        module = importlib.import_module(module_name)
        return int(module.main(args) or 0)

    return func


def register(sub: Any) -> None:
    bench = sub.add_parser("bench", help="measure kernels or a serving deployment")
    verbs = bench.add_subparsers(dest="bench_verb", metavar="WHAT", required=True)
    for verb, (module_name, help_text) in VERBS.items():
        p = verbs.add_parser(verb, help=help_text)
        module = importlib.import_module(module_name)
        module.add_arguments(p)
        p.set_defaults(func=_run(module_name))
