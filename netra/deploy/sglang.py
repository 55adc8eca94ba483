"""SGLang worker commands: render them from a profile, and check them with SGLang's own parser.

`render_argv(profile, host=, port=)` turns a profile with ``engine.kind: sglang`` into the worker's
``python3 -m sglang.launch_server ...`` command, spelled as the pinned SGLang (0.5.23, see
`requirements/nodeps.txt`) spells its options. `worker_env(profile, gpus)` is the environment that
pins the worker to its GPU(s).

`check_argv(argv)` parses a rendered command with ``sglang.srt.server_args.prepare_server_args`` —
SGLang's own parser, from the pinned wheel — and returns the parsed record's fields. The article's
DP8 run was silently invalid because a wrapper dropped engine options; this is the check that a
rendered option is one SGLang knows, spelled exactly (argparse would otherwise accept an
abbreviation), with a value SGLang accepts, and that it lands on the field Netra meant
(`check_profile`).

Why a subprocess: the pinned wheel is installed with ``--no-deps`` (its full dependency set is
CUDA/ROCm-only), so importing its parser needs two documented shims that must not leak into the
caller's process (see `_import_server_args`), and ``prepare_server_args`` reconfigures the root
logger. One child process parses a whole batch of commands (a child's start is slow, mostly ``import torch``:
results/serving/NOTES.md).
"""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from netra.plugins import sglang as plugin

SGLANG_VERSION = "0.5.23"
LAUNCH_PREFIX: tuple[str, ...] = ("python3", "-m", "sglang.launch_server")
# The child's command-line switch (this module run with `python -m netra.deploy.sglang`).
_CHILD_FLAG = "--netra-parse-stdin"
_CHILD_TIMEOUT_S = 180.0

# Visible-devices variable per GPU target: CUDA for sm90, HIP for gfx950 (ROCm also honours
# CUDA_VISIBLE_DEVICES through HIP, but HIP_VISIBLE_DEVICES is the one its runtime documents).
VISIBLE_DEVICES_VAR: dict[str, str] = {"sm90": "CUDA_VISIBLE_DEVICES", "gfx950": "HIP_VISIBLE_DEVICES"}


class SGLangArgsError(ValueError):
    """A rendered SGLang command that SGLang's parser rejects, or that lost an option on the way."""


class SGLangUnavailable(RuntimeError):
    """The pinned SGLang wheel (or its parser's few imports) is not installed here."""


@dataclass(frozen=True)
class Option:
    """One rendered option: its exact 0.5.23 spelling, the ServerArgs field it sets, and the value
    that field must hold after parsing (None for store-true flags: the field must be True)."""

    flag: str
    dest: str
    value: Any = None

    def tokens(self) -> list[str]:
        if self.value is None:
            return [self.flag]
        if isinstance(self.value, list | tuple):
            return [self.flag, *(str(v) for v in self.value)]
        return [self.flag, str(self.value)]

    def expected(self) -> Any:
        if self.value is None:
            return True
        if isinstance(self.value, tuple):
            return list(self.value)
        return self.value


@dataclass(frozen=True)
class ServerArgsView:
    """The fields of the ServerArgs record SGLang's parser built from one command (JSON-plain values).

    Attribute access reads a field (``view.max_running_requests``); unknown names raise AttributeError.
    """

    argv: tuple[str, ...]
    fields: Mapping[str, Any] = field(repr=False)
    sglang_version: str = ""
    # SGLang's own resolution of the CUDA/HIP graph options ({"decode": {...}, "prefill": {...}}):
    # which backend captures graphs and at which batch sizes, as the server would.
    cuda_graph: Mapping[str, Any] = field(default_factory=dict, repr=False)
    # Option as spelled on the command line -> the ServerArgs field SGLang's parser writes it to (argparse's
    # dest): what `check_view` holds each rendered option's intended field against.
    dests: Mapping[str, str] = field(default_factory=dict, repr=False)
    # For DFLASH: the speculative fields after SGLang's own DFLASH handler ran on the record
    # (speculative_num_draft_tokens, speculative_num_steps, speculative_eagle_topk); empty otherwise, or
    # {"unresolved": why} where running it here would have read the drafter's config from the hub.
    speculative: Mapping[str, Any] = field(default_factory=dict, repr=False)

    def decode_graph_sizes(self) -> list[int]:
        """Decode batch sizes SGLang would capture (empty when decode graphs are disabled)."""
        decode = self.cuda_graph.get("decode", {})
        if decode.get("backend") == "disabled":
            return []
        return sorted(int(b) for b in decode.get("bs") or [])

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        try:
            return self.fields[name]
        except KeyError:
            raise AttributeError(f"SGLang ServerArgs has no field {name!r}") from None


