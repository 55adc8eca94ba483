"""The one-process MoE bench's orchestration on CPU (netra/bench/kernels_moe.py ``run_bench``): CUDA
graphs, events and streams faked, "cuda" tensors placed on the CPU, the kernels and the peer replaced
by stand-ins. What this checks: a provider that fails to build or to set up is logged and skipped
while every other provider's rows land; graph rows are interleaved and eager rows are separate;
bench.json is complete; the records and the summary come out of it. No number here means anything."""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.overrides import TorchFunctionMode

from netra.bench import kernels_moe as km
from netra.bench.peers import sglang_moe
from netra.records import validate


class _CpuForCuda(TorchFunctionMode):
    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = dict(kwargs or {})
        if str(kwargs.get("device", "")).startswith("cuda"):
            kwargs["device"] = "cpu"
        return func(*args, **kwargs)


class _Event:
    def __init__(self, enable_timing: bool = False) -> None:
        self.t = 0.0

    def record(self) -> None:
        self.t = time.perf_counter()

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, other: _Event) -> float:
        return max(other.t - self.t, 1e-6) * 1e3


class _Stream:
    cuda_stream = 0

    def wait_stream(self, other: Any) -> None:
        pass


class _Graph:
    replays = 0

    def replay(self) -> None:
        _Graph.replays += 1


class FakeMoe:
    """Stands in for MoeSm90: the methods the bench calls, no kernels."""

    def __init__(self) -> None:
        self.out = torch.zeros(128, km.HIDDEN, dtype=torch.bfloat16)

    def align(self, x: Any, ids: Any, wts: Any, sw: Any = None) -> None:
        pass

    def route(self, x: Any, wr: Any, wsg: Any) -> None:
        pass

    def experts(self, x: Any, w13: Any, s13: Any, w2: Any, s2: Any, shared: bool) -> Any:
        self.out[: x.shape[0]] = 0
        return self.out[: x.shape[0]]

    def act_quant(self, gu: Any) -> Any:
        return gu, gu


class FakeRouted:
    def __init__(self, peer: Any, m: int, *a: Any) -> None:
        self.out = torch.zeros(m, km.HIDDEN, dtype=torch.bfloat16)
        self.align_in_timed = m * 8 <= 64
        self.cache2 = None

    def __call__(self, x: Any) -> Any:
        self.out.zero_()
        return self.out

    def act_quant_pair(self, gu: Any) -> Any:
        return gu


class FailingMlp:
    def __init__(self, *a: Any) -> None:
        raise RuntimeError("simulated Triton compile failure")


def _zeros_weights(seed: int = 0) -> dict[str, Any]:
    e = km.NUM_EXPERTS + 1
    return {"w13": torch.zeros(e, 2 * km.INTER, km.HIDDEN, dtype=torch.float8_e4m3fn),
            "s13": torch.ones(e, 8, 16), "w2": torch.zeros(e, km.HIDDEN, km.INTER, dtype=torch.float8_e4m3fn),
            "s2": torch.ones(e, 16, 4), "wr": torch.randn(km.NUM_EXPERTS, km.HIDDEN).to(torch.bfloat16),
            "wsg": torch.randn(km.HIDDEN).to(torch.bfloat16)}


