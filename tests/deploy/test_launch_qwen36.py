"""`netra launch --profile local-qwen36`: the `local` deployment serving the synthesized Qwen3.6-format
checkpoint (real vocabulary, tokenizer, chat template, generation_config's stop ids), driven with the
`openai` SDK; and the launch's refusal of a missing checkpoint folder."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.deploy.conftest import Local, free_port, launched, needs_nginx, netra

pytestmark = [needs_nginx, pytest.mark.timeout(420)]
MODEL = "netra-qwen36-tiny"
IM_END = 248046


@pytest.fixture(scope="module")
def served(qwen36_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Local]:
    with launched("local-qwen36", tmp_path_factory, "--set", f"engine.model_path={qwen36_checkpoint}") as local:
        yield local


def test_chat_with_the_real_vocabulary(served: Local, qwen36_checkpoint: Path) -> None:
    rec = served.record()
    assert rec["state"] == "serving" and all(w["status"] == "up" and w["audit"] == [] for w in rec["workers"])
    c = served.client()
    r = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hello"}], max_tokens=8)
    # The template opens the reply with <think> (thinking on by default): the response layer may return the
    # text as reasoning_content until </think>, which a model of seeded weights does not write.
    msg = r.choices[0].message
    assert (msg.content or (msg.model_extra or {}).get("reasoning_content")) and r.usage is not None
    # the real tokenizer and chat template: <|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n<think>\n
    assert r.usage.prompt_tokens == 11 and r.usage.completion_tokens == 8, r.usage
    answer = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hello"}], max_tokens=8,
                                       extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert answer.choices[0].message.content and answer.usage is not None
    assert answer.usage.prompt_tokens == 13  # ... <think>, \n\n, </think>, \n\n
    # <|im_end|> is a stop id of generation_config.json (config.json names only <|endoftext|>)
    forced = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hello"}], max_tokens=8,
                                       logit_bias={str(IM_END): 100})
    assert forced.choices[0].finish_reason == "stop" and forced.usage is not None
    assert forced.usage.completion_tokens == 1
    models = c.models.list()
    assert [m.id for m in models.data] == [MODEL]


def test_a_missing_checkpoint_is_refused_naming_the_synth_command(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    out = netra("launch", "--profile", "local-qwen36", "--set", f"engine.model_path={missing}", "--run-dir",
                str(tmp_path / "run"), "--front-port", str(free_port()), timeout=120)
    assert out.returncode == 2, out.stdout + out.stderr
    assert f"netra checkpoint synth --preset tiny --out {missing}" in out.stderr