# --- rendering --------------------------------------------------------------------------------------


def _require_sglang(profile: Any) -> None:
    if profile.engine.kind != "sglang":
        raise ValueError(f"profile {profile.name!r}: engine.kind is {profile.engine.kind!r}, not sglang")
    if profile.target not in VISIBLE_DEVICES_VAR:
        raise ValueError(f"profile {profile.name!r}: SGLang workers need a GPU target, not {profile.target!r}")


def options(profile: Any, *, host: str, port: int) -> list[Option]:
    """The worker's SGLang options, in rendering order, each with the field it must set."""
    _require_sglang(profile)
    e = profile.engine
    opts = [
        Option("--model-path", "model_path", e.model_path),
        Option("--served-model-name", "served_model_name", profile.serve.model_name),
        Option("--host", "host", host),
        Option("--port", "port", int(port)),
        # One GPU per worker: DP happens across workers behind nginx, never inside SGLang.
        Option("--tp-size", "tp_size", 1),
        Option("--dp-size", "dp_size", 1),
        Option("--random-seed", "random_seed", e.seed),
        Option("--max-running-requests", "max_running_requests", e.max_running_requests),
        Option("--context-length", "context_length", e.context_length),
        Option("--chunked-prefill-size", "chunked_prefill_size", e.chunked_prefill_size),
        Option("--stream-interval", "stream_interval", e.stream_interval),
        # Structured output through llguidance, as the embedded engine: the worker contract's `ebnf`
        # (Lark with embedded %json, used for tool calls) is read the same way by both engines.
        Option("--grammar-backend", "grammar_backend", "llguidance"),
    ]
    # Qwen3.5/3.6 think first, then answer or call tools (Qwen3-Coder XML). With a reasoning parser SGLang
    # wraps its grammar backend (ReasonerGrammarBackend): a /generate request carrying require_reasoning gets
    # its grammar only after </think>, so structured output starts after the reasoning, not inside it. The
    # tool-call parser configures SGLang's own /v1 endpoints (Netra's response layer parses /generate's
    # tokens itself), so the worker's OpenAI API reads the model's format as Netra does.
    reasoning = getattr(e, "reasoning_parser", None)
    if reasoning is not None:
        opts.append(Option("--reasoning-parser", "reasoning_parser", reasoning))
    tool_calls = getattr(e, "tool_call_parser", None)
    if tool_calls is not None:
        opts.append(Option("--tool-call-parser", "tool_call_parser", tool_calls))
    revision = getattr(getattr(profile, "checkpoint", None), "revision", None)
    if revision:
        opts.append(Option("--revision", "revision", revision))
    if e.mem_fraction_static is not None:
        opts.append(Option("--mem-fraction-static", "mem_fraction_static", e.mem_fraction_static))
    if e.cuda_graph_bs:
        # The explicit bucket list plus its maximum: SGLang pads a batch up to the next captured size,
        # and a max below max_running_requests leaves the top of the range eager (the launcher
        # refuses that; here we only spell what the profile says).
        opts.append(Option("--cuda-graph-bs-decode", "cuda_graph_bs_decode", tuple(e.cuda_graph_bs)))
        opts.append(Option("--cuda-graph-max-bs-decode", "cuda_graph_max_bs_decode", max(e.cuda_graph_bs)))
    else:
        opts.append(Option("--disable-cuda-graph", "disable_cuda_graph"))
    if e.kv_cache_dtype != "auto":
        opts.append(Option("--kv-cache-dtype", "kv_cache_dtype", e.kv_cache_dtype))
    if e.mamba_ssm_dtype is not None:
        opts.append(Option("--mamba-ssm-dtype", "mamba_ssm_dtype", e.mamba_ssm_dtype))
    if e.disable_radix_cache:
        opts.append(Option("--disable-radix-cache", "disable_radix_cache"))
    if e.incremental_streaming_output:
        opts.append(Option("--incremental-streaming-output", "incremental_streaming_output"))
    if e.enable_metrics:
        opts.append(Option("--enable-metrics", "enable_metrics"))
    # Options a tactic domain of Netra's plugin needs so that its hooked function is the one the worker
    # runs (moe: the Triton MoE runner's fused_experts), in netra.plugins.sglang.DOMAINS.
    for name in plugin.enabled(getattr(e, "tactics", "none")):
        for flag, dest, value in plugin.DOMAINS[name].sglang_options:
            opts.append(Option(flag, dest, value))
    backend = getattr(e, "attention_backend", None)
    if backend:
        opts.append(Option("--attention-backend", "attention_backend", backend))
    spec = e.speculative
    if spec is not None:
        opts.append(Option("--speculative-algorithm", "speculative_algorithm", spec.algorithm))
        opts.append(Option("--speculative-draft-model-path", "speculative_draft_model_path",
                           spec.draft_model_path))
        if spec.draft_revision:
            opts.append(Option("--speculative-draft-model-revision", "speculative_draft_model_revision",
                               spec.draft_revision))
        # One spelling for every algorithm, DFLASH included. In 0.5.23 --speculative-dflash-block-size is an
        # alias (arg_groups/fields/spec.py: "Alias of --speculative-num-draft-tokens for DFLASH"): SGLang's
        # DFLASH handler (arg_groups/speculative_hook.py `_handle_dflash`, reached through
        # SpeculativeAlgorithm.handle_server_args) copies it into speculative_num_draft_tokens and refuses the
        # two when both are set and differ; the DFLASH worker and verify input read only
        # speculative_num_draft_tokens (speculative/dflash_worker_v2.py, dflash_info_v2.py). Left unset, the
        # handler reads the drafter's config.json for its block size (a Hugging Face download on a hub id);
        # set, the block is the profile's, and check_profile runs that handler to show it resolves to it.
        opts.append(Option("--speculative-num-draft-tokens", "speculative_num_draft_tokens", spec.num_draft_tokens))
        if spec.num_steps is not None:
            opts.append(Option("--speculative-num-steps", "speculative_num_steps", spec.num_steps))
        if spec.eagle_topk is not None:
            opts.append(Option("--speculative-eagle-topk", "speculative_eagle_topk", spec.eagle_topk))
        if spec.draft_window_size is not None:
            opts.append(Option("--speculative-draft-window-size", "speculative_draft_window_size",
                               spec.draft_window_size))
        # Hybrid GDN targets (Qwen3.5/3.6) need no further option in 0.5.23. Its flag for the recurrent state
        # under speculation is --mamba-radix-cache-strategy (there is no --mamba-scheduler-strategy; the exact-
        # spelling check refuses it), and it governs only the mamba radix cache: with the radix cache off
        # (disable_radix_cache, as the throughput profiles run) the resolution declares nothing
        # (arg_groups/overrides.py `_mamba_radix_cache_resolution`) and extra_buffer is off whatever the flag
        # (model_override_base.py `mamba_extra_buffer_of`); with it on, `auto` resolves extra_buffer for
        # Qwen3_5Moe* under the default overlap schedule. The DFLASH worker commits the target's mamba state
        # after each verify itself (dflash_worker_v2.py `_update_target_mamba_state_after_verify`).
    return opts


