"""SGLang worker commands, checked by SGLang's own parser (the pinned 0.5.23 wheel, --no-deps).

All commands these tests parse go through one child process (the `parsed` fixture primes the cache),
so the module costs one `import torch` + SGLang parser import, not one per test.
"""

from __future__ import annotations

import typing
from pathlib import Path
from typing import Any

import pytest

from netra.deploy import sglang as sg
from netra.deploy.plan import LOOPBACK, make_plan
from netra.deploy.profile import (
    Profile,
    ProfileError,
    ReasoningParser,
    ToolCallParser,
    list_profiles,
    load_profile,
    profile_from_dict,
)

REPO = Path(__file__).resolve().parents[2]
FIXTURE_BY_TARGET = {"sm90": REPO / "numa/dual-socket-8x-h200", "gfx950": REPO / "numa/dual-socket-8x-mi350x"}
BUCKETS = [1, 2, 4, 8, 16, 32, 64, 80, 96, 112, 128]


def _raw(**engine: Any) -> dict[str, Any]:
    eng: dict[str, Any] = {"kind": "sglang", "model_path": "Qwen/Qwen3.6-35B-A3B-FP8"}
    eng.update(engine)
    return {"name": "t", "description": "test", "target": "sm90", "dp": 1, "engine": eng,
            "serve": {"model_name": "qwen"}}


def _sglang_profiles() -> list[Profile]:
    return [p for p in (load_profile(n) for n in list_profiles()) if p.engine.kind == "sglang"]


def _plan_argvs() -> list[tuple[str, ...]]:
    return [w.engine_argv for p in _sglang_profiles()
            for w in make_plan(p, FIXTURE_BY_TARGET[p.target]).workers]


EAGLE = profile_from_dict({**_raw(speculative={"algorithm": "EAGLE3", "draft_model_path": "d/eagle",
                                               "num_draft_tokens": 4, "num_steps": 3, "eagle_topk": 1}),
                           "checkpoint": {"revision": "0123abcd"}})


def _with_engine(**changes: Any) -> Any:
    """A profile-like object whose engine has `changes` (keys or values the profile schema refuses)."""
    from types import SimpleNamespace

    p = load_profile("dp8-h200-throughput128")
    engine = SimpleNamespace(**{**{f: getattr(p.engine, f) for f in p.engine.__dataclass_fields__}, **changes})
    return SimpleNamespace(name=p.name, target=p.target, engine=engine, serve=p.serve, checkpoint=p.checkpoint)


def _with_backend(backend: str) -> Any:
    """A profile-like object whose engine sets an attention backend (not in today's profile schema)."""
    return _with_engine(attention_backend=backend)


FA3, FA9 = _with_backend("fa3"), _with_backend("fa9")
# Every parser name the profile schema accepts, each rendered on its own; and names SGLang does not know,
# rendered past the schema (as a hand-written command or a later schema could), for SGLang's parser to refuse.
PARSER_NAMES = [profile_from_dict(_raw(**{key: name})) for key, tp in
                (("reasoning_parser", ReasoningParser), ("tool_call_parser", ToolCallParser))
                for name in typing.get_args(tp)]
BAD_REASONING, BAD_TOOLS = _with_engine(reasoning_parser="qwen9"), _with_engine(tool_call_parser="qwen3_xml")
NO_GRAPHS = profile_from_dict(_raw(kv_cache_dtype="auto", incremental_streaming_output=False,
                                   enable_metrics=False))


def _good() -> list[str]:
    return sg.render_argv(load_profile("dp8-h200-throughput128"), host=LOOPBACK, port=30000)


