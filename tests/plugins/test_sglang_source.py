"""Every hook target exists in the pinned SGLang 0.5.23 source with the names the hooks read.

Read from the installed wheel's files (`importlib.metadata`) and parsed with `ast`: nothing is
imported (the targets need CUDA, Triton and transformers), so a renamed parameter, a moved function
or a changed greedy branch in a new pin fails here, on the CPU, before any worker runs it.
"""

from __future__ import annotations

import ast
from functools import cache
from importlib.metadata import distribution
from typing import Any

import pytest

from netra.deploy.sglang import SGLANG_VERSION
from netra.plugins import sglang as plugin
from netra.plugins import sglang_moe, sglang_sampler

FUSED_MOE = "sglang/srt/layers/moe/moe_runner/triton_utils/fused_moe.py"
TRITON_RUNNER = "sglang/srt/layers/moe/moe_runner/triton.py"
RUNNER_BASE = "sglang/srt/layers/moe/moe_runner/base.py"
TOPK = "sglang/srt/layers/moe/topk.py"
SAMPLER = "sglang/srt/layers/sampler.py"
BATCH_INFO = "sglang/srt/sampling/sampling_batch_info.py"
LOGITS = "sglang/srt/layers/logits_processor.py"
ENVIRON = "sglang/srt/environ.py"
HOOK_REGISTRY = "sglang/srt/plugins/hook_registry.py"
PLUGINS = "sglang/srt/plugins/__init__.py"


@cache
def tree(rel: str) -> ast.Module:
    dist = distribution("sglang")
    assert dist.version == SGLANG_VERSION
    return ast.parse((dist.locate_file("") / rel).read_text())


def top(rel: str, name: str) -> Any:
    found = [n for n in tree(rel).body if getattr(n, "name", None) == name]
    assert len(found) == 1, f"{name} defined {len(found)} times at the top of {rel}"
    return found[0]


def member(cls: ast.ClassDef, name: str) -> Any:
    found = [n for n in cls.body if getattr(n, "name", None) == name]
    assert len(found) == 1, f"{cls.name}.{name} not found once"
    return found[0]