def render_argv(profile: Any, *, host: str, port: int) -> list[str]:
    """The worker's launch command: ``python3 -m sglang.launch_server`` and its options."""
    argv = list(LAUNCH_PREFIX)
    for opt in options(profile, host=host, port=port):
        argv += opt.tokens()
    return argv


def expected_fields(profile: Any, *, host: str, port: int) -> dict[str, Any]:
    """ServerArgs field -> the value the rendered command must give it."""
    return {opt.dest: opt.expected() for opt in options(profile, host=host, port=port)}


def worker_env(profile: Any, gpus: list[int], *, evidence_dir: str | None = None) -> dict[str, str]:
    """The worker's environment: the visible-devices variable for its GPU(s), Netra's plugin
    (``SGLANG_PLUGINS`` and, when ``engine.tactics`` enables domains, their names and the directory
    ``evidence_dir`` where each worker process reports what it hooked and loaded), plus the profile's own.

    In a container with an NVIDIA device reservation the runtime already narrows the GPUs, and the
    one GPU shows up as index 0 (netra/deploy/compose.py sets ``CUDA_VISIBLE_DEVICES=0`` there).
    """
    _require_sglang(profile)
    if not gpus:
        raise ValueError(f"profile {profile.name!r}: a worker needs at least one GPU")
    if any(not isinstance(g, int) or isinstance(g, bool) or g < 0 for g in gpus):
        raise ValueError(f"profile {profile.name!r}: GPU indices must be non-negative integers, got {gpus}")
    env: dict[str, str] = {}
    for source in (getattr(profile, "env", None), getattr(profile.engine, "env", None)):
        if source:
            env.update({str(k): str(v) for k, v in dict(source).items()})
    var = VISIBLE_DEVICES_VAR[profile.target]
    if var in env:
        raise ValueError(f"profile {profile.name!r}: env sets {var}; placement owns it")
    env[var] = ",".join(str(g) for g in gpus)
    owned = plugin.worker_env(getattr(profile.engine, "tactics", "none"), evidence_dir)
    clash = sorted(set(owned) & set(env))
    if clash:
        raise ValueError(f"profile {profile.name!r}: env sets {clash}; engine.tactics owns them")
    env.update(owned)
    return env


