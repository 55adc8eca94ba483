"""Assemble an engine from `EngineOptions`: config, weights (seeded or checkpoint), pools, model, scheduler."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from netra.engine.cache import StatePools
from netra.engine.config import ModelConfig, preset
from netra.engine.loader import load_checkpoint
from netra.engine.memory import PoolPlan, plan_pools
from netra.engine.model import Model
from netra.engine.options import EngineOptions, OptionsError
from netra.engine.scheduler import Scheduler
from netra.engine.weights import seeded_weights
from netra.ops import attention, gdn
from netra.tokenizers import Tokenizer, load_tokenizer

log = logging.getLogger("netra.engine")


@dataclass
class Engine:
    options: EngineOptions
    config: ModelConfig
    model: Model
    pools: StatePools
    scheduler: Scheduler
    tokenizer: Tokenizer
    startup_s: float
    pool_plan: PoolPlan


def build_engine(options: EngineOptions) -> Engine:
    t0 = time.perf_counter()
    device = torch.device(options.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise OptionsError(f"--device {options.device}: no CUDA device is available")
    if device.type == "cuda" and device.index is None:
        # by index: the scheduler thread selects it with torch.cuda.set_device, which refuses a bare "cuda"
        device = torch.device("cuda", torch.cuda.current_device())
    if options.checkpoint:
        cfg, weights = load_checkpoint(Path(options.checkpoint), device)
    else:
        cfg = preset(options.preset)
        weights = seeded_weights(cfg, options.seed, device)
    if device.type == "cuda" and cfg.gdn_layers:
        log.info("GDN prefill on CUDA: %s", gdn.cuda_prefill_backend())  # fails here if fla-core is missing
        log.info("attention prefill on CUDA (where no contract serves it): %s", attention.prefill_backend())
    if options.context_length > cfg.max_position_embeddings:
        raise OptionsError(f"--context-length {options.context_length} exceeds the model's "
                           f"max_position_embeddings {cfg.max_position_embeddings}")
    ssm_dtype = options.mamba_ssm_dtype or cfg.mamba_ssm_dtype
    options = replace(options, mamba_ssm_dtype=ssm_dtype)
    plan = plan_pools(options, cfg, device, ssm_dtype)
    pools = StatePools(cfg, plan.slots, options.context_length, device, options.kv_cache_dtype, ssm_dtype)
    model = Model(cfg, weights, pools, device)
    tokenizer = load_tokenizer(Path(options.checkpoint) if options.checkpoint else None)
    scheduler = Scheduler(model, pools, options, cfg.eos_token_id)
    if options.speculative_algorithm:
        from netra.engine.spec.setup import speculation

        spec, options = speculation(options, cfg, weights, scheduler.runner)
        scheduler.speculate(spec)
        log.info("speculative decoding: %s, %d tokens per block", options.speculative_algorithm,
                 options.speculative_num_draft_tokens)
    startup = time.perf_counter() - t0
    log.info("engine ready: preset %s, %s, %s, %.2f s", options.preset, device, plan.describe(), startup)
    return Engine(options, cfg, model, pools, scheduler, tokenizer, startup, plan)
