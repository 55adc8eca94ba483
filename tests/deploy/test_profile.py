from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import yaml

from netra.deploy.profile import (
    PROFILE_DIR,
    SCHEMA_PATH,
    ProfileError,
    list_profiles,
    load_profile,
    profile_from_dict,
    render_schema,
)
from netra.deploy.verify import PROFILE_LOCK, read_profile_lock

EXPECTED = {"dp8-throughput128", "dp8-h200-throughput128", "dp1-h200", "dp2-h200", "local", "local-compose",
            "local-qwen36"}
BUCKETS = [1, 2, 4, 8, 16, 32, 64, 80, 96, 112, 128]


def raw(name: str) -> dict:
    return yaml.safe_load((PROFILE_DIR / f"{name}.yaml").read_text())


def test_every_committed_profile_loads_and_is_locked() -> None:
    assert set(list_profiles()) == EXPECTED
    lock = read_profile_lock(PROFILE_LOCK)
    for name in EXPECTED:
        p = load_profile(name)
        assert p.name == name
        # The committed lock matches the committed profiles (re-lock: `netra plan --relock`).
        assert lock[name] == p.sha256(), f"{name} changed without `netra plan --relock --profile {name}`"


def test_schema_file_is_generated_from_the_dataclasses() -> None:
    assert SCHEMA_PATH.read_text() == render_schema(), "run `netra plan --write-schema`"
    schema = json.loads(SCHEMA_PATH.read_text())
    assert schema["additionalProperties"] is False
    assert set(schema["required"]) == {"name", "description", "target", "dp", "engine", "serve"}


@pytest.mark.parametrize("name,target,image", [("dp8-throughput128", "gfx950", "netra-sglang-rocm-gfx950"),
                                               ("dp8-h200-throughput128", "sm90", "netra-sglang-cuda-sm90")])
def test_throughput128_contract_values(name: str, target: str, image: str) -> None:
    p = load_profile(name)
    e, f = p.engine, p.front
    assert (p.target, p.dp, p.image, p.strict, e.kind) == (target, 8, image, True, "sglang")
    assert e.max_running_requests == 128 and e.context_length == 65536 and e.chunked_prefill_size == 32768
    assert e.mem_fraction_static == 0.80 and list(e.cuda_graph_bs) == BUCKETS
    assert e.kv_cache_dtype == "fp8_e4m3" and e.disable_radix_cache is True
    assert e.stream_interval == 2 and e.speculative is not None and e.speculative.algorithm == "DFLASH"
    assert e.incremental_streaming_output is True
    assert (f.balance, f.target_concurrency, f.keepalive) == ("round_robin", 8192, 1024)


def test_embedded_and_local_profiles() -> None:
    for d in (1, 2):
        p = load_profile(f"dp{d}-h200")
        assert (p.dp, p.target, p.engine.kind, p.engine.preset, p.engine.device) == (
            d, "sm90", "netra", "qwen36-35b-a3b", "cuda")
        assert p.engine.max_running_requests == 128 and list(p.engine.cuda_graph_bs) == BUCKETS
    local = load_profile("local")
    assert (local.target, local.dp, local.engine.preset, local.engine.device) == ("cpu", 2, "tiny", "cpu")
    assert (local.front.host, local.front.port) == ("127.0.0.1", 8000)


def test_canonical_json_is_sorted_compact_and_hashed() -> None:
    p = load_profile("local")
    text = p.canonical_json()
    assert text == json.dumps(json.loads(text), sort_keys=True, separators=(",", ":"))
    assert p.sha256() == hashlib.sha256(text.encode()).hexdigest()
    # Defaults are part of the identity: a profile spelling a default explicitly hashes the same.
    data = raw("local")
    data["engine"]["enable_metrics"] = True
    assert profile_from_dict(data).sha256() == p.sha256()
    data["engine"]["seed"] = 1
    assert profile_from_dict(data).sha256() != p.sha256()


@pytest.mark.parametrize("mutate,message", [
    (lambda d: d.update(bogus=1), "unknown key bogus"),
    (lambda d: d["engine"].update(max_runing_requests=8), "unknown key engine.max_runing_requests"),
    (lambda d: d["front"].update(balance="random"), "front.balance: 'random' is not one of"),
    (lambda d: d["engine"].update(max_running_requests=0), "engine.max_running_requests: 0 is below"),
    (lambda d: d["engine"].update(max_running_requests="16"), "engine.max_running_requests: expected an integer"),
    (lambda d: d["engine"].update(max_running_requests=True), "engine.max_running_requests: expected an integer"),
    (lambda d: d["engine"].update(cuda_graph_bs=[1, "x"]), "engine.cuda_graph_bs[1]: expected an integer"),
    (lambda d: d["engine"].update(cuda_graph_bs=[4, 2]), "engine.cuda_graph_bs: [4, 2] must be strictly"),
    (lambda d: d["engine"].update(kv_cache_dtype="fp8"), "engine.kv_cache_dtype: 'fp8' is not one of"),
    (lambda d: d["engine"].update(incremental_streaming_output="yes"), "expected true/false"),
    (lambda d: d.pop("serve"), "missing key serve"),
    (lambda d: d.update(target="gfx942"), "target: 'gfx942' is not one of"),
    (lambda d: d["engine"].update(device="cuda"), "engine.device: target cpu runs the engine on cpu"),
    (lambda d: d["ports"].update(serve_base=30000), "ports: engine_base and serve_base must differ"),
    (lambda d: d["engine"].update(speculative={"algorithm": "DFLASH"}), "missing key engine.speculative.draft"),
    (lambda d: d.update(name="Local!"), "name: 'Local!' does not match"),
])
def test_bad_profiles_name_the_problem(mutate, message: str) -> None:
    data = raw("local")
    mutate(data)
    with pytest.raises(ProfileError) as err:
        profile_from_dict(data, source="t.yaml")
    assert message in str(err.value)
    assert str(err.value).startswith("t.yaml: ")