# --- checking with SGLang's parser ------------------------------------------------------------------

_CACHE: dict[tuple[str, ...], ServerArgsView | str] = {}
# What the last parser child reported about itself: SGLang version and the import shims it applied.
LAST_CHILD: dict[str, Any] = {}


def check_argv(argv: Sequence[str]) -> ServerArgsView:
    """Parse one rendered command with SGLang's `prepare_server_args`; raise naming a bad option."""
    return check_argvs([argv])[0]


def parse_many(argvs: Iterable[Sequence[str]]) -> list[ServerArgsView | str]:
    """Parse many commands in one child process: a `ServerArgsView` per accepted command, SGLang's
    error (naming the option) per rejected one. Results are cached per command for this process."""
    keys = [tuple(str(t) for t in a) for a in argvs]
    todo = sorted({k for k in keys if k not in _CACHE})
    if todo:
        reply = _run_child([list(k) for k in todo])
        LAST_CHILD.update(sglang_version=reply.get("sglang_version"), shims=reply.get("shims"))
        version = str(reply.get("sglang_version", ""))
        for key, res in zip(todo, reply["results"], strict=True):
            if "error" in res:
                _CACHE[key] = str(res["error"])
            else:
                _CACHE[key] = ServerArgsView(argv=key, fields=res["fields"], sglang_version=version,
                                             cuda_graph=res["cuda_graph"], dests=res["dests"],
                                             speculative=res["speculative"])
    return [_CACHE[k] for k in keys]


def check_argvs(argvs: Iterable[Sequence[str]]) -> list[ServerArgsView]:
    """Parse many commands; raise `SGLangArgsError` listing every rejected command and the option
    SGLang named, or `SGLangUnavailable` when the parser cannot be imported here."""
    keys = [tuple(str(t) for t in a) for a in argvs]
    results = parse_many(keys)
    errors = [f"{r}  [command: {' '.join(k)}]" for k, r in zip(keys, results, strict=True) if isinstance(r, str)]
    if errors:
        raise SGLangArgsError(f"SGLang {SGLANG_VERSION} rejects {len(errors)} command(s):\n  "
                              + "\n  ".join(errors))
    return [r for r in results if isinstance(r, ServerArgsView)]


def check_profile(profile: Any, *, host: str = "127.0.0.1", port: int = 30000) -> ServerArgsView:
    """Render, parse, and check that every rendered option set exactly the field it was meant for (see
    `check_view`)."""
    view = check_argv(render_argv(profile, host=host, port=port))
    problems = check_view(profile, view, host=host, port=port)
    if problems:
        raise SGLangArgsError(f"profile {profile.name!r}: " + "; ".join(problems))
    return view