@pytest.fixture
def fake_gpu(monkeypatch: pytest.MonkeyPatch) -> Any:
    cuda = torch.cuda
    monkeypatch.setattr(cuda, "Event", _Event)
    monkeypatch.setattr(cuda, "Stream", lambda *a, **k: _Stream())
    monkeypatch.setattr(cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(cuda, "current_stream", lambda *a: _Stream())
    monkeypatch.setattr(cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(cuda, "CUDAGraph", _Graph)
    monkeypatch.setattr(cuda, "graph", lambda g, **k: contextlib.nullcontext())
    monkeypatch.setattr(cuda, "get_device_name", lambda *a: "fake H200")
    real_gen = torch.Generator
    monkeypatch.setattr(torch, "Generator", lambda device="cpu": real_gen("cpu"))
    monkeypatch.setattr(km, "make_weights", _zeros_weights)
    monkeypatch.setattr(km, "copy_bandwidth", lambda: 4.0e12)
    monkeypatch.setattr(km, "BATCHES", (1, 8))
    monkeypatch.setattr(km, "AQ_BATCHES", (1,))
    monkeypatch.setattr(km, "TORCH_REF_BATCHES", (1,))
    built: list[str] = []

    def make_netra(name: str, log: Any) -> Any:
        if name == "netra-v3":
            log(f"provider {name}: skipped, simulated load error")
            return None
        built.append(name)
        return FakeMoe()

    monkeypatch.setattr(km, "make_netra", make_netra)
    monkeypatch.setattr(sglang_moe, "load", lambda root: {"gemm": object()})
    monkeypatch.setattr(sglang_moe, "SglangRouted", FakeRouted)
    monkeypatch.setattr(sglang_moe, "SglangSharedMlp", FailingMlp)
    with _CpuForCuda():
        yield built


def test_run_bench_orchestration(fake_gpu: list[str], tmp_path: Path) -> None:
    args = argparse.Namespace(out=tmp_path, providers="all", rot=2, samples=4, eager_reps=2, git_sha="abc",
                              sglang_root=tmp_path, provider_budget_s=100.0, time_budget_s=100.0)
    doc = km.run_bench(args)
    assert fake_gpu == ["netra-v1", "netra-v3-unfused"]
    assert doc["providers_skipped"] == {"netra-v3": "construction failed (bench_log.txt)"}
    assert any("sglang-shared-mlp" in ev and "FAILED" in ev for ev in doc["budget_events"])
    saved = json.loads((tmp_path / "bench.json").read_text())
    assert saved["rows"] == json.loads(json.dumps(doc["rows"]))
    rows = doc["rows"]

    def have(section: str, provider: str, mode: str, m: int) -> bool:
        return any(r["section"] == section and r["provider"] == provider and r["mode"] == mode and r["tokens"] == m
                   for r in rows)

    for m in (1, 8):
        for p in ("netra-v1", "netra-v1+shared", "netra-v3-unfused", "netra-v3-unfused+shared", "sglang"):
            assert have("layer", p, "graph", m) and have("layer", p, "eager", m), (p, m)
            assert not have("layer", "sglang-shared-mlp", "graph", m)
        assert have("route", "netra-v1", "graph", m) and not have("route", "netra-v3-unfused", "graph", m)
    assert have("layer", "torch-ref", "eager", 1) and not have("layer", "torch-ref", "eager", 8)
    assert have("act_quant", "netra-v1", "graph", 1) and have("act_quant", "sglang_triton_pair", "graph", 1)
    graph_rows = [r for r in rows if r["mode"] == "graph"]
    assert all(r["samples"] == 4 for r in graph_rows)
    assert all(r["floor_us"] > 0 and r["median_us"] > 0 for r in graph_rows if r["section"] == "layer")
    assert [r["align_in_timed"] for r in rows if r["provider"] == "sglang" and r["mode"] == "graph"] == [True, True]
    # the checks ran for each built variant and failed cleanly on the stand-in (no kernels)
    assert set(doc["checks"]) == {"netra-v1", "netra-v3-unfused"}
    c1 = doc["checks"]["netra-v1"]
    assert all("error" in c1[k] for k in ("act_quant", "route", "align"))
    assert c1["layer"]["within_tolerance"] is False  # zeros against the reference
    assert {c["provider"] for c in doc["peer_checks"]} >= {"netra-v1", "netra-v1+shared", "sglang"}
    # records and summary from this bench.json
    paths = km.write_records_v3(tmp_path, tmp_path / "rec", "_t", "")
    for path in paths:
        if path.suffix == ".json":
            rec = json.loads(path.read_text())
            validate(rec)
            assert rec["git_sha"] == "abc"
    layer = json.loads((tmp_path / "rec" / "moe_layer_t.json").read_text())
    assert layer["judged_provider"] == "netra-v1" and layer["verdict"] == "rejected"  # checks errored
    km.print_summary(doc)


def test_run_bench_time_budget_skips_timing(fake_gpu: list[str], tmp_path: Path) -> None:
    args = argparse.Namespace(out=tmp_path, providers="netra-v1,sglang", rot=2, samples=2, eager_reps=1,
                              git_sha="", sglang_root=tmp_path, provider_budget_s=100.0, time_budget_s=0.0)
    doc = km.run_bench(args)
    assert doc["rows"] == []
    assert any("budget" in ev for ev in doc["budget_events"])
    assert (tmp_path / "bench.json").is_file()
