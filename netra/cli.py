"""`netra <verb>`: one entry point; each area registers its own verbs.

`VERBS` below is the only registry of commands: verb -> (module, one-line help). Each module exposes
``register(subparsers) -> None`` and sets ``func`` on the parsers it adds; ``func(args)`` returns the
process exit code. Only the module of the verb being run is imported, so `netra --help` and every
`netra VERB --help` need nothing beyond the core dependencies (PyYAML, rich); a verb's own
dependencies are imported when it runs.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

# Verb -> (module that registers it, help). Order is the help order; a module may register several.
VERBS: dict[str, tuple[str, str]] = {
    "launch": ("netra.deploy.cli", "verify and start a profile: engines, response layers, nginx, supervisor"),
    "status": ("netra.deploy.cli", "state of a launch from its record: PIDs, ports, CPU sets, health"),
    "stop": ("netra.deploy.cli", "stop a launch from another shell, from its record"),
    "plan": ("netra.deploy.cli", "resolve a profile into a plan: placement, commands, canonical JSON + sha256"),
    "compose": ("netra.deploy.cli", "render a Compose v2 file for a profile's verified plan"),
    "k8s": ("netra.k8s.cli", "Kubernetes: render a profile's plan as manifests (SMG router), check a rendered dir"),
    "images": ("netra.deploy.imagebuild", "container images: make the base, build (Docker SDK), lint, relock, pin"),
    "sglang": ("netra.deploy.sglang", "check rendered SGLang worker commands with SGLang's own parser"),
    "serve": ("netra.serve.cli", "OpenAI-compatible response layer in front of one worker"),
    "engine": ("netra.engine.cli", "the embedded engine's worker server (SGLang worker HTTP contract)"),
    "bench": ("netra.bench.cli", "measure kernels, the engine, the wire or a serving deployment"),
    "explain": ("netra.dispatch_cli", "show dispatch decisions (tactic or fallback, and why)"),
    "kernels": ("netra.build", "build kernel code objects and verify them against kernels/lock.json"),
    "checkpoint": ("netra.checkpoint.cli", "synthesize a checkpoint: Qwen3.6-FP8 layout, seeded weights, real vocabulary"),
}


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Shows every option's default, unless its help already says it or there is none to show."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        nothing = default is None or default is False or default is argparse.SUPPRESS or default == []
        if nothing or "(default" in text or "%(default)" in text or not action.option_strings:
            return text
        return f"{text} (default: %(default)s)"


class NetraParser(argparse.ArgumentParser):
    """Every parser of the CLI (subparsers inherit the class, and so the formatter)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)


def add_verb(sub: Any, name: str, **kwargs: Any) -> argparse.ArgumentParser:
    """A verb's parser, with its help from `VERBS` (one place for the text `netra --help` shows)."""
    text = VERBS[name][1]
    parser: argparse.ArgumentParser = sub.add_parser(name, help=text, description=text, **kwargs)
    return parser


def run_module(prog: str, doc: str | None, add_arguments: Callable[[argparse.ArgumentParser], None],
               cli: Callable[[argparse.Namespace], int], argv: list[str] | None = None) -> int:
    """A verb's module run on its own (``python -m``): its parser (described by the docstring's first
    line) parses ``argv``, and ``cli`` runs with the result."""
    p = NetraParser(prog=prog, description=(doc or "").splitlines()[0])
    add_arguments(p)
    return cli(p.parse_args(argv))


def nested_word(words: Sequence[str], verb: str) -> str | None:
    """The word after ``verb`` in ``words`` (the nested verb being run), if any."""
    rest = list(words)[list(words).index(verb) + 1:] if verb in words else []
    return next((w for w in rest if not w.startswith("-")), None)


def _version() -> str:
    from netra import __version__

    return f"netra {__version__}"


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The parser for ``argv``: the module of its verb registers the real parsers; every other verb
    gets a help-only stand-in (so `netra --help` lists them without importing anything)."""
    parser = NetraParser(prog="netra", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="verb", metavar="VERB")
    words = sys.argv[1:] if argv is None else argv
    verb = next((w for w in words if not w.startswith("-")), None)
    if verb in VERBS:
        register = importlib.import_module(VERBS[verb][0]).register
        if "words" in inspect.signature(register).parameters:  # nested verbs, imported lazily too
            register(sub, words=words)
        else:
            register(sub)
    for name, (_, text) in VERBS.items():
        if name not in sub.choices:
            sub.add_parser(name, help=text, add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    try:
        return int(func(args) or 0)
    except BrokenPipeError:
        # The reader went away (`netra status | head`): stop quietly, and keep the interpreter's
        # final flush of stdout from raising again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141  # as a shell reports a process killed by SIGPIPE


if __name__ == "__main__":
    sys.exit(main())