def check_view(profile: Any, view: ServerArgsView, *, host: str, port: int) -> list[str]:
    """Every way the parsed command misses the profile, each naming the option or field:
    - each rendered option is the one SGLang's parser writes to the field Netra meant (its argparse dest:
      an alias or a renamed option would land elsewhere) ...
    - ... and that field holds the rendered value (`compare_fields`);
    - for DFLASH, SGLang's own DFLASH handler resolves the verify block to the profile's
      ``engine.speculative.num_draft_tokens`` (the value its DFLASH worker reads)."""
    opts = options(profile, host=host, port=port)
    problems = []
    for opt in opts:
        dest = view.dests.get(opt.flag)
        if dest != opt.dest:
            problems.append(f"{opt.flag}: SGLang writes it to {dest!r}, Netra rendered it for {opt.dest!r}")
    problems += compare_fields(view, {opt.dest: opt.expected() for opt in opts})
    spec = profile.engine.speculative
    if spec is not None and spec.algorithm == "DFLASH":
        resolved = view.speculative.get("speculative_num_draft_tokens")
        if resolved != spec.num_draft_tokens:
            why = view.speculative.get("unresolved")
            problems.append(f"speculative_num_draft_tokens: SGLang's DFLASH handler resolves {resolved!r}, the "
                            f"profile sets {spec.num_draft_tokens}" + (f" ({why})" if why else ""))
    return problems


def compare_fields(view: ServerArgsView, expected: Mapping[str, Any]) -> list[str]:
    """Each field whose parsed value differs from what Netra rendered, named with both values."""
    problems = []
    for dest, want in expected.items():
        if dest not in view.fields:
            problems.append(f"option for {dest!r} reached no ServerArgs field")
            continue
        got = view.fields[dest]
        if got != want:
            problems.append(f"{dest}: rendered {want!r} but SGLang parsed {got!r}")
    return problems


def _run_child(argvs: list[list[str]]) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "netra.deploy.sglang", _CHILD_FLAG]
    try:
        proc = subprocess.run(cmd, input=json.dumps({"argvs": argvs}), capture_output=True, text=True,
                              timeout=_CHILD_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired as exc:
        raise SGLangUnavailable(f"SGLang parser child did not answer within {_CHILD_TIMEOUT_S:.0f} s") from exc
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-8:]
        raise SGLangUnavailable("cannot run SGLang's parser (pip install --no-deps -r requirements/nodeps.txt"
                                " and the pins in requirements/constraints.txt):\n  " + "\n  ".join(tail))
    reply: dict[str, Any] = json.loads(proc.stdout)
    return reply


# --- the child: import SGLang's parser and parse ------------------------------------------------------


def _import_server_args() -> tuple[Any, list[str]]:
    """Import ``sglang.srt.server_args`` from the pinned wheel; returns it and the shims applied."""
    shims = import_shims()
    import sglang.srt.server_args as server_args

    return server_args, shims


def import_shims() -> list[str]:
    """Make ``sglang.srt.*`` importable from the pinned wheel on a CPU machine; returns the shims applied.

    Two shims, both outside the parser (and the plugin framework, `netra.plugins.sglang`'s tests):
    1. ``sglang/__init__.py`` is SGLang's public frontend (the ``sglang.lang`` DSL and Hugging Face
       transformers patches) and imports transformers; the parser never uses it. The ``sglang``
       package is registered bare (same ``__path__``, its ``__init__`` not run), so ``sglang.srt.*``
       imports from the wheel unchanged.
    2. ``triton`` (a GPU compiler, no CPU wheel that belongs in a CPU venv) is imported at the top of
       ``sglang.srt.utils.common`` for kernel helpers. When it is absent an inert module stands in;
       any attribute use raises, so if a parser path ever touched it the check would fail loudly.
    Everything else on the import chain is real: torch (CPU), msgspec, psutil, pybase64, requests,
    pyzmq, numpy, orjson, pydantic, fastapi/starlette, PIL.
    """
    import importlib.machinery
    import importlib.util
    import types

    shims: list[str] = []
    if "sglang" not in sys.modules:
        spec = importlib.util.find_spec("sglang")
        if spec is None or not spec.submodule_search_locations:
            raise SGLangUnavailable(f"sglang=={SGLANG_VERSION} is not installed (requirements/nodeps.txt)")
        pkg = types.ModuleType("sglang", "SGLang package, frontend __init__ not run (netra parser shim)")
        pkg.__path__ = list(spec.submodule_search_locations)
        pkg.__spec__ = importlib.machinery.ModuleSpec("sglang", None, is_package=True)
        pkg.__spec__.submodule_search_locations = pkg.__path__
        sys.modules["sglang"] = pkg
        shims.append("sglang/__init__ (frontend) skipped")
    if importlib.util.find_spec("triton") is None:

        class _Absent(types.ModuleType):
            def __getattr__(self, name: str) -> Any:
                if name.startswith("__"):
                    raise AttributeError(name)
                raise RuntimeError(f"triton.{name}: triton is not installed (netra parser shim)")

        absent = _Absent("triton")
        absent.__spec__ = importlib.machinery.ModuleSpec("triton", None)
        sys.modules["triton"] = absent
        shims.append("triton absent (inert module)")
    return shims


