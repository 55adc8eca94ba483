"""The SGLang plugin's hooks on the CPU, with fakes: every non-matching call reaches SGLang's original
(and is counted with its reason); a matching call runs the tactic's launcher and returns what SGLang's
original would return (in place or a fresh tensor)."""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import pytest
import torch

from netra.plugins import sglang as plugin
from netra.plugins import sglang_moe, sglang_sampler
from tests.plugins.conftest import INTER, TMAX, E, H, K

FP8 = torch.float8_e4m3fn


class Config(types.SimpleNamespace):
    """A MoeRunnerConfig with SGLang's defaults for the fields the guard reads."""

    def __init__(self, **kw: Any) -> None:
        base = dict(num_experts=E, num_local_experts=E, activation="silu", is_gated=True,
                    apply_router_weight_on_input=False, inplace=True, no_combine=False, routed_scaling_factor=None,
                    gemm1_alpha=None, gemm1_clamp_limit=None, swiglu_limit=None)
        base.update(kw)
        super().__init__(**base)


class TopK(types.SimpleNamespace):
    pass


def moe_call(tokens: int = 4, experts: int = E, wdtype: torch.dtype = FP8, **overrides: Any) -> dict[str, Any]:
    """fused_experts' keyword arguments for a call inside the fixture contract (seeded values)."""
    g = torch.Generator().manual_seed(tokens)
    x = torch.randn((tokens, H), generator=g).to(torch.bfloat16)
    w1 = torch.randn((experts, 2 * INTER, H), generator=g).to(wdtype)
    w2 = torch.randn((experts, H, INTER), generator=g).to(wdtype)
    s1 = torch.rand((experts, 2 * INTER // 128, H // 128), generator=g)
    s2 = torch.rand((experts, H // 128, INTER // 128), generator=g)
    ids = torch.randint(0, experts, (tokens, K), generator=g, dtype=torch.int32)
    tw = torch.rand((tokens, K), generator=g)
    call = dict(hidden_states=x, w1=w1, w2=w2, topk_output=TopK(topk_weights=tw, topk_ids=ids, router_logits=None),
                moe_runner_config=Config(num_experts=experts, num_local_experts=experts), use_fp8_w8a8=wdtype == FP8,
                w1_scale=s1, w2_scale=s2, block_shape=[128, 128])
    call.update(overrides)
    return call


class Original:
    """Stands in for SGLang's function: records its calls and returns a sentinel tensor."""

    def __init__(self) -> None:
        self.calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
        self.sentinel = torch.full((1,), 7.0)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls.append((args, kwargs))
        return self.sentinel


def _misses(rec: Any, domain: str) -> dict[str, int]:
    return dict(rec.counts[domain]["miss_reasons"])


# ---- moe ------------------------------------------------------------------------------------------


def test_moe_in_contract_runs_the_tactic_in_place(cpu_as_sm90: dict[str, Any]) -> None:
    call = moe_call(tokens=5)
    x0 = call["hidden_states"].clone()
    orig = Original()
    out = sglang_moe.hook(orig, **call)
    assert orig.calls == []
    # SGLang's inplace path writes into hidden_states and returns it.
    assert out is call["hidden_states"]
    assert torch.equal(out, x0 * 2 + 1)
    launcher = cpu_as_sm90["moe"]
    # prepare ran every covered token count once, eagerly, then the call itself ran.
    assert [c["x"].shape[0] for c in launcher.calls] == [*range(1, TMAX + 1), 5]
    last = launcher.calls[-1]
    assert last["contract"] == "moe_routed_cpu_fixture"
    assert last["w13"] is call["w1"] and last["w2_scale"] is call["w2_scale"]
    assert last["topk_ids"] is call["topk_output"].topk_ids and last["topk_w"] is call["topk_output"].topk_weights
    rec = cpu_as_sm90["recorder"]
    assert rec.counts["moe"]["hits"] == 1 and rec.counts["moe"]["misses"] == 0
    assert "moe_routed_cpu_fixture" in rec.prepared["moe"]


def test_moe_outplace_returns_a_fresh_tensor_not_the_persistent_buffer(cpu_as_sm90: dict[str, Any]) -> None:
    call = moe_call(tokens=3, moe_runner_config=Config(inplace=False))
    x0 = call["hidden_states"].clone()
    out = sglang_moe.hook(Original(), *[call.pop(k) for k in ("hidden_states", "w1", "w2")], **call)
    assert torch.equal(out, x0 * 2 + 1)
    buf = cpu_as_sm90["moe"].buf
    assert out.data_ptr() != buf.data_ptr() and out.data_ptr() != x0.data_ptr()
    buf.zero_()  # the next layer's call overwrites the buffer: the returned output must not change
    assert torch.equal(out, x0 * 2 + 1)


def _noncontiguous() -> dict[str, Any]:
    x = torch.randn((4, 2 * H)).to(torch.bfloat16)[:, :H]
    return {"hidden_states": x}


# (case, overrides of moe_call or a builder, the reason's expected words)
MOE_MISSES: list[tuple[str, Callable[[], dict[str, Any]], str]] = [
    ("other expert count", lambda: moe_call(experts=2 * E), "dim experts=16"),
    ("bf16 weights", lambda: moe_call(wdtype=torch.bfloat16), "use_fp8_w8a8 is False"),
    ("fp8 flag but bf16 weights", lambda: {**moe_call(wdtype=torch.bfloat16), "use_fp8_w8a8": True},
     "dtype w13=bfloat16"),
    ("non-contiguous input", lambda: {**moe_call(), **_noncontiguous()}, "layout x=strided"),
    ("over 128 tokens", lambda: moe_call(tokens=TMAX + 1), f"dim tokens={TMAX + 1}"),
    ("routed scaling", lambda: moe_call(moe_runner_config=Config(routed_scaling_factor=2.5)), "routed_scaling_factor"),
    ("expert parallel", lambda: moe_call(moe_runner_config=Config(num_local_experts=E // 2)), "expert parallelism"),
    ("no combine", lambda: moe_call(moe_runner_config=Config(no_combine=True, inplace=False)), "no_combine"),
    ("router weight on input", lambda: moe_call(moe_runner_config=Config(apply_router_weight_on_input=True)),
     "router weight applied on the input"),
    ("gelu", lambda: moe_call(moe_runner_config=Config(activation="gelu")), "not gated silu"),
    ("swiglu clamp", lambda: moe_call(moe_runner_config=Config(swiglu_limit=10.0)), "swiglu_limit"),
    ("bias", lambda: moe_call(b1=torch.zeros(E, 2 * INTER)), "expert bias"),
    ("static activation scale", lambda: moe_call(a1_scale=torch.ones(1)), "static activation scale"),
    ("pre-quantized activation", lambda: moe_call(a1_q=torch.zeros(1)), "pre-quantized"),
    ("per-channel", lambda: moe_call(per_channel_quant=True), "per_channel_quant"),
    ("other block", lambda: moe_call(block_shape=[64, 64]), "block_shape"),
    ("wrong scale shape", lambda: moe_call(w1_scale=torch.rand(E, 2 * INTER // 64, H // 64)), "w13_scale"),
    ("fp64 scales", lambda: moe_call(w2_scale=torch.rand(E, H // 128, INTER // 128, dtype=torch.float64)), "w2_scale"),
    ("topk mismatch", lambda: moe_call(topk_output=TopK(topk_weights=torch.rand(4, K), topk_ids=torch.zeros(
        (3, K), dtype=torch.int32))), "do not match"),
    ("int64 ids", lambda: moe_call(topk_output=TopK(topk_weights=torch.rand(4, K), topk_ids=torch.zeros(
        (4, K), dtype=torch.int64))), "dtype topk_ids=int64"),
    ("unknown argument", lambda: moe_call(frobnicate=1), "unknown argument 'frobnicate'"),
]


@pytest.mark.parametrize(("case", "build", "words"), MOE_MISSES, ids=[m[0] for m in MOE_MISSES])
def test_moe_guard_returns_the_original(cpu_as_sm90: dict[str, Any], case: str,
                                        build: Callable[[], dict[str, Any]], words: str) -> None:
    call = build()
    x0 = call["hidden_states"].clone()
    orig = Original()
    out = sglang_moe.hook(orig, **call)
    assert out is orig.sentinel
    assert len(orig.calls) == 1 and orig.calls[0][1] is not call and orig.calls[0][1].keys() == call.keys()
    assert all(orig.calls[0][1][k] is v for k, v in call.items())  # the original got the call unchanged
    assert torch.equal(call["hidden_states"], x0)  # nothing written
    rec = cpu_as_sm90["recorder"]
    assert rec.counts["moe"]["hits"] == 0 and rec.counts["moe"]["misses"] == 1
    (reason,) = _misses(rec, "moe")
    assert words in reason, reason


def test_moe_miss_reasons_are_counted_once_each(cpu_as_sm90: dict[str, Any]) -> None:
    orig = Original()
    for _ in range(3):
        sglang_moe.hook(orig, **moe_call(tokens=TMAX + 1))
    sglang_moe.hook(orig, **moe_call(wdtype=torch.bfloat16))
    sglang_moe.hook(orig, **moe_call(tokens=2))
    rec = cpu_as_sm90["recorder"]
    assert sorted(_misses(rec, "moe").values()) == [1, 3]
    assert (rec.counts["moe"]["hits"], rec.counts["moe"]["misses"], len(orig.calls)) == (1, 4, 4)


def test_moe_disabled_tactics_reach_the_original(cpu_as_sm90: dict[str, Any]) -> None:
    cpu_as_sm90["dispatcher"].disabled = True
    orig = Original()
    assert sglang_moe.hook(orig, **moe_call()) is orig.sentinel
    assert list(_misses(cpu_as_sm90["recorder"], "moe")) == ["NETRA_DISABLE_TACTICS is set: every op uses its fallback"]


def test_moe_first_call_inside_a_capture_is_left_to_the_original(cpu_as_sm90: dict[str, Any],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sglang_moe, "capturing", lambda: True)
    orig = Original()
    assert sglang_moe.hook(orig, **moe_call()) is orig.sentinel
    assert cpu_as_sm90["moe"].calls == []  # nothing loaded or launched inside the capture
    assert "inside a CUDA graph capture" in next(iter(_misses(cpu_as_sm90["recorder"], "moe")))


# ---- argmax (Sampler.forward) -----------------------------------------------------------------------

VOCAB = 248320
SAMPLER_SRC = '''
def forward(self, logits_output, sampling_info, return_logprob, top_logprobs_nums, token_ids_logprobs,
            positions, *, logprob_logits=None):
    CALLS.append("original")
    return SENTINEL
'''


class Flag:
    def __init__(self, on: bool = False) -> None:
        self.on = on

    def get(self) -> bool:
        return self.on


def sampler_original(**globs: Any) -> Any:
    """A function whose module globals are the ones the hook reads from SGLang's sampler module."""
    g: dict[str, Any] = {"_is_hip": False, "_use_aiter": False, "CALLS": [], "SENTINEL": torch.zeros(1),
                         "envs": types.SimpleNamespace(SGLANG_TRACE_SAMPLER_E2E=Flag()),
                         "maybe_detect_nan": lambda t, msg: g["CALLS"].append("detect_nan")}
    g.update(globs)
    exec(SAMPLER_SRC, g)
    return g["forward"]


class FakeSampler:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def _preprocess_logits(self, logits: Any, info: Any) -> Any:
        self.calls.append("preprocess")
        torch.nan_to_num_(logits, nan=-1e30)
        return logits

    def _sync_token_ids_across_tp(self, ids: Any, info: Any) -> None:
        self.calls.append(f"sync {ids.dtype}")


def sampler_args(rows: int = 4, dtype: torch.dtype = torch.float32, **info: Any) -> tuple[Any, ...]:
    g = torch.Generator().manual_seed(rows)
    logits = torch.randn((rows, VOCAB), generator=g).to(dtype)
    base = dict(is_all_greedy=True, sampling_mask_batch_indices=None, has_custom_logit_processor=False)
    base.update(info)
    return (FakeSampler(), types.SimpleNamespace(next_token_logits=logits), types.SimpleNamespace(**base), False,
            [], [], torch.arange(rows))


def test_sampler_greedy_batch_runs_the_argmax_tactic(cpu_as_sm90: dict[str, Any]) -> None:
    orig = sampler_original()
    args = sampler_args(rows=4)
    logits = args[1].next_token_logits
    logits[2, 5] = float("nan")  # preprocessing (SGLang's, in place) runs before argmax reads the logits
    want = torch.argmax(torch.nan_to_num(logits.clone(), nan=-1e30), dim=-1)
    ids = sglang_sampler.hook(orig, *args)
    assert orig.__globals__["CALLS"] == ["detect_nan"]  # original not called; its NaN probe was
    assert args[0].calls == ["preprocess", "sync torch.int64"]
    assert ids.dtype == torch.int64 and torch.equal(ids, want)
    assert cpu_as_sm90["argmax"] == [("argmax_f32_v248320", (4, VOCAB), torch.float32)]
    rec = cpu_as_sm90["recorder"]
    assert (rec.counts["argmax"]["hits"], rec.counts["argmax"]["misses"]) == (1, 0)


SAMPLER_MISSES: list[tuple[str, dict[str, Any], dict[str, Any], str]] = [
    ("non-greedy batch", {"info": {"is_all_greedy": False}}, {}, "not every request is greedy"),
    ("logprobs", {"return_logprob": True}, {}, "logprobs requested"),
    ("watermark logits", {"kw": {"logprob_logits": torch.zeros(1)}}, {}, "pre-watermark"),
    ("sampling mask", {"info": {"sampling_mask_batch_indices": torch.zeros(1)}}, {}, "sampling mask"),
    ("custom logit processor", {"info": {"has_custom_logit_processor": True}}, {}, "custom logit processor"),
    ("rocm", {}, {"_is_hip": True}, "ROCm"),
    ("tracing", {}, {"envs": types.SimpleNamespace(SGLANG_TRACE_SAMPLER_E2E=Flag(True))}, "SGLANG_TRACE"),
    ("other vocab", {"vocab": 151936}, {}, "dim vocab=151936"),
    ("over 256 rows", {"rows": 257}, {}, "dim rows=257"),
    ("fp16 logits", {"dtype": torch.float16}, {}, "dtype x=float16"),
    ("strided logits", {"strided": True}, {}, "layout x=strided"),
]


@pytest.mark.parametrize(("case", "call", "globs", "words"), SAMPLER_MISSES, ids=[m[0] for m in SAMPLER_MISSES])
def test_sampler_guard_returns_the_original(cpu_as_sm90: dict[str, Any], case: str, call: dict[str, Any],
                                           globs: dict[str, Any], words: str) -> None:
    orig = sampler_original(**globs)
    args = list(sampler_args(rows=call.get("rows", 2), dtype=call.get("dtype", torch.float32), **call.get("info", {})))
    if "vocab" in call:
        args[1].next_token_logits = torch.zeros((2, call["vocab"]))
    if call.get("strided"):
        args[1].next_token_logits = torch.zeros((2, VOCAB + 64))[:, :VOCAB]
    if "return_logprob" in call:
        args[3] = call["return_logprob"]
    out = sglang_sampler.hook(orig, *args, **call.get("kw", {}))
    assert out is orig.__globals__["SENTINEL"]
    assert orig.__globals__["CALLS"] == ["original"]
    assert args[0].calls == []  # nothing of the hooked path ran
    assert cpu_as_sm90["argmax"] == []
    rec = cpu_as_sm90["recorder"]
    assert (rec.counts["argmax"]["hits"], rec.counts["argmax"]["misses"]) == (0, 1)
    (reason,) = _misses(rec, "argmax")
    assert words in reason, reason


# ---- shared plumbing ---------------------------------------------------------------------------------


def test_bind_call_maps_positional_and_keyword_arguments() -> None:
    call = plugin.bind_call(sglang_moe.PARAMS, (1, 2, 3), {"topk_output": 4, "moe_runner_config": 5, "b2": 6})
    assert isinstance(call, dict)
    assert (call["hidden_states"], call["w1"], call["w2"], call["topk_output"], call["b2"]) == (1, 2, 3, 4, 6)
    assert call["use_fp8_w8a8"] is False and call["block_shape"] is None
    assert plugin.bind_call(sglang_moe.PARAMS, (1, 2), {}) == "missing argument(s) ['w2', 'topk_output', 'moe_runner_config']"
    assert "positional" in str(plugin.bind_call(sglang_moe.PARAMS, tuple(range(30)), {}))


def test_installed_sees_an_around_wrapper_chain() -> None:
    import functools
    import sys

    mod = types.ModuleType("fake_sglang_target")
    sys.modules[mod.__name__] = mod
    try:
        class Owner:
            def method(self) -> int:
                return 1

        def fn() -> int:
            return 2

        mod.Owner, mod.fn = Owner, fn  # type: ignore[attr-defined]

        def hook(original: Any, *a: Any) -> Any:
            return original(*a)

        def around(original: Any) -> Any:  # SGLang's _wrap_fn(original, hook, AROUND)
            @functools.wraps(original)
            def wrapper(*args: Any, **kwargs: Any) -> Any:
                return hook(original, *args, **kwargs)

            wrapper.__wrapped__ = original  # type: ignore[attr-defined]
            return wrapper

        assert not plugin.installed("fake_sglang_target.fn", hook)
        assert not plugin.installed("fake_sglang_target.Owner.method", hook)
        mod.fn = around(around(fn))  # type: ignore[attr-defined]
        Owner.method = around(Owner.method)  # type: ignore[method-assign]
        assert plugin.installed("fake_sglang_target.fn", hook)
        assert plugin.installed("fake_sglang_target.Owner.method", hook)
        assert not plugin.installed("fake_sglang_target.fn", fn)
        assert not plugin.installed("not_imported_module.fn", hook)
    finally:
        del sys.modules[mod.__name__]
