"""Engine options: one frozen dataclass, the CLI's defaults and `/server_info`'s payload. Torch-free."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

MIXED_CHUNK = ("off", "split", "fused")
# SGLang's spellings of the reasoning parsers the engine knows (None: no reasoning phase).
REASONING_PARSERS = (None, "qwen3")
DEFAULT_GRAPH_BS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128)
# --speculative-algorithm (SGLang's spelling, lower case): a DFlash drafter, or the forced-acceptance oracle
# (cost curves without trained weights: its output is not the target's).
SPECULATIVE_ALGORITHMS = (None, "dflash", "oracle")


class OptionsError(ValueError):
    pass


@dataclass(frozen=True)
class EngineOptions:
    preset: str = "tiny"
    checkpoint: str | None = None  # HF-format directory; its config.json overrides the preset's shapes
    seed: int = 0  # seeded weights and the default per-request sampling seeds
    device: str = "cpu"
    host: str = "127.0.0.1"
    port: int = 30000
    max_running_requests: int = 64
    context_length: int = 4096
    chunked_prefill_size: int = 2048
    cuda_graph_bs: tuple[int, ...] = field(default=DEFAULT_GRAPH_BS)
    stream_interval: int = 1
    incremental_streaming_output: bool = False
    kv_cache_dtype: str = "fp8_e4m3"
    mamba_ssm_dtype: str | None = None  # None: the checkpoint's (config) value
    torch_threads: int = 1  # several workers share a few cores; raise it on a machine of your own
    disable_cuda_graph: bool = False  # on a CUDA device, decode buckets replay captured graphs unless set
    max_new_tokens_limit: int | None = None  # None: the context length
    enable_metrics: bool = False  # GET /metrics (SGLang's metric names where the meaning is the same)
    served_model_name: str | None = None  # the model_name label of the metrics (None: netra-PRESET)
    worker_id: str = "0"  # the worker label of the metrics (the launcher passes the index)
    # Pool sizing (netra/engine/memory.py): on CUDA from the free memory and this fraction (None: 0.90);
    # --pool-memory-gib states the pools' budget outright (the way to size by memory on a CPU).
    mem_fraction_static: float | None = None
    pool_memory_gib: float | None = None
    # Prompts arriving while requests decode: off (a prefill step stalls every running stream), split
    # (the decode rows' graph plus a prefill forward in one step), fused (one forward carrying both).
    mixed_chunk: str = "split"
    load_log_interval_s: float = 10.0  # the periodic running / queued / throughput line (0: off)
    # CUDA: before the first request, run the prefill path once at the chunk width (Triton compiles, fla's
    # autotuning, tactic loads) and capture every decode bucket with its greedy sampling graph; /health
    # answers 503 until done. Off: the first prompt waits for the compiles, each bucket's first step for its capture.
    warmup: bool = True
    # Decode steps chained on the device: while every running request is greedy and unconstrained and no prompt
    # waits, step N+1 is launched from step N's tokens on the device before the host reads them, so the host's
    # output work overlaps the device. Off by default until its H200 A/B (netra/engine/scheduler.py).
    decode_overlap: bool = False
    # SGLang's --reasoning-parser: with "qwen3", a request that says require_reasoning (its prompt opened a
    # think block) has its grammar applied only after the model closes the block with </think>.
    reasoning_parser: str | None = None
    # Speculative decoding (netra/engine/spec/): SGLang's --speculative-algorithm, --speculative-draft-model-path
    # (a z-lab DFlash directory; with oracle, optional: the drafter whose cost the oracle runs) and
    # --speculative-num-draft-tokens (T, the block: the pending token and T - 1 drafts; None: the drafter's
    # block size, 4 for the oracle without one). oracle commits, at each verify of each request, a number of drafts
    # drawn (seeded by --seed) from --speculative-oracle-accept (None: all T - 1). Decode steps do not chain
    # (--decode-overlap) while speculating.
    speculative_algorithm: str | None = None
    speculative_draft_model_path: str | None = None
    speculative_num_draft_tokens: int | None = None
    speculative_oracle_accept: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        positive = ("max_running_requests", "context_length", "chunked_prefill_size", "stream_interval",
                    "torch_threads")
        for name in positive:
            v = getattr(self, name)
            if not isinstance(v, int) or v <= 0:
                raise OptionsError(f"--{name.replace('_', '-')} {v!r}: expected a positive integer")
        if not 0 <= self.port <= 65535:
            raise OptionsError(f"--port {self.port}: out of range")
        if not self.cuda_graph_bs or any(b <= 0 for b in self.cuda_graph_bs):
            raise OptionsError(f"--cuda-graph-bs {list(self.cuda_graph_bs)}: expected positive batch sizes")
        if list(self.cuda_graph_bs) != sorted(set(self.cuda_graph_bs)):
            raise OptionsError(f"--cuda-graph-bs {list(self.cuda_graph_bs)}: expected strictly increasing sizes")
        if self.kv_cache_dtype not in ("fp8_e4m3", "bfloat16", "bf16", "auto"):
            raise OptionsError(f"--kv-cache-dtype {self.kv_cache_dtype!r}: expected fp8_e4m3, bfloat16 or auto")
        if self.mamba_ssm_dtype not in (None, "float32", "bfloat16"):
            raise OptionsError(f"--mamba-ssm-dtype {self.mamba_ssm_dtype!r}: expected float32 or bfloat16")
        if self.device not in ("cpu", "cuda") and not self.device.startswith("cuda:"):
            raise OptionsError(f"--device {self.device!r}: expected cpu, cuda or cuda:N")
        if self.mem_fraction_static is not None and not 0.05 <= self.mem_fraction_static <= 0.99:
            raise OptionsError(f"--mem-fraction-static {self.mem_fraction_static}: expected 0.05 .. 0.99")
        if self.pool_memory_gib is not None and not self.pool_memory_gib > 0:
            raise OptionsError(f"--pool-memory-gib {self.pool_memory_gib}: expected a positive size")
        if self.mixed_chunk not in MIXED_CHUNK:
            raise OptionsError(f"--mixed-chunk {self.mixed_chunk!r}: expected one of {', '.join(MIXED_CHUNK)}")
        if self.load_log_interval_s < 0:
            raise OptionsError(f"--load-log-interval {self.load_log_interval_s}: expected seconds >= 0")
        if self.reasoning_parser not in REASONING_PARSERS:
            raise OptionsError(f"--reasoning-parser {self.reasoning_parser!r}: expected one of "
                               f"{', '.join(p for p in REASONING_PARSERS if p)}")
        if self.context_length < 2:
            raise OptionsError("--context-length must be at least 2")
        self._check_speculative()

    def _check_speculative(self) -> None:
        algo = self.speculative_algorithm
        if algo not in SPECULATIVE_ALGORITHMS:
            raise OptionsError(f"--speculative-algorithm {algo!r}: expected one of "
                               f"{', '.join(a for a in SPECULATIVE_ALGORITHMS if a)}")
        if algo is None and (self.speculative_draft_model_path or self.speculative_num_draft_tokens is not None
                             or self.speculative_oracle_accept is not None):
            raise OptionsError("--speculative-draft-model-path, --speculative-num-draft-tokens and "
                               "--speculative-oracle-accept need --speculative-algorithm")
        if algo == "dflash" and not self.speculative_draft_model_path:
            raise OptionsError("--speculative-algorithm dflash needs --speculative-draft-model-path")
        t = self.speculative_num_draft_tokens
        if t is not None and (not isinstance(t, int) or t < 2):
            raise OptionsError(f"--speculative-num-draft-tokens {t!r}: expected at least 2 (the pending token and "
                               "a draft)")
        acc = self.speculative_oracle_accept
        if acc is not None and (algo != "oracle" or not acc or any(a < 0 for a in acc)):
            raise OptionsError(f"--speculative-oracle-accept {list(acc)}: expected non-negative draft counts, with "
                               "--speculative-algorithm oracle")

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["cuda_graph_bs"] = list(self.cuda_graph_bs)
        if self.speculative_oracle_accept is not None:
            d["speculative_oracle_accept"] = list(self.speculative_oracle_accept)
        return d