def _parse_one(sa: Any, argv: list[str], flag_dests: Mapping[str, str]) -> dict[str, Any]:
    if tuple(argv[: len(LAUNCH_PREFIX)]) != LAUNCH_PREFIX:
        return {"error": f"not an SGLang launch command (must start with {' '.join(LAUNCH_PREFIX)!r})"}
    args = argv[len(LAUNCH_PREFIX):]
    # argparse accepts any unambiguous prefix of an option; a rendered command must use the exact
    # spelling, or a renamed option in a later SGLang would still "parse" by accident.
    dests: dict[str, str] = {}
    for tok in args:
        if tok.startswith("--"):
            flag = tok.split("=", 1)[0]
            if flag not in flag_dests:
                return {"error": f"option {flag}: not an exact SGLang {SGLANG_VERSION} option"}
            dests[flag] = flag_dests[flag]
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            record = sa.prepare_server_args(args)
    except SystemExit:
        lines = [ln for ln in err.getvalue().splitlines() if "error:" in ln]
        return {"error": lines[-1].split("error:", 1)[1].strip() if lines else err.getvalue().strip()}
    except Exception as exc:  # a type converter or validator raising: report it, keep parsing the batch
        return {"error": f"{type(exc).__name__}: {exc}"}
    algo = getattr(record, "speculative_algorithm", None)
    if algo is not None:
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        try:
            SpeculativeAlgorithm.from_string(algo)
        except ValueError as exc:
            return {"error": f"option --speculative-algorithm: {exc}"}
    fields = {f.name: sa._plain(getattr(record, f.name)) for f in sa.record_fields(type(record))}
    try:
        graph = _resolve_cuda_graph(record, sa)
    except Exception as exc:  # SGLang's graph resolution refusing the options is a finding, not a crash
        return {"error": f"cuda graph options: {type(exc).__name__}: {exc}"}
    speculative: dict[str, Any] = {}
    if algo is not None and str(algo).upper() == "DFLASH":
        try:
            speculative = _resolve_dflash(sa, args)
        except Exception as exc:  # SGLang's DFLASH handler refusing the options (e.g. both spellings differ)
            return {"error": f"DFLASH options: {type(exc).__name__}: {exc}"}
    return {"fields": json.loads(json.dumps(fields, default=repr)), "cuda_graph": graph, "dests": dests,
            "speculative": speculative}


_DFLASH_RESOLVED = ("speculative_num_draft_tokens", "speculative_num_steps", "speculative_eagle_topk")


def _resolve_dflash(sa: Any, args: list[str]) -> dict[str, Any]:
    """Run SGLang's own DFLASH handler (``SpeculativeAlgorithm.handle_server_args``, i.e.
    `_handle_dflash`) on a fresh record of the command and return the speculative fields it resolves.

    It is one stage of `ServerArgs.resolve_once`; on a command with an explicit block (either spelling) it
    reads no checkpoint. Two things stand in for what the server's earlier stages do on a GPU host: the
    device, which SGLang's platform resolves to ``cuda`` there (NVIDIA and ROCm alike; profiles say
    ``engine.device: cuda``), and the bookkeeping attributes `_resolve_cuda_graph` also sets. Where the
    handler would read the drafter's config (no block given, or a trtllm_mha draft backend) it is not run.
    """
    from sglang.srt.arg_groups.overrides import resolving_view
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    record = sa.prepare_server_args(args)
    if record.speculative_num_draft_tokens is None and record.speculative_dflash_block_size is None:
        return {"unresolved": "no block size given: SGLang would read it from the drafter's config.json"}
    backends = (record.speculative_draft_attention_backend, record.attention_backend,
                record.decode_attention_backend, record.prefill_attention_backend)
    if "trtllm_mha" in backends:
        return {"unresolved": "a trtllm_mha draft backend: SGLang would read the drafter's config.json"}
    if record.device is None:
        record.device = "cuda"
    record._raw_input = {f.name: getattr(record, f.name) for f in sa.record_fields(type(record))}
    record._resolved_overrides = []
    SpeculativeAlgorithm.from_string(record.speculative_algorithm).handle_server_args(record)
    view = resolving_view(record)
    return {name: sa._plain(getattr(view, name)) for name in _DFLASH_RESOLVED}