def fields(cls: ast.ClassDef) -> set[str]:
    """Annotated class attributes (dataclass / NamedTuple fields) and properties."""
    out = {n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    out |= {n.name for n in cls.body if isinstance(n, ast.FunctionDef)
            and any(isinstance(d, ast.Name) and d.id == "property" for d in n.decorator_list)}
    return out


def params(fn: ast.FunctionDef) -> list[tuple[str, Any]]:
    """(name, default) in call order; `plugin.REQUIRED` where there is no default."""
    a = fn.args
    positional = a.posonlyargs + a.args
    defaults = [plugin.REQUIRED] * (len(positional) - len(a.defaults)) + [ast.literal_eval(d) for d in a.defaults]
    kwonly = [ast.literal_eval(d) if d is not None else plugin.REQUIRED for d in a.kw_defaults]
    assert a.vararg is None and a.kwarg is None
    return [(p.arg, d) for p, d in zip(positional, defaults, strict=True)] + \
           [(p.arg, d) for p, d in zip(a.kwonlyargs, kwonly, strict=True)]


def calls(node: ast.AST) -> list[ast.Call]:
    return [n for n in ast.walk(node) if isinstance(n, ast.Call)]


def dotted(node: ast.AST) -> str:
    return ast.unparse(node)


def test_targets_are_the_registered_domains() -> None:
    assert plugin.DOMAINS["moe"].target == \
        f"{FUSED_MOE.removesuffix('.py').replace('/', '.')}.fused_experts"
    assert plugin.DOMAINS["argmax"].target == f"{SAMPLER.removesuffix('.py').replace('/', '.')}.Sampler.forward"


# ---- moe: fused_experts ---------------------------------------------------------------------------


def test_fused_experts_signature_is_the_one_the_hook_binds() -> None:
    fn = top(FUSED_MOE, "fused_experts")
    assert params(fn) == list(sglang_moe.PARAMS)
    # It unpacks the top-k output and reads the config the guard reads (inplace decides the return).
    src = ast.unparse(fn)
    assert "topk_weights, topk_ids, _ = topk_output" in src
    assert "if moe_runner_config.inplace:" in src and "return hidden_states" in src


def test_triton_runner_calls_fused_experts_lazily_with_known_keywords() -> None:
    fn = top(TRITON_RUNNER, "fused_experts_none_to_triton")
    imports = [n for n in ast.walk(fn) if isinstance(n, ast.ImportFrom)
               and n.module == plugin.DOMAINS["moe"].target.rsplit(".", 1)[0]]
    assert [a.name for n in imports for a in n.names] == ["fused_experts"]  # imported at each call: patched
    (call,) = [c for c in calls(fn) if dotted(c.func) == "fused_experts"]
    names = {name for name, _ in sglang_moe.PARAMS}
    assert not call.args and {k.arg for k in call.keywords} <= names
    decorators = [ast.unparse(d) for d in fn.decorator_list]
    assert decorators == ["register_fused_func('none', 'triton')"]  # standard dispatcher + Triton runner


def test_moe_config_and_topk_output_have_the_fields_the_guard_reads() -> None:
    assert set(sglang_moe.CONFIG_FIELDS) <= fields(top(RUNNER_BASE, "MoeRunnerConfig"))
    assert set(sglang_moe.TOPK_FIELDS) <= fields(top(TOPK, "StandardTopKOutput"))


def test_moe_runner_backend_choice_renders_the_hooked_path() -> None:
    (flag, dest, value) = plugin.DOMAINS["moe"].sglang_options[0]
    assert (flag, dest, value) == ("--moe-runner-backend", "moe_runner_backend", "triton")
    # Fp8MoEMethod builds MoeRunner(MoeRunnerBackend.TRITON) for it, whose fused func is the one above.
    src = ast.unparse(tree("sglang/srt/layers/quantization/fp8.py"))
    assert "moe_runner_backend.is_triton()" in src


# ---- argmax: Sampler.forward ------------------------------------------------------------------------


def test_sampler_forward_signature_and_greedy_branch() -> None:
    cls = top(SAMPLER, "Sampler")
    fn = member(cls, "forward")
    assert params(fn) == list(sglang_sampler.PARAMS)
    src = ast.unparse(fn)
    # The steps the hooked path repeats, in this order, on the all-greedy branch.
    steps = ["logits = logits_output.next_token_logits",
             "maybe_detect_nan(logits, 'sampler: next_token_logits')",
             "logits = self._preprocess_logits(logits, sampling_info)",
             "if sampling_info.is_all_greedy:",
             "batch_next_token_ids = torch.argmax(logits, -1)",
             "self._sync_token_ids_across_tp(batch_next_token_ids, sampling_info)",
             "return batch_next_token_ids"]
    at = [src.find(s) for s in steps]
    assert -1 not in at and at == sorted(at), dict(zip(steps, at, strict=True))
    # Everything between entry and the greedy argmax that the hook does not repeat is gated by a flag
    # the guard checks: the ROCm/aiter paths, tracing, logprobs, watermark logits and sampling masks.
    for gate in ("_is_hip", "_use_aiter", "return_logprob", "logprob_logits is not None",
                 "sampling_mask_batch_indices"):
        assert gate in src
    for name in sglang_sampler.SAMPLER_METHODS:
        member(cls, name)


def test_sampler_module_globals_and_fields_the_guard_reads() -> None:
    names = set()
    for node in tree(SAMPLER).body:
        if isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.ImportFrom):
            names |= {a.asname or a.name for a in node.names}
    assert set(sglang_sampler.MODULE_GLOBALS) <= names
    assert set(sglang_sampler.SAMPLING_INFO_FIELDS) <= fields(top(BATCH_INFO, "SamplingBatchInfo"))
    assert set(sglang_sampler.LOGITS_OUTPUT_FIELDS) <= fields(top(LOGITS, "LogitsProcessorOutput"))
    env_cls = next(n for n in tree(ENVIRON).body if isinstance(n, ast.ClassDef)
                   and any(getattr(t, "id", None) == "SGLANG_PLUGINS" for s in n.body if isinstance(s, ast.Assign)
                           for t in s.targets))
    env_names = {t.id for s in env_cls.body if isinstance(s, ast.Assign) for t in s.targets if isinstance(t, ast.Name)}
    assert set(sglang_sampler.ENV_FLAGS) <= env_names


# ---- the plugin framework ------------------------------------------------------------------------------


def test_plugin_framework_is_what_the_plugin_relies_on() -> None:
    src = ast.unparse(tree(PLUGINS))
    assert f"GENERAL_PLUGINS_GROUP = '{plugin.ENTRY_POINT_GROUP}'" in src
    assert "if allowed_set is not None and ep.name not in allowed_set:" in src  # SGLANG_PLUGINS whitelist
    assert "HookRegistry.apply_hooks()" in ast.unparse(top(PLUGINS, "load_plugins"))
    # `installed()` recognises the AROUND wrapper by the `hook` it closes over.
    wrap = ast.unparse(top(HOOK_REGISTRY, "_wrap_fn"))
    assert "return hook(original_fn, *args, **kwargs)" in wrap
    assert "wrapper.__wrapped__ = original_fn" in wrap


@pytest.mark.parametrize("domain", list(plugin.DOMAINS))
def test_domain_hook_modules_load(domain: str) -> None:
    assert callable(plugin.DOMAINS[domain].hook())