def test_load_profile_errors(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match=r"no file .*\(known profiles: .*local"):
        load_profile("nope")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(ProfileError, match="not valid YAML"):
        load_profile(bad)
    good = tmp_path / "mine.yaml"
    good.write_text(yaml.safe_dump(raw("local")))
    assert load_profile(good).sha256() == load_profile("local").sha256()


def test_replace_revalidates() -> None:
    p = load_profile("dp8-throughput128")
    q = p.replace("engine.stream_interval", 4).replace("engine.speculative", None)
    assert q.engine.stream_interval == 4 and q.engine.speculative is None and p.engine.stream_interval == 2
    with pytest.raises(ProfileError, match=r"engine\.stream_interval: 0 is below"):
        p.replace("engine.stream_interval", 0)
    with pytest.raises(ProfileError, match="unknown key 'nope'"):
        p.replace("engine.nope", 1)


def test_tactics_key_names_the_plugin_domains() -> None:
    import typing

    from netra.deploy.profile import Domain
    from netra.plugins.sglang import DOMAINS

    assert typing.get_args(Domain) == tuple(DOMAINS)  # one registry: netra.plugins.sglang.DOMAINS
    assert load_profile("dp8-h200-throughput128").engine.tactics == ("moe", "argmax")
    assert load_profile("dp8-throughput128").engine.tactics == "none"  # gfx950: no validated code objects
    assert all(load_profile(n).engine.tactics == "none" for n in ("local", "dp1-h200", "dp2-h200"))


@pytest.mark.parametrize("value,message", [
    ("moe", "fits none of: expected a list, got str; 'moe' is not one of ['none']"),
    (["gdn"], "engine.tactics[0]: 'gdn' is not one of ['moe', 'argmax']"),
    ([], "an empty list; write none"),
    (["argmax", "argmax"], "['argmax'] listed more than once"),
    (None, "null is not allowed"),
])
def test_bad_tactics_are_refused_naming_the_key(value: object, message: str) -> None:
    with pytest.raises(ProfileError, match=r"engine\.tactics") as info:
        load_profile("dp8-h200-throughput128").replace("engine.tactics", value)
    assert message in str(info.value)


def test_tactics_are_for_sglang_workers_only() -> None:
    with pytest.raises(ProfileError, match="only SGLang workers load Netra's plugin"):
        load_profile("dp1-h200").replace("engine.tactics", ["moe"])


def test_parser_keys() -> None:
    import typing

    from netra.deploy.profile import ReasoningParser
    from netra.engine.options import REASONING_PARSERS

    # One list of reasoning parsers for both engines: what the profile accepts, `netra engine` accepts too.
    assert set(typing.get_args(ReasoningParser)) == {r for r in REASONING_PARSERS if r}
    for name in ("dp8-throughput128", "dp8-h200-throughput128"):
        e = load_profile(name).engine
        assert (e.reasoning_parser, e.tool_call_parser) == ("qwen3", "qwen3_coder")
    # The seeded presets' plain template opens no think block (see the comment in dp1-h200.yaml).
    assert all(load_profile(n).engine.reasoning_parser is None for n in ("local", "dp1-h200", "dp2-h200"))
    assert load_profile("dp1-h200").replace("engine.reasoning_parser", "qwen3").engine.reasoning_parser == "qwen3"
    with pytest.raises(ProfileError, match=r"engine\.tool_call_parser: SGLang workers only"):
        load_profile("dp1-h200").replace("engine.tool_call_parser", "qwen3_coder")
    with pytest.raises(ProfileError, match=r"engine\.reasoning_parser: 'qwen3-thinking' is not one of \['qwen3'\]"):
        load_profile("local").replace("engine.reasoning_parser", "qwen3-thinking")


def test_an_embedded_engine_model_path_is_a_folder_under_the_run_dir_unless_absolute(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import dataclasses

    from netra.deploy.plan import make_plan
    from netra.deploy.profile import netra_model_dir

    monkeypatch.setenv("NETRA_RUN_DIR", str(tmp_path))
    p = load_profile("local-qwen36")
    assert netra_model_dir(p.engine) == tmp_path / "checkpoints" / "qwen36-tiny"
    argv = list(make_plan(p, None, {}).workers[0].engine_argv)
    assert argv[argv.index("--model-path") + 1] == str(tmp_path / "checkpoints" / "qwen36-tiny")
    assert netra_model_dir(dataclasses.replace(p.engine, model_path="/x/y")) == Path("/x/y")
    assert netra_model_dir(load_profile("local").engine) is None
    assert netra_model_dir(load_profile("dp8-throughput128").engine) is None  # an SGLang repo id stays as is
