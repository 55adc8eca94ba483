"""Deployment profiles: one YAML data file per profile under `launcher/`, validated against a schema.

The schema is the frozen dataclasses below (configuration is data; the code is the schema):
`launcher/schema.json` is generated from them (`netra plan --write-schema`) and a test keeps the two
equal. An unknown key, a missing key or a bad value is a `ProfileError` naming the dotted path.

A profile's identity is `Profile.canonical_json()` (sorted keys, compact, every default filled in)
and its sha256; `launcher/lock.json` records that hash per profile so that an edit made after the
lock is refused at launch (re-lock with `netra plan --relock --profile NAME`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import types
import typing
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from netra.resources import DATA_ROOT

PROFILE_DIR = DATA_ROOT / "launcher"
SCHEMA_PATH = PROFILE_DIR / "schema.json"
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")

Target = Literal["cpu", "sm90", "gfx950"]
# Tactic domains of the SGLang plugin (the keys of netra.plugins.sglang.DOMAINS; a test keeps them equal).
Domain = Literal["moe", "argmax"]
# Parser names of SGLang 0.5.23 (sglang/srt/parser/reasoning_parser_names.py and
# sglang/srt/function_call/parser_names.py) that fit the Qwen models Netra serves; tests/deploy/test_sglang.py
# parses each with SGLang's own parser. The embedded engine knows the same reasoning parsers
# (netra.engine.options.REASONING_PARSERS; a test keeps them equal).
ReasoningParser = Literal["qwen3"]
ToolCallParser = Literal["qwen3_coder", "qwen25"]
# Which GPU vendor a target runs on (PCI vendor ids are in netra/deploy/topology.py).
TARGET_VENDOR: dict[str, str | None] = {"cpu": None, "sm90": "nvidia", "gfx950": "amd"}


class ProfileError(ValueError):
    """A profile that cannot be used; the message names the file and the offending key."""


def _meta(doc: str, *, ge: float | None = None, le: float | None = None, pattern: str | None = None,
          ) -> dict[str, Any]:
    return {"doc": doc, "ge": ge, "le": le, "pattern": pattern}


@dataclass(frozen=True)
class Speculative:
    algorithm: Literal["DFLASH", "EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM"] = field(
        metadata=_meta("speculative algorithm (SGLang --speculative-algorithm)"))
    draft_model_path: str = field(metadata=_meta("draft checkpoint: local folder or Hugging Face repo id"))
    num_draft_tokens: int = field(metadata=_meta("tokens verified per step (DFlash block size)", ge=1, le=64))
    num_steps: int | None = field(default=None, metadata=_meta("draft steps (EAGLE family)", ge=1, le=64))
    eagle_topk: int | None = field(default=None, metadata=_meta("draft top-k per step (EAGLE family)", ge=1))
    draft_window_size: int | None = field(default=None, metadata=_meta("draft attention window (tokens)", ge=1))
    # The drafter's identity, as checkpoint.* is the target's: the profile lock covers both keys, and the launch
    # refuses a local drafter folder that is missing or whose config.json hashes otherwise (netra/deploy/verify.py).
    draft_revision: str | None = field(default=None, metadata=_meta(
        "drafter's Hugging Face revision (commit), SGLang's --speculative-draft-model-revision; null: SGLang's "
        "default (main)"))
    draft_config_sha256: str | None = field(default=None, metadata=_meta(
        "sha256 of the drafter's config.json; a launch whose drafter folder is missing or differs is refused",
        pattern=r"^[0-9a-f]{64}$"))


@dataclass(frozen=True)
class Engine:
    kind: Literal["sglang", "netra"] = field(metadata=_meta("sglang (production) or netra (embedded engine)"))
    preset: str | None = field(default=None, metadata=_meta(
        "embedded-engine model preset (tiny, qwen36-35b-a3b); null for sglang", pattern=r"^[a-z0-9][a-z0-9-]*$"))
    model_path: str | None = field(default=None, metadata=_meta(
        "checkpoint: local folder or Hugging Face repo id (sglang: required); netra: a local folder (relative: "
        "under the run directory, $NETRA_RUN_DIR), null = seeded weights"))
    device: Literal["cpu", "cuda"] = field(default="cuda", metadata=_meta("embedded-engine device"))
    max_running_requests: int = field(default=128, metadata=_meta("running requests per worker", ge=1, le=4096))
    context_length: int = field(default=65536, metadata=_meta("max tokens per request", ge=16, le=1 << 21))
    chunked_prefill_size: int = field(default=32768, metadata=_meta("prefill tokens per batch", ge=16))
    mem_fraction_static: float | None = field(default=None, metadata=_meta(
        "fraction of GPU memory for weights + KV/state pools (null: engine default)", ge=0.05, le=0.99))
    mixed_chunk: Literal["off", "split", "fused"] | None = field(default=None, metadata=_meta(
        "embedded engine: prompts arriving while requests decode run in mixed steps, split (decode graph + "
        "prefill forward) or fused (one forward), or off (prefill steps stall decode); null: engine default"))
    decode_overlap: bool = field(default=False, metadata=_meta(
        "embedded engine: chain greedy decode steps on the device (step N+1 launched from step N's tokens before "
        "the host reads them); off until its H200 A/B"))
    cuda_graph_bs: tuple[int, ...] = field(default=(), metadata=_meta(
        "decode graph batch buckets, ascending; must reach max_running_requests (empty: no graphs)", ge=1))
    kv_cache_dtype: Literal["auto", "fp8_e4m3", "bfloat16"] = field(default="auto", metadata=_meta(
        "KV cache dtype"))
    mamba_ssm_dtype: Literal["float32", "bfloat16", "float16"] | None = field(default=None, metadata=_meta(
        "recurrent (GDN) state storage dtype (null: engine default)"))
    disable_radix_cache: bool = field(default=False, metadata=_meta("disable prefix caching (benchmarks)"))
    stream_interval: int = field(default=1, metadata=_meta("decode steps per streamed event", ge=1, le=64))
    incremental_streaming_output: bool = field(default=True, metadata=_meta(
        "stream only the new suffix (never the cumulative output)"))
    enable_metrics: bool = field(default=True, metadata=_meta("Prometheus metrics on the worker"))
    seed: int = field(default=0, metadata=_meta("engine random seed", ge=0))
    speculative: Speculative | None = field(default=None, metadata=_meta("speculative decoding (null: off)"))
    tactics: tuple[Domain, ...] | Literal["none"] = field(default="none", metadata=_meta(
        "tactic domains Netra's SGLang plugin puts in each worker (netra/plugins/sglang.py): a list of moe, "
        "argmax; none: the plugin stays out (SGLANG_PLUGINS=none)"))
    tactic_min_maturity: Literal["experiment", "verified", "accepted"] | None = field(default=None, metadata=_meta(
        "lowest contract maturity dispatch selects in each worker (NETRA_TACTIC_MIN_MATURITY); null: the "
        "engine default, accepted"))
    reasoning_parser: ReasoningParser | None = field(default=None, metadata=_meta(
        "SGLang's --reasoning-parser, for both engines: the model thinks first (<think> ... </think>), and a "
        "request with require_reasoning gets its grammar (structured output, tool calls) only after </think>; "
        "null: no reasoning phase (grammars apply from the first token)"))
    tool_call_parser: ToolCallParser | None = field(default=None, metadata=_meta(
        "SGLang's --tool-call-parser (SGLang workers only): the tool-call format its own /v1 endpoints parse "
        "(Netra's response layer parses tool calls itself from /generate); qwen3_coder: Qwen3-Coder XML "
        "(Qwen3.5/3.6), qwen25: Hermes-style JSON in <tool_call> (Qwen2.5/Qwen3)"))


@dataclass(frozen=True)
class Serve:
    model_name: str = field(metadata=_meta("model name served at /v1/models", pattern=r"^[A-Za-z0-9._/:-]+$"))
    api_key_env: str | None = field(default=None, metadata=_meta(
        "environment variable holding the API key every request must carry (Authorization: Bearer KEY, as "
        "SGLang's and vLLM's --api-key); null: no key", pattern=r"^[A-Z_][A-Z0-9_]*$"))
    max_body_bytes: int = field(default=8 << 20, metadata=_meta(
        "request body limit, at nginx and at each response layer (413 past it)", ge=1024))
    max_choices: int = field(default=64, metadata=_meta("choices per request, prompts x n (400 past it)",
                                                        ge=1, le=1024))
    queue_timeout_s: float = field(default=60.0, metadata=_meta(
        "seconds a request may wait for an upstream slot at its response layer before a 503 with Retry-After",
        ge=0.1))
    # The response layer's own probe of its worker, for fast failover (its new requests, and those
    # that sent nothing yet, get 503 so nginx passes them on); the supervisor's probes are separate.
    probe_interval_s: float = field(default=1.0, metadata=_meta(
        "seconds between the response layer's liveness probes of its worker", ge=0.1))
    probe_timeout_s: float = field(default=2.0, metadata=_meta("deadline of one such probe", ge=0.1))
    probe_misses: int = field(default=2, metadata=_meta(
        "missed probes in a row after which the response layer refuses with 503 until the worker answers", ge=1))


@dataclass(frozen=True)
class Front:
    host: str = field(default="127.0.0.1", metadata=_meta("listen address of the public endpoint"))
    port: int = field(default=8000, metadata=_meta("listen port of the public endpoint", ge=1, le=65535))
    balance: Literal["round_robin", "least_conn"] = field(default="round_robin", metadata=_meta(
        "nginx upstream balancing"))
    target_concurrency: int = field(default=1024, metadata=_meta(
        "requests in flight the front admits (past it: a JSON 503 with Retry-After); nginx worker processes, "
        "connections and fds are sized from it", ge=1, le=1 << 20))
    keepalive: int = field(default=64, metadata=_meta("idle keepalive connections to upstreams per worker", ge=1))
    max_fails: int = field(default=1, metadata=_meta("passive health: failures before marking down", ge=0))
    fail_timeout_s: int = field(default=5, metadata=_meta("passive health: seconds marked down", ge=1))
    read_timeout_s: int = field(default=3600, metadata=_meta(
        "upstream read timeout: the longest wait for a worker's response headers (a non-streamed response's "
        "come with its last token) or between two reads of a stream", ge=1))
    connect_timeout_s: int = field(default=2, metadata=_meta("upstream connect timeout", ge=1, le=60))


@dataclass(frozen=True)
class Ports:
    engine_base: int = field(default=30000, metadata=_meta("worker i's engine port = engine_base + i",
                                                           ge=1024, le=65000))
    serve_base: int = field(default=31000, metadata=_meta("worker i's response-layer port = serve_base + i",
                                                          ge=1024, le=65000))


@dataclass(frozen=True)
class Supervisor:
    max_restarts: int = field(default=5, metadata=_meta(
        "restarts of a worker (or nginx) within restart_window_s; one more gives it up", ge=0))
    restart_window_s: float = field(default=600.0, metadata=_meta("the restart budget's window", ge=1.0))
    backoff_initial_s: float = field(default=0.5, metadata=_meta("first restart delay", ge=0.0, le=60.0))
    backoff_max_s: float = field(default=10.0, metadata=_meta("restart delay cap (doubling)", ge=0.0, le=600.0))
    health_timeout_s: float = field(default=600.0, metadata=_meta("seconds a worker may take to be healthy",
                                                                  ge=1.0))
    probe_interval_s: float = field(default=2.0, metadata=_meta("seconds between liveness probes", ge=0.1))
    probe_timeout_s: float = field(default=5.0, metadata=_meta("deadline of one liveness probe", ge=0.1))
    probe_misses: int = field(default=3, metadata=_meta(
        "missed probes in a row that make a process unresponsive (out of rotation)", ge=1))
    stall_s: float = field(default=300.0, metadata=_meta(
        "a busy engine that completed no scheduler step for this long is unresponsive", ge=1.0))
    recover_s: float = field(default=30.0, metadata=_meta(
        "seconds an unresponsive worker stays out of rotation before its process is restarted", ge=0.0))


@dataclass(frozen=True)
class Checkpoint:
    config_sha256: str | None = field(default=None, metadata=_meta(
        "sha256 of the checkpoint's config.json", pattern=r"^[0-9a-f]{64}$"))
    revision: str | None = field(default=None, metadata=_meta("Hugging Face revision (commit)"))


class Canonical:
    """A frozen dataclass's identity: its plain dict, that dict's canonical JSON and the JSON's sha256."""

    def to_dict(self) -> dict[str, Any]:
        return _to_plain(self)

    def canonical_json(self) -> str:
        return canonical_json(self.to_dict())

    def sha256(self) -> str:
        return hashlib.sha256(self.canonical_json().encode()).hexdigest()


