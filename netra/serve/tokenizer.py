"""Tokenizer and chat template of the upstream's model, found through its `/model_info`.

- A checkpoint (SGLang, or the embedded engine loading a Hugging Face directory): `tokenizer.json`
  through the `tokenizers` library and the chat template of `tokenizer_config.json` (or
  `chat_template.jinja`), rendered with Jinja2 in a sandbox as Hugging Face renders it.
- The embedded engine's seeded presets (e.g. `tiny`): the byte tokenizer (`netra.tokenizers`, shared
  with the engine) and a plain `role: content` chat template.
"""

from __future__ import annotations

import datetime as _dt
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from netra.tokenizers import BYTE_SPECIALS, ByteTokenizer, HFTokenizer
from netra.web.errors import OpenAIError


class TextTokenizer(Protocol):
    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str: ...


def _token_str(value: Any) -> str:
    if isinstance(value, dict):  # {"content": "<|im_end|>", ...} in older tokenizer configs
        return str(value.get("content", ""))
    return "" if value is None else str(value)


class ChatTemplate:
    """A Hugging Face chat template (Jinja2), or the plain template when `source` is None."""

    def __init__(self, source: str | None, bos_token: str = "", eos_token: str = "") -> None:
        self.source = source
        self._bos = bos_token
        self._eos = eos_token
        self._template: Any = None
        if source is not None:
            from jinja2.exceptions import TemplateError
            from jinja2.sandbox import ImmutableSandboxedEnvironment

            def raise_exception(message: str) -> None:
                raise TemplateError(message)

            def strftime_now(fmt: str) -> str:
                return _dt.datetime.now().strftime(fmt)

            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                extensions=["jinja2.ext.loopcontrols"])
            env.filters["tojson"] = lambda x, indent=None, **_: json.dumps(x, ensure_ascii=False, indent=indent)
            env.globals["raise_exception"] = raise_exception
            env.globals["strftime_now"] = strftime_now
            self._template = env.from_string(source)

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
               extra: dict[str, Any] | None = None, tools: list[dict[str, Any]] | None = None) -> str:
        if self._template is None:
            # The plain template: no special tokens, so any byte-level tokenizer encodes it.
            text = "".join(f"{m['role']}: {m.get('content') or ''}\n" for m in messages)
            return text + ("assistant:" if add_generation_prompt else "")
        try:
            return str(self._template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                             bos_token=self._bos, eos_token=self._eos, tools=tools,
                                             **(extra or {})))
        except Exception as exc:  # whatever the template raises is about these messages: a 400, never a 500
            raise OpenAIError(400, f"the chat template could not render the messages: {type(exc).__name__}: {exc}",
                              param="messages") from exc


# generation_config.json's sampling keys that become a request's defaults (SGLang's --sampling-defaults model).
SAMPLING_DEFAULT_KEYS = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty")


@dataclass
class ModelText:
    tokenizer: TextTokenizer
    chat_template: ChatTemplate
    source: str  # where the tokenizer came from, for logs and /v1/models
    max_token_chars: int = 1  # characters one token decodes to, at most (bounds a prompt's length)
    # The checkpoint's generation_config.json sampling values (SAMPLING_DEFAULT_KEYS present there).
    sampling_defaults: dict[str, float | int] = field(default_factory=dict)
    added_tokens: frozenset[str] = frozenset()  # the vocabulary's added tokens (special to llguidance)


def sampling_defaults(directory: Path) -> dict[str, float | int]:
    """generation_config.json's sampling values, as SGLang's OpenAI layer reads them ({} when absent)."""
    path = directory / "generation_config.json"
    if not path.is_file():
        return {}
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise OpenAIError(503, f"the worker's generation_config.json is not JSON: {exc}") from exc
    return {k: raw[k] for k in SAMPLING_DEFAULT_KEYS
            if isinstance(raw.get(k), int | float) and not isinstance(raw.get(k), bool)}


def _chat_template_source(directory: Path, config: dict[str, Any]) -> str | None:
    jinja_file = directory / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text()
    tmpl = config.get("chat_template")
    if isinstance(tmpl, list):  # [{"name": "default", "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in tmpl if isinstance(t, dict)}
        tmpl = named.get("default") or next(iter(named.values()), None)
    return tmpl if isinstance(tmpl, str) else None


def load_from_directory(directory: Path) -> ModelText:
    tok_file = directory / "tokenizer.json" if directory.is_dir() else directory
    if not tok_file.is_file():
        raise OpenAIError(503, f"the worker's tokenizer_path {directory} has no tokenizer.json")
    base = tok_file.parent
    config: dict[str, Any] = {}
    cfg_file = base / "tokenizer_config.json"
    if cfg_file.is_file():
        config = json.loads(cfg_file.read_text())
    source = _chat_template_source(base, config)
    template = ChatTemplate(source, _token_str(config.get("bos_token")), _token_str(config.get("eos_token")))
    tok = HFTokenizer(tok_file)
    return ModelText(tok, template, str(tok_file), tok.max_token_chars, sampling_defaults(base), tok.added_tokens)


def _hub_snapshot(repo_id: str) -> Path | None:
    """A Hugging Face hub id that SGLang was started with: its files in the local cache, if there."""
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        return None
    try:
        return Path(snapshot_download(repo_id, local_files_only=True,
                                      allow_patterns=["tokenizer*", "chat_template*", "special_tokens_map.json",
                                                      "generation_config.json"]))
    except Exception:  # not cached, or not a hub id: the caller reports what it looked for
        return None


def load_for_worker(info: dict[str, Any]) -> ModelText:
    """The tokenizer for the model that `/model_info` describes."""
    path = info.get("tokenizer_path") or info.get("model_path")
    if path == "byte":  # the embedded engine's byte tokenizer (presets without a checkpoint)
        # One token per byte, and a special token (one ID) decodes to at most its own spelling.
        return ModelText(ByteTokenizer(), ChatTemplate(None), f"netra.engine byte tokenizer (preset {info.get('preset')})",
                         max(len(s) for s in BYTE_SPECIALS))
    if isinstance(path, str) and path and Path(path).is_absolute() and Path(path).exists():
        return load_from_directory(Path(path))
    if isinstance(path, str) and path and not path.startswith("preset:"):
        snapshot = _hub_snapshot(path)
        if snapshot is not None:
            return load_from_directory(snapshot)
    raise OpenAIError(503, f"cannot find the worker's tokenizer: /model_info gives tokenizer_path="
                           f"{info.get('tokenizer_path')!r}, model_path={info.get('model_path')!r}; expected an "
                           "absolute local path, a Hugging Face id in the local cache, or 'byte'")