BAD = {
    "abbrev": [*_good(), "--context-len", "4096"],
    "unknown": [*_good(), "--frobnicate"],
    "choice": [*_good(), "--kv-cache-dtype", "fp9_e4m3"],
    "int": [*_good(), "--max-running-requests", "many"],
    "algo": [("DFLOSH" if t == "DFLASH" else t) for t in _good()],
    "prefix": ["python3", "-m", "sglang.bench_serving", "--model-path", "x"],
    "dropped": [t for t in _good() if t != "--disable-radix-cache"],
    # 0.5.23 has no --mamba-scheduler-strategy (its hybrid-GDN flag is --mamba-radix-cache-strategy).
    "mamba": [*_good(), "--mamba-scheduler-strategy", "extra_buffer"],
    # Both DFLASH spellings of the verify block, differing: SGLang's DFLASH handler refuses the pair.
    "blocks": [*_good(), "--speculative-dflash-block-size", "16"],
}
# What SGLang accepts around the rendered DFLASH command: the 0.5.23 hybrid-GDN spelling, the DFLASH block
# alias agreeing with --speculative-num-draft-tokens, and the alias alone (as Netra rendered it before).
MAMBA_RADIX = [*_good(), "--mamba-radix-cache-strategy", "extra_buffer"]
BOTH_BLOCKS = [*_good(), "--speculative-dflash-block-size", "12"]
ALIAS_ONLY = [("--speculative-dflash-block-size" if t == "--speculative-num-draft-tokens" else t) for t in _good()]
PINNED_DRAFTER = load_profile("dp8-h200-throughput128").replace("engine.speculative.draft_revision", "a1b2c3d4e5")


@pytest.fixture(scope="module")
def parsed() -> None:
    """One child parses every command of this module; later calls hit the per-process cache."""
    argvs = _plan_argvs() + list(BAD.values()) + [MAMBA_RADIX, BOTH_BLOCKS, ALIAS_ONLY]
    argvs.append(sg.render_argv(PINNED_DRAFTER, host=LOOPBACK, port=30000))
    for p in (EAGLE, NO_GRAPHS, FA3, FA9, BAD_REASONING, BAD_TOOLS, *PARSER_NAMES):
        argvs.append(sg.render_argv(p, host=LOOPBACK, port=30000))
    for p in _sglang_profiles():
        argvs.append(sg.render_argv(p, host="127.0.0.1", port=30000))
    sg.parse_many(argvs)


def test_every_sglang_profile_command_passes_sglang_parser(parsed: None) -> None:
    profiles = _sglang_profiles()
    assert {"dp8-throughput128", "dp8-h200-throughput128"} <= {p.name for p in profiles}
    for p in profiles:
        plan = make_plan(p, FIXTURE_BY_TARGET[p.target])
        assert len(plan.workers) == p.dp
        views = sg.check_argvs([w.engine_argv for w in plan.workers])
        for w, view in zip(plan.workers, views, strict=True):
            assert view.sglang_version == sg.SGLANG_VERSION
            # Every rendered option landed on the field Netra meant, with the value it rendered.
            assert sg.compare_fields(view, sg.expected_fields(p, host=LOOPBACK, port=w.engine_port)) == []
            # And what the plan's audit will expect at /server_info is what SGLang parsed.
            for key, want in w.engine_expect.items():
                assert view.fields[key] == want, (p.name, w.index, key)


@pytest.mark.parametrize("name", ["dp8-throughput128", "dp8-h200-throughput128"])
def test_throughput128_contract_reaches_sglang(parsed: None, name: str) -> None:
    view = sg.check_profile(load_profile(name), host="127.0.0.1", port=30000)
    # The article's batch-128 contract, as SGLang's own record holds it.
    assert view.max_running_requests == 128
    assert view.context_length == 65536
    assert view.chunked_prefill_size == 32768
    assert view.mem_fraction_static == 0.80
    assert view.cuda_graph_bs_decode == BUCKETS
    assert view.cuda_graph_max_bs_decode == 128
    assert view.kv_cache_dtype == "fp8_e4m3"
    assert view.mamba_ssm_dtype == "float32"
    assert view.disable_radix_cache is True
    assert view.stream_interval == 2
    assert view.incremental_streaming_output is True
    assert view.enable_metrics is True
    assert (view.tp_size, view.dp_size) == (1, 1)
    assert view.speculative_algorithm == "DFLASH"
    assert view.speculative_draft_model_path == "z-lab/Qwen3.6-35B-A3B-DFlash"
    assert view.speculative_num_draft_tokens == 12  # the field SGLang's DFLASH worker reads
    assert view.speculative_dflash_block_size is None  # its DFLASH-only alias, not rendered
    assert view.speculative_draft_window_size == 4096
    # SGLang's own DFLASH handler on this command: block 12 (no drafter config read), one step, top-1.
    assert view.speculative == {"speculative_num_draft_tokens": 12, "speculative_num_steps": 1,
                                "speculative_eagle_topk": 1}
    assert (view.host, view.port) == ("127.0.0.1", 30000)
    # Qwen3.6's formats: grammars deferred past </think>, the worker's /v1 tool calls in Qwen3-Coder XML.
    assert (view.reasoning_parser, view.tool_call_parser) == ("qwen3", "qwen3_coder")
    # SGLang's own graph resolution: full decode graphs at exactly the contract's buckets, covering
    # the whole scheduler range (1..max_running_requests).
    assert view.cuda_graph["decode"]["backend"] == "full"
    assert view.cuda_graph["decode"]["max_bs"] == 128
    assert view.decode_graph_sizes() == BUCKETS
    assert max(view.decode_graph_sizes()) >= view.max_running_requests
    with pytest.raises(AttributeError, match="no field"):
        _ = view.no_such_field