@dataclass(frozen=True)
class Profile(Canonical):
    name: str = field(metadata=_meta("profile name (= file stem)", pattern=NAME_RE.pattern))
    description: str = field(metadata=_meta("one line: what this profile is for"))
    target: Target = field(metadata=_meta("kernel target: cpu, sm90 (H100/H200) or gfx950 (MI350X)"))
    dp: int = field(metadata=_meta("data-parallel workers (one GPU each on GPU targets)", ge=1, le=64))
    engine: Engine = field(metadata=_meta("worker engine options"))
    serve: Serve = field(metadata=_meta("response layer options"))
    strict: bool = field(default=False, metadata=_meta(
        "production/benchmark: unpinned images, unlocked profiles or missing kernel locks refuse to start"))
    image: str | None = field(default=None, metadata=_meta("image name in the image lock (images/)"))
    front: Front = field(default_factory=Front, metadata=_meta("nginx front"))
    ports: Ports = field(default_factory=Ports, metadata=_meta("port bases"))
    supervisor: Supervisor = field(default_factory=Supervisor, metadata=_meta("restart policy"))
    checkpoint: Checkpoint = field(default_factory=Checkpoint, metadata=_meta("checkpoint identity"))

    @property
    def gpu_vendor(self) -> str | None:
        return TARGET_VENDOR[self.target]

    @property
    def uses_gpus(self) -> bool:
        return self.gpu_vendor is not None

    def replace(self, dotted: str, value: Any) -> Profile:
        """A copy with one dotted key changed (``engine.stream_interval``), re-validated."""
        raw = self.to_dict()
        node = raw
        *parents, leaf = dotted.split(".")
        for part in parents:
            if not isinstance(node.get(part), dict):
                raise ProfileError(f"override {dotted!r}: {part!r} is not a section")
            node = node[part]
        if leaf not in node:
            raise ProfileError(f"override {dotted!r}: unknown key {leaf!r}")
        node[leaf] = value
        return profile_from_dict(raw, source=f"{self.name} with {dotted}={value!r}")

    def with_sets(self, sets: Iterable[str]) -> Profile:
        """A copy with each ``KEY=VALUE`` of the CLI's ``--set`` (the value read as YAML) applied in order."""
        prof = self
        for item in sets:
            key, sep, raw = item.partition("=")
            if not sep:
                raise ProfileError(f"--set {item!r}: expected KEY=VALUE")
            prof = prof.replace(key.strip(), yaml.safe_load(raw))
        return prof


def canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def _to_plain(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: _to_plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, tuple | list):
        return [_to_plain(v) for v in obj]
    if isinstance(obj, dict):
        return {k: _to_plain(v) for k, v in obj.items()}
    return obj


# --- validation -----------------------------------------------------------------------------------

def _check_meta(path: str, value: Any, meta: dict[str, Any]) -> None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        if meta.get("ge") is not None and value < meta["ge"]:
            raise ProfileError(f"{path}: {value!r} is below the minimum {meta['ge']}")
        if meta.get("le") is not None and value > meta["le"]:
            raise ProfileError(f"{path}: {value!r} is above the maximum {meta['le']}")
    if isinstance(value, str) and meta.get("pattern") and not re.fullmatch(meta["pattern"], value):
        raise ProfileError(f"{path}: {value!r} does not match {meta['pattern']}")


def _convert(path: str, tp: Any, value: Any, meta: dict[str, Any]) -> Any:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None:
            if type(None) in args:
                return None
            raise ProfileError(f"{path}: null is not allowed")
        inner = [a for a in args if a is not type(None)]
        if len(inner) == 1:
            return _convert(path, inner[0], value, meta)
        errors = []
        for alt in inner:  # a union of several shapes (a list or a keyword): the first that fits
            try:
                return _convert(path, alt, value, meta)
            except ProfileError as exc:
                errors.append(str(exc).removeprefix(f"{path}: "))
        raise ProfileError(f"{path}: {value!r} fits none of: " + "; ".join(errors))
    if origin is Literal:
        choices = typing.get_args(tp)
        if value not in choices:
            raise ProfileError(f"{path}: {value!r} is not one of {list(choices)}")
        return value
    if origin is tuple:
        (item_tp, _) = typing.get_args(tp)
        if not isinstance(value, list | tuple):
            raise ProfileError(f"{path}: expected a list, got {type(value).__name__}")
        return tuple(_convert(f"{path}[{i}]", item_tp, v, meta) for i, v in enumerate(value))
    if dataclasses.is_dataclass(tp):
        return _build(tp, value, path)
    if tp is bool:
        if not isinstance(value, bool):
            raise ProfileError(f"{path}: expected true/false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ProfileError(f"{path}: expected an integer, got {value!r}")
        _check_meta(path, value, meta)
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ProfileError(f"{path}: expected a number, got {value!r}")
        _check_meta(path, float(value), meta)
        return float(value)
    if tp is str:
        if not isinstance(value, str) or not value:
            raise ProfileError(f"{path}: expected a non-empty string, got {value!r}")
        _check_meta(path, value, meta)
        return value
    raise TypeError(f"schema type {tp!r} at {path} is not supported")  # a bug in this module


def _build(cls: Any, raw: Any, path: str) -> Any:
    if not isinstance(raw, dict):
        raise ProfileError(f"{path or 'profile'}: expected a mapping, got {type(raw).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        where = f"{path}." if path else ""
        raise ProfileError(f"unknown key {where}{unknown[0]} (allowed here: {sorted(fields)})")
    kwargs: dict[str, Any] = {}
    for name, f in fields.items():
        sub = f"{path}.{name}" if path else name
        if name not in raw:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ProfileError(f"missing key {sub}")
            continue
        kwargs[name] = _convert(sub, hints[name], raw[name], dict(f.metadata))
    return cls(**kwargs)


def _cross_checks(p: Profile) -> None:
    e = p.engine
    if e.kind == "netra" and not e.preset:
        raise ProfileError("engine.preset: the embedded engine (kind netra) needs a preset")
    if e.kind == "sglang":
        if not e.model_path:
            raise ProfileError("engine.model_path: an SGLang worker needs a checkpoint")
        if p.target == "cpu":
            raise ProfileError("target: SGLang profiles run on a GPU target (sm90 or gfx950), not cpu")
    if e.kind == "sglang" and e.mixed_chunk is not None:
        raise ProfileError("engine.mixed_chunk: an embedded-engine option (kind netra); SGLang workers take "
                           "their own scheduling flags")
    if e.kind == "sglang" and e.decode_overlap:
        raise ProfileError("engine.decode_overlap: an embedded-engine option (kind netra); SGLang workers take "
                           "their own scheduling flags")
    if e.kind != "sglang" and e.tool_call_parser is not None:
        raise ProfileError("engine.tool_call_parser: SGLang workers only (it configures SGLang's own /v1 "
                           "endpoints); the embedded engine has no OpenAI layer, Netra's response layer parses "
                           "tool calls (leave it null)")
    if e.tactics != "none":
        if e.kind != "sglang":
            raise ProfileError("engine.tactics: only SGLang workers load Netra's plugin; the embedded engine "
                               "runs every op through dispatch (leave tactics at none)")
        if not e.tactics:
            raise ProfileError("engine.tactics: an empty list; write none to leave the plugin out")
        repeated = sorted({d for d in e.tactics if e.tactics.count(d) > 1})
        if repeated:
            raise ProfileError(f"engine.tactics: {repeated} listed more than once")
    if p.target == "cpu" and e.device != "cpu":
        raise ProfileError(f"engine.device: target cpu runs the engine on cpu, not {e.device}")
    if p.target != "cpu" and e.device != "cuda":
        raise ProfileError(f"engine.device: target {p.target} runs on a GPU (cuda), not {e.device}")
    bs = e.cuda_graph_bs
    if list(bs) != sorted(set(bs)):
        raise ProfileError(f"engine.cuda_graph_bs: {list(bs)} must be strictly ascending")
    if e.chunked_prefill_size > e.context_length:
        raise ProfileError(f"engine.chunked_prefill_size: {e.chunked_prefill_size} exceeds "
                           f"engine.context_length {e.context_length}")
    if p.ports.engine_base == p.ports.serve_base:
        raise ProfileError("ports: engine_base and serve_base must differ")
    # Graph-bucket coverage is a launch refusal (netra/deploy/verify.py), not a parse error, so that
    # `netra plan` can still show such a profile and say why it will not start.


def netra_model_dir(e: Engine) -> Path | None:
    """The embedded engine's checkpoint folder: ``engine.model_path`` itself when absolute, under the run
    directory (``$NETRA_RUN_DIR``) when relative, so that a committed profile can name a folder that
    `netra checkpoint synth` writes there without knowing the machine's paths; None for seeded weights
    and for SGLang workers (whose model_path may be a Hugging Face repo id)."""
    if e.kind != "netra" or not e.model_path:
        return None
    path = Path(e.model_path).expanduser()
    if path.is_absolute():
        return path
    from netra import settings

    return Path(settings.get("NETRA_RUN_DIR")) / path


def profile_from_dict(raw: Any, source: str = "<dict>") -> Profile:
    try:
        prof = _build(Profile, raw, "")
        _cross_checks(prof)
    except ProfileError as exc:
        raise ProfileError(f"{source}: {exc}") from None
    return typing.cast(Profile, prof)


def profile_path(name_or_path: str | Path) -> Path:
    text = str(name_or_path)
    if NAME_RE.fullmatch(text):
        return PROFILE_DIR / f"{text}.yaml"
    return Path(text)


def load_profile(name_or_path: str | Path) -> Profile:
    """Load a profile by name (`launcher/<name>.yaml`) or by path; validate it fully."""
    path = profile_path(name_or_path)
    if not path.is_file():
        known = ", ".join(list_profiles()) or "none"
        raise ProfileError(f"profile {name_or_path!r}: no file {path} (known profiles: {known})")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ProfileError(f"{path}: not valid YAML: {exc}") from None
    prof = profile_from_dict(raw, source=str(path))
    if path.parent.resolve() == PROFILE_DIR.resolve() and prof.name != path.stem:
        raise ProfileError(f"{path}: name {prof.name!r} differs from the file name {path.stem!r}")
    return prof


def list_profiles() -> list[str]:
    return sorted(p.stem for p in PROFILE_DIR.glob("*.yaml"))


# --- schema (derived from the dataclasses) ------------------------------------------------------

def _schema_of(tp: Any, meta: dict[str, Any]) -> dict[str, Any]:
    origin = typing.get_origin(tp)
    out: dict[str, Any]
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        out = {"anyOf": [_schema_of(a, meta) for a in args if a is not type(None)]
               + ([{"type": "null"}] if type(None) in args else [])}
    elif origin is Literal:
        out = {"enum": list(typing.get_args(tp))}
    elif origin is tuple:
        out = {"type": "array", "items": _schema_of(typing.get_args(tp)[0], meta)}
    elif dataclasses.is_dataclass(tp):
        out = schema_for(tp)
    else:
        out = {"type": {bool: "boolean", int: "integer", float: "number", str: "string"}[tp]}
        if tp in (int, float):
            if meta.get("ge") is not None:
                out["minimum"] = meta["ge"]
            if meta.get("le") is not None:
                out["maximum"] = meta["le"]
        if tp is str:
            out["minLength"] = 1
            if meta.get("pattern"):
                out["pattern"] = meta["pattern"]
    return out


def schema_for(cls: Any) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    props: dict[str, Any] = {}
    required: list[str] = []
    for f in dataclasses.fields(cls):
        meta = dict(f.metadata)
        props[f.name] = {"description": meta.get("doc", ""), **_schema_of(hints[f.name], meta)}
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            required.append(f.name)
        elif f.default is not dataclasses.MISSING:
            props[f.name]["default"] = _to_plain(f.default)
    return {"type": "object", "additionalProperties": False, "properties": props, "required": required}


def profile_schema() -> dict[str, Any]:
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": "Netra deployment profile",
            **schema_for(Profile)}


def render_schema() -> str:
    return json.dumps(profile_schema(), indent=2, sort_keys=True) + "\n"
