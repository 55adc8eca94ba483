"""The reasoning splitter and counter (netra/serve/reasoning.py) against hand-derived expectations,
under every chunking of the output (a stream may cut a tag anywhere)."""

from __future__ import annotations

import itertools

import pytest

from netra.serve.reasoning import ReasoningCounter, ReasoningSplitter, opens_reasoning


def _split(text: str, cuts: list[int]) -> tuple[str, str]:
    s = ReasoningSplitter()
    reasoning, content = [], []
    bounds = [0, *cuts, len(text)]
    for a, b in itertools.pairwise(bounds):
        r, c = s.push(text[a:b])
        reasoning.append(r)
        content.append(c)
    r, c = s.flush()
    return "".join(reasoning) + r, "".join(content) + c


def _chunkings(text: str) -> list[list[int]]:
    n = len(text)
    out = [[], list(range(1, n))]  # whole, one character at a time
    out += [[k] for k in range(1, n)]  # every single cut
    out += [list(range(k, n, 3)) for k in (1, 2)]
    return out


CASES = [
    # (model output after the prompt's "<think>\n", reasoning, content)
    ("The user greets.\n</think>\n\nHello!", "The user greets.", "Hello!"),
    ("\nStep 1.\n\nStep 2.\n\n</think>\n\nAnswer:\n\n42", "Step 1.\n\nStep 2.", "Answer:\n\n42"),
    ("Need a tool.\n</think>\n\n<tool_call>\n<function=f>\n</function>\n</tool_call>", "Need a tool.",
     "<tool_call>\n<function=f>\n</function>\n</tool_call>"),
    # A call opened inside the block ends it: the call is the answer's.
    ("Calling now.\n<tool_call>\n<function=f>\n</function>\n</tool_call>", "Calling now.",
     "<tool_call>\n<function=f>\n</function>\n</tool_call>"),
    # Truncated inside the reasoning (max_tokens): everything is reasoning, a partial tag included.
    ("Thinking about it\n</thi", "Thinking about it\n</thi", ""),
    ("</think>\n\nNo reasoning at all.", "", "No reasoning at all."),
    ("a < b and </b> is not a close tag\n</think>ok", "a < b and </b> is not a close tag", "ok"),
    # Only the first </think> closes the block; a later one is the answer's text.
    ("r</think>x </think> y", "r", "x </think> y"),
]


@pytest.mark.parametrize(("text", "reasoning", "content"), CASES)
def test_splitter_every_chunking(text: str, reasoning: str, content: str) -> None:
    for cuts in _chunkings(text):
        assert _split(text, cuts) == (reasoning, content), cuts


def test_opens_reasoning_reads_the_rendered_prompt() -> None:
    assert opens_reasoning("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n")
    assert not opens_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n")  # enable_thinking: false
    # History turns carry closed blocks; only an open one at the end counts.
    assert not opens_reasoning("<|im_start|>assistant\n<think>\nr\n</think>\n\nok<|im_end|>\n<|im_start|>user\nq")
    assert not opens_reasoning("user: hi\nassistant:")


def test_counter_counts_through_the_close_tag_or_to_a_call() -> None:
    end, tool = [248069], [248058]
    c = ReasoningCounter(end, tool)
    c.push([1, 2, 3])
    c.push([248069, 9, 9])
    assert (c.tokens, c.done) == (4, True)  # </think> counted, as SGLang counts it
    c = ReasoningCounter(end, tool)
    c.push([1, 2, 248058, 5])
    assert (c.tokens, c.done) == (2, True)  # the call is not reasoning
    c = ReasoningCounter([60, 47, 62], tool)  # a multi-token end sequence (a byte vocabulary)
    c.push([1, 60, 47])
    assert not c.done
    c.push([62, 5])
    assert (c.tokens, c.done) == (4, True)