def test_plan_workers_differ_only_in_port_and_device(parsed: None) -> None:
    plan = make_plan(load_profile("dp8-throughput128"), FIXTURE_BY_TARGET["gfx950"])
    ports = [sg.check_argv(w.engine_argv).port for w in plan.workers]
    assert ports == [30000 + i for i in range(8)]
    assert [w.engine_env["HIP_VISIBLE_DEVICES"] for w in plan.workers] == [str(i) for i in range(8)]
    assert all("CUDA_VISIBLE_DEVICES" not in w.engine_env for w in plan.workers)


@pytest.mark.parametrize(("case", "named"), [
    ("abbrev", "--context-len"),  # argparse alone would accept this prefix of --context-length
    ("unknown", "--frobnicate"),
    ("choice", "--kv-cache-dtype"),
    ("int", "--max-running-requests"),
    ("algo", "DFLOSH"),
    ("prefix", "sglang.launch_server"),
])
def test_bad_command_is_refused_naming_the_option(parsed: None, case: str, named: str) -> None:
    with pytest.raises(sg.SGLangArgsError) as info:
        sg.check_argv(BAD[case])
    assert named in str(info.value)


def test_dflash_worker_argv_every_speculative_option_on_its_field(parsed: None) -> None:
    p = load_profile("dp8-h200-throughput128")
    w0 = make_plan(p, FIXTURE_BY_TARGET["sm90"]).workers[0]
    argv = list(w0.engine_argv)
    i = argv.index("--speculative-algorithm")
    assert argv[i:] == ["--speculative-algorithm", "DFLASH", "--speculative-draft-model-path",
                        "z-lab/Qwen3.6-35B-A3B-DFlash", "--speculative-num-draft-tokens", "12",
                        "--speculative-draft-window-size", "4096"]
    assert "--speculative-dflash-block-size" not in argv and not any("mamba-scheduler" in t for t in argv)
    view = sg.check_argv(argv)
    assert sg.check_view(p, view, host=LOOPBACK, port=w0.engine_port) == []
    spec_opts = [o for o in sg.options(p, host=LOOPBACK, port=w0.engine_port) if o.flag.startswith("--speculative")]
    assert len(spec_opts) == 4
    for opt in spec_opts:  # SGLang's parser writes each to the field Netra meant, with the rendered value
        assert view.dests[opt.flag] == opt.dest and view.fields[opt.dest] == opt.expected(), opt
    # The drafter revision, where the profile pins one, is SGLang's --speculative-draft-model-revision.
    pinned = sg.check_profile(PINNED_DRAFTER, host=LOOPBACK, port=30000)
    assert pinned.speculative_draft_model_revision == "a1b2c3d4e5"
    assert pinned.dests["--speculative-draft-model-revision"] == "speculative_draft_model_revision"


def test_sglang_dflash_block_spellings(parsed: None) -> None:
    # --speculative-dflash-block-size is SGLang's DFLASH alias of --speculative-num-draft-tokens: its DFLASH
    # handler refuses the two when they differ, accepts them agreeing, and copies the alias alone across.
    with pytest.raises(sg.SGLangArgsError, match="For DFLASH they must match") as info:
        sg.check_argv(BAD["blocks"])
    assert "speculative_num_draft_tokens=12" in str(info.value) and "speculative_dflash_block_size=16" in str(info.value)
    assert sg.check_argv(BOTH_BLOCKS).speculative["speculative_num_draft_tokens"] == 12
    alias = sg.check_argv(ALIAS_ONLY)
    assert (alias.speculative_num_draft_tokens, alias.speculative_dflash_block_size) == (None, 12)
    assert alias.speculative["speculative_num_draft_tokens"] == 12
    # Netra renders --speculative-num-draft-tokens; a command carrying the alias instead misses that field,
    # and check_view names the option and the field.
    problems = sg.check_view(load_profile("dp8-h200-throughput128"), alias, host=LOOPBACK, port=30000)
    assert problems == [
        "--speculative-num-draft-tokens: SGLang writes it to None, Netra rendered it for 'speculative_num_draft_tokens'",
        "speculative_num_draft_tokens: rendered 12 but SGLang parsed None"]


