"""`netra bench <kernels|serve|sweep|compare|step|engine|spec|wirebytes|synthetic>`.

Each verb lives in its own module exposing ``add_arguments(parser)`` and an entry point
``ENTRY(args) -> int``. Only the module of the verb being run is imported (its parser needs it), so
`netra bench --help` stays cheap and every `netra bench VERB --help` needs only the core dependencies.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Sequence
from typing import Any

# verb -> (module, entry point, help)
VERBS: dict[str, tuple[str, str, str]] = {
    "kernels": ("netra.bench.kernels", "main", "kernel timing: graph replay, rotated inputs, peers interleaved"),
    "serve": ("netra.bench.serve", "main", "serving load generator: synchronized client processes, exact checks"),
    "sweep": ("netra.bench.sweep", "main", "serving sweep over concurrencies, with a plot"),
    "compare": ("netra.bench.compare", "main", "ABBA comparison of two arms with a statistical verdict"),
    "step": ("netra.bench.step", "main", "the engine's full-shape decode step in graph replay, against its byte floor"),
    "engine": ("netra.engine.bench", "cli", "the embedded engine alone: tokens/s and the scheduler's per-step "
               "overhead"),
    "spec": ("netra.bench.spec", "cli", "speculative decoding: tokens/s against the acceptance length (forced "
             "acceptance), with the tau = 1 floor and plain decoding in the same run"),
    "wirebytes": ("netra.bench.wirebytes", "cli", "bytes on the wire per token through the response layer, "
                  "cumulative vs incremental worker"),
    "synthetic": ("netra.bench.synthetic", "cli", "a synthetic worker at a fixed token rate (instrument checks)"),
    "hostile": ("netra.bench.hostile", "main", "hostile-load probes of a fresh local launch (issue 24), with a record"),
}


def _run(module_name: str, entry: str) -> Any:
    def func(args: argparse.Namespace) -> int:
        module = importlib.import_module(module_name)
        return int(getattr(module, entry)(args) or 0)

    return func


def register(sub: Any, words: Sequence[str] = ()) -> None:
    from netra.cli import add_verb, nested_word

    bench = add_verb(sub, "bench")
    verbs = bench.add_subparsers(dest="bench_verb", metavar="WHAT", required=True)
    wanted = nested_word(words, "bench")
    for verb, (module_name, entry, help_text) in VERBS.items():
        if verb != wanted:
            verbs.add_parser(verb, help=help_text, add_help=False)  # stand-in: listed, never imported
            continue
        p = verbs.add_parser(verb, help=help_text, description=help_text)
        importlib.import_module(module_name).add_arguments(p)
        p.set_defaults(func=_run(module_name, entry))
