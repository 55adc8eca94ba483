from __future__ import annotations

import argparse

import pytest

from netra.engine.cli import add_arguments, options_from_args
from netra.engine.options import DEFAULT_GRAPH_BS, OptionsError


def _parse(*argv: str):  # type: ignore[no-untyped-def]
    p = argparse.ArgumentParser()
    add_arguments(p)
    return options_from_args(p.parse_args(list(argv)))


def test_flags_spelled_like_sglang() -> None:
    o = _parse("--preset", "tiny", "--port", "0", "--cuda-graph-bs", "1", "2", "4", "--stream-interval", "4",
               "--incremental-streaming-output", "--kv-cache-dtype", "auto", "--mamba-ssm-dtype", "bfloat16",
               "--model-path", "/x", "--random-seed", "9", "--max-running-requests", "8", "--context-length", "512",
               "--chunked-prefill-size", "128")
    assert o.cuda_graph_bs == (1, 2, 4) and o.stream_interval == 4 and o.incremental_streaming_output
    assert (o.kv_cache_dtype, o.mamba_ssm_dtype, o.checkpoint, o.seed) == ("auto", "bfloat16", "/x", 9)
    assert (o.max_running_requests, o.context_length, o.chunked_prefill_size) == (8, 512, 128)
    assert _parse("--cuda-graph-bs", "1,2,8").cuda_graph_bs == (1, 2, 8)
    assert _parse().cuda_graph_bs == DEFAULT_GRAPH_BS and _parse().torch_threads == 1
    with pytest.raises(OptionsError, match="cuda-graph-bs"):
        _parse("--cuda-graph-bs", "8,4")
    with pytest.raises(argparse.ArgumentTypeError, match="not an integer"):
        _parse("--cuda-graph-bs", "1,x")


def test_bad_flags_stop_the_process_with_a_message() -> None:
    from netra.engine.process import engine_process

    with pytest.raises(RuntimeError, match="cuda-graph-bs"), engine_process("--cuda-graph-bs", "8,4",
                                                                           startup_timeout=60):
        pass