def test_hybrid_gdn_flag_is_the_0_5_23_spelling(parsed: None) -> None:
    # The issue's --mamba-scheduler-strategy is not a 0.5.23 option; --mamba-radix-cache-strategy is, and
    # with the radix cache off (as rendered) it has nothing to govern, so the profile does not render it.
    with pytest.raises(sg.SGLangArgsError, match=r"option --mamba-scheduler-strategy: not an exact SGLang 0\.5\.23"):
        sg.check_argv(BAD["mamba"])
    view = sg.check_argv(MAMBA_RADIX)
    assert view.dests["--mamba-radix-cache-strategy"] == "mamba_radix_cache_strategy"
    assert (view.mamba_radix_cache_strategy, view.disable_radix_cache) == ("extra_buffer", True)
    assert "--mamba-radix-cache-strategy" not in _good()


def test_one_bad_command_in_a_batch_names_only_that_one(parsed: None) -> None:
    results = sg.parse_many([_good(), BAD["choice"], _good()])
    assert isinstance(results[0], sg.ServerArgsView) and isinstance(results[2], sg.ServerArgsView)
    assert isinstance(results[1], str) and "fp9_e4m3" in results[1]
    with pytest.raises(sg.SGLangArgsError, match=r"rejects 1 command"):
        sg.check_argvs([_good(), BAD["choice"]])


def test_dropped_option_is_caught_by_field_comparison(parsed: None) -> None:
    p = load_profile("dp8-h200-throughput128")
    view = sg.check_argv(BAD["dropped"])  # still a valid SGLang command ...
    problems = sg.compare_fields(view, sg.expected_fields(p, host=LOOPBACK, port=30000))
    # ... but the option did not reach the worker, and the comparison says which.
    assert problems == ["disable_radix_cache: rendered True but SGLang parsed False"]


def test_eagle_family_uses_num_draft_tokens(parsed: None) -> None:
    argv = sg.render_argv(EAGLE, host=LOOPBACK, port=30000)
    assert "--speculative-dflash-block-size" not in argv
    view = sg.check_argv(argv)
    assert view.speculative == {}  # SGLang's DFLASH handler runs for DFLASH only
    assert (view.speculative_algorithm, view.speculative_num_draft_tokens) == ("EAGLE3", 4)
    assert (view.speculative_num_steps, view.speculative_eagle_topk) == (3, 1)
    assert view.revision == "0123abcd"  # the checkpoint revision the profile pins
    assert sg.compare_fields(view, sg.expected_fields(EAGLE, host=LOOPBACK, port=30000)) == []


def test_profile_without_graphs_or_optional_flags(parsed: None) -> None:
    argv = sg.render_argv(NO_GRAPHS, host=LOOPBACK, port=30000)
    for flag in ("--cuda-graph-bs-decode", "--kv-cache-dtype", "--incremental-streaming-output",
                 "--enable-metrics", "--mem-fraction-static", "--speculative-algorithm"):
        assert flag not in argv
    view = sg.check_argv(argv)
    assert view.disable_cuda_graph is True
    assert view.cuda_graph["decode"]["backend"] == "disabled" and view.decode_graph_sizes() == []
    assert view.kv_cache_dtype == "auto" and view.enable_metrics is False
    assert view.speculative_algorithm is None