def _resolve_cuda_graph(record: Any, sa: Any) -> dict[str, Any]:
    """Run SGLang's own graph-option resolution (`parse_cuda_graph_config`, model-independent) on the
    parsed record (its fields were already read). It is one stage of `ServerArgs.resolve_once`, whose
    whole pipeline needs the checkpoint's config; the two bookkeeping attributes set here are what
    that pipeline sets before its first stage (pinned 0.5.23)."""
    from sglang.srt.arg_groups.cuda_graph_hook import parse_cuda_graph_config
    from sglang.srt.arg_groups.overrides import resolving_view

    record._raw_input = {f.name: getattr(record, f.name) for f in sa.record_fields(type(record))}
    record._resolved_overrides = []
    parse_cuda_graph_config(record)
    config = resolving_view(record).cuda_graph_config
    return {"decode": sa._plain(config.decode), "prefill": sa._plain(config.prefill)}


def _child_main() -> int:
    request = json.load(sys.stdin)
    reply_to = sys.stdout
    # SGLang may print while importing or parsing; only the JSON reply goes to the real stdout.
    with contextlib.redirect_stdout(sys.stderr):
        reply = _child_reply(request)
    reply_to.write(json.dumps(reply))
    return 0


def _child_reply(request: dict[str, Any]) -> dict[str, Any]:
    import argparse
    from importlib import metadata

    sa, shims = _import_server_args()
    version = metadata.version("sglang")
    if version != SGLANG_VERSION:
        raise SGLangUnavailable(f"sglang {version} is installed; Netra renders for {SGLANG_VERSION}")
    parser = argparse.ArgumentParser()
    sa.ServerArgs.add_cli_args(parser)
    flag_dests = {s: action.dest for action in parser._actions for s in action.option_strings}
    results = [_parse_one(sa, list(argv), flag_dests) for argv in request["argvs"]]
    return {"sglang_version": version, "shims": shims, "results": results}


def _add_arguments(parser: Any) -> None:
    parser.add_argument("profiles", nargs="*", help="profile names (default: every sglang profile)")


_CHECK_HELP = ("render each SGLang profile's worker command, parse it with SGLang's own parser, and print "
               "what reached SGLang (exit 1 when any profile fails)")


def register(sub: Any) -> None:
    """`netra sglang check PROFILE...` (`_CHECK_HELP`)."""
    from netra.cli import add_verb

    verbs = add_verb(sub, "sglang").add_subparsers(dest="sglang_verb", metavar="WHAT", required=True)
    p = verbs.add_parser("check", help=_CHECK_HELP, description=_CHECK_HELP)
    _add_arguments(p)
    p.set_defaults(func=check)


def main(argv: list[str] | None = None) -> int:
    from netra.cli import NetraParser

    parser = NetraParser(prog="netra sglang check", description=_CHECK_HELP)
    _add_arguments(parser)
    return check(parser.parse_args(argv))


def check(args: Any) -> int:
    from netra.deploy.profile import ProfileError, list_profiles, load_profile

    failed = 0
    try:
        profiles = [load_profile(n) for n in (args.profiles or list_profiles())]
    except ProfileError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    profiles = [p for p in profiles if p.engine.kind == "sglang" or args.profiles]
    # One parser child for all of them (check_profile then reads the cache).
    parse_many([render_argv(p, host="127.0.0.1", port=30000) for p in profiles if p.engine.kind == "sglang"])
    for p in profiles:
        try:
            view = check_profile(p)
        except (SGLangArgsError, ValueError) as exc:
            print(f"{p.name}: FAILED: {exc}")
            failed += 1
            continue
        decode = view.cuda_graph.get("decode", {})
        print(f"{p.name}: ok, {len(expected_fields(p, host='127.0.0.1', port=30000))} options reached their "
              f"SGLang {view.sglang_version} fields; decode graphs {decode.get('backend')} at "
              f"{view.decode_graph_sizes()}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(_child_main() if _CHILD_FLAG in sys.argv else main())