def test_worker_env() -> None:
    h200 = load_profile("dp8-h200-throughput128")
    mi350 = load_profile("dp8-throughput128")
    plugin = {"SGLANG_PLUGINS": "netra", "NETRA_SGLANG_TACTICS": "moe,argmax", "NETRA_PLUGIN_EVIDENCE": "/r/w3.plugin"}
    assert sg.worker_env(h200, [3], evidence_dir="/r/w3.plugin") == {"CUDA_VISIBLE_DEVICES": "3", **plugin}
    # gfx950 enables no tactic domain: the plugin is left out through SGLang's whitelist.
    assert sg.worker_env(mi350, [6]) == {"HIP_VISIBLE_DEVICES": "6", "SGLANG_PLUGINS": "none"}
    assert sg.worker_env(h200.replace("engine.tactics", "none"), [0, 1]) == {
        "CUDA_VISIBLE_DEVICES": "0,1", "SGLANG_PLUGINS": "none"}
    with pytest.raises(ValueError, match="needs an evidence directory"):
        sg.worker_env(h200, [3])
    with pytest.raises(ValueError, match="at least one GPU"):
        sg.worker_env(h200, [])
    with pytest.raises(ValueError, match="non-negative"):
        sg.worker_env(h200, [-1])


def test_tactics_reach_every_worker_and_the_plan_shows_them(parsed: None, capsys: pytest.CaptureFixture[str]) -> None:
    from netra import cli

    h200 = make_plan(load_profile("dp8-h200-throughput128"), FIXTURE_BY_TARGET["sm90"])
    mi350 = make_plan(load_profile("dp8-throughput128"), FIXTURE_BY_TARGET["gfx950"])
    for w in h200.workers:
        assert w.tactics == ("moe", "argmax")
        assert w.plugin_evidence == f"{h200.run_dir}/worker{w.index}.plugin"
        assert w.engine_env["NETRA_PLUGIN_EVIDENCE"] == w.plugin_evidence
        assert (w.engine_env["SGLANG_PLUGINS"], w.engine_env["NETRA_SGLANG_TACTICS"]) == ("netra", "moe,argmax")
        # The hooked MoE path is the one SGLang runs: its parser resolves the rendered runner backend.
        assert sg.check_argv(w.engine_argv).moe_runner_backend == "triton"
        assert w.engine_expect["moe_runner_backend"] == "triton"
    for w in mi350.workers:
        assert (w.tactics, w.plugin_evidence, w.engine_env["SGLANG_PLUGINS"]) == ((), None, "none")
        assert "NETRA_SGLANG_TACTICS" not in w.engine_env
        assert sg.check_argv(w.engine_argv).moe_runner_backend == "auto"
    assert cli.main(["plan", "--profile", "dp8-h200-throughput128", "--topology", str(FIXTURE_BY_TARGET["sm90"]),
                     "--table"]) == 0
    out = capsys.readouterr().out
    for i in range(8):
        assert f"worker {i} plugin: netra (SGLANG_PLUGINS=netra), tactics moe, argmax, evidence " in out
        assert (f"worker {i}   tactic moe: op moe_fp8_routed at "
                "sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe.fused_experts (") in out
        assert (f"worker {i}   tactic argmax: op argmax at sglang.srt.layers.sampler.Sampler.forward "
                "(argmax_bf16_v248320, argmax_f32_v248320)") in out
    assert cli.main(["plan", "--profile", "dp8-throughput128", "--topology", str(FIXTURE_BY_TARGET["gfx950"]),
                     "--table"]) == 0
    out = capsys.readouterr().out
    assert all(f"worker {i} plugin: none (SGLANG_PLUGINS=none): stock SGLang" in out for i in range(8))


def test_render_refuses_non_sglang_profiles() -> None:
    with pytest.raises(ValueError, match="not sglang"):
        sg.render_argv(load_profile("local"), host=LOOPBACK, port=30000)


def test_parser_import_shims_are_only_the_documented_two(parsed: None) -> None:
    if not sg.LAST_CHILD:  # every command was already cached by an earlier test module
        sg.LAST_CHILD.update(sg._run_child([]))
    assert sg.LAST_CHILD["sglang_version"] == sg.SGLANG_VERSION
    # sglang/__init__ (frontend, not the parser) is skipped; triton is absent on CPU and stands in
    # inert (any attribute use raises, so a parse that touched it would have failed above).
    import importlib.util

    triton = [] if importlib.util.find_spec("triton") is not None else ["triton absent (inert module)"]
    assert sg.LAST_CHILD["shims"] == ["sglang/__init__ (frontend) skipped", *triton]


def test_cli_reports_every_sglang_profile(parsed: None, capsys: pytest.CaptureFixture[str]) -> None:
    assert sg.main([]) == 0
    out = capsys.readouterr().out
    assert "dp8-throughput128: ok" in out and "dp8-h200-throughput128: ok" in out
    assert "decode graphs full at [1, 2, 4, 8, 16, 32, 64, 80, 96, 112, 128]" in out
    assert sg.main(["local"]) == 1
    assert "not sglang" in capsys.readouterr().out


def test_attention_backend_where_the_profile_sets_one(parsed: None) -> None:
    view = sg.check_profile(FA3, host=LOOPBACK, port=30000)
    assert view.attention_backend == "fa3"
    with pytest.raises(sg.SGLangArgsError, match=r"--attention-backend: invalid choice: 'fa9'"):
        sg.check_profile(FA9, host=LOOPBACK, port=30000)


def test_qwen36_profiles_set_both_parsers() -> None:
    """Every SGLang profile serving Qwen3.6 sets the parsers of its formats (the parse is checked below)."""
    qwen36 = [p for p in _sglang_profiles() if p.engine.model_path == "Qwen/Qwen3.6-35B-A3B-FP8"]
    assert {"dp8-throughput128", "dp8-h200-throughput128"} <= {p.name for p in qwen36}
    for p in qwen36:
        assert (p.engine.reasoning_parser, p.engine.tool_call_parser) == ("qwen3", "qwen3_coder"), p.name


def test_parsers_reach_sglang_fields_in_every_profile_that_sets_them(parsed: None) -> None:
    setting = [p for p in _sglang_profiles() if p.engine.reasoning_parser or p.engine.tool_call_parser]
    assert setting
    for p in setting:
        argv = sg.render_argv(p, host=LOOPBACK, port=30000)
        view = sg.check_profile(p, host=LOOPBACK, port=30000)  # each Option landed on its own field
        for flag, dest in (("--reasoning-parser", "reasoning_parser"), ("--tool-call-parser", "tool_call_parser")):
            value = getattr(p.engine, dest)
            if value is None:
                assert flag not in argv
                continue
            assert argv[argv.index(flag) + 1] == value
            assert view.fields[dest] == value, (p.name, dest)
        # What the launch audits at /server_info is what SGLang parsed.
        expect = make_plan(p, FIXTURE_BY_TARGET[p.target]).workers[0].engine_expect
        assert (expect.get("reasoning_parser"), expect.get("tool_call_parser")) == (
            p.engine.reasoning_parser, p.engine.tool_call_parser)


@pytest.mark.parametrize("index", range(len(PARSER_NAMES)))
def test_every_parser_name_the_schema_accepts_is_one_sglang_knows(parsed: None, index: int) -> None:
    p = PARSER_NAMES[index]
    view = sg.check_profile(p, host=LOOPBACK, port=30000)
    assert (view.reasoning_parser, view.tool_call_parser) == (p.engine.reasoning_parser, p.engine.tool_call_parser)


def test_profile_without_parsers_renders_neither_flag(parsed: None) -> None:
    argv = sg.render_argv(NO_GRAPHS, host=LOOPBACK, port=30000)
    assert "--reasoning-parser" not in argv and "--tool-call-parser" not in argv
    view = sg.check_argv(argv)
    assert (view.reasoning_parser, view.tool_call_parser) == (None, None)


@pytest.mark.parametrize(("key", "value"), [("reasoning_parser", "qwen9"), ("reasoning_parser", "deepseek-r1"),
                                            ("tool_call_parser", "qwen3_xml"), ("tool_call_parser", "hermes")])
def test_unknown_parser_name_is_refused_naming_the_key(key: str, value: str) -> None:
    # deepseek-r1 and hermes are SGLang parsers, but not of the models these profiles serve.
    with pytest.raises(ProfileError, match=rf"engine\.{key}: '{value}' is not one of"):
        load_profile("dp8-h200-throughput128").replace(f"engine.{key}", value)


@pytest.mark.parametrize(("bad", "flag", "value"), [(BAD_REASONING, "--reasoning-parser", "qwen9"),
                                                    (BAD_TOOLS, "--tool-call-parser", "qwen3_xml")])
def test_sglang_refuses_a_parser_name_it_does_not_know(parsed: None, bad: Any, flag: str, value: str) -> None:
    with pytest.raises(sg.SGLangArgsError, match=rf"{flag}: invalid choice: '{value}'"):
        sg.check_profile(bad, host=LOOPBACK, port=30000)
