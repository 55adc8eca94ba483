"""Pool sizing from memory: how many request slots the KV and state pools get.

A slot holds one request's whole state: its attention K/V for ``context_length`` positions in every
attention layer (the decode and prefill attention ops read ``cache[slot, :len]``, contiguous), its GDN
recurrent state and its convolution window. So the pools' memory is ``(slots + 1) x slot_bytes`` (slot 0
is the pad row's) and the slot count follows from a byte budget:

- on CUDA, after the weights are loaded: ``free - total x (1 - mem_fraction_static)``
  (`torch.cuda.mem_get_info`, plus what this process's caching allocator holds unused; SGLang's rule,
  so ``mem_fraction_static`` means the same: the share of the device's memory that weights and pools
  may take; the rest is for activations, graphs and workspaces);
- anywhere, ``--pool-memory-gib`` states the budget outright (a CPU's only way to size by memory).

``max_running_requests`` caps the count. A request that finds no free slot waits in the admission
queue (FIFO) until one is released; it is never failed for want of memory.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from netra.engine.cache import KV_DTYPES, SSM_DTYPES
from netra.engine.config import ModelConfig
from netra.engine.options import EngineOptions, OptionsError

log = logging.getLogger("netra.engine")

DEFAULT_MEM_FRACTION = 0.90  # on CUDA when --mem-fraction-static is not given


def slot_bytes(cfg: ModelConfig, context_length: int, kv_cache_dtype: str, ssm_dtype: str) -> int:
    """Bytes of one request slot across every pool (`netra.engine.cache.StatePools`'s shapes)."""
    kv = torch.empty((), dtype=KV_DTYPES[kv_cache_dtype]).element_size()
    ssm = torch.empty((), dtype=SSM_DTYPES[ssm_dtype]).element_size()
    n_attn, n_gdn = len(cfg.attention_layers), len(cfg.gdn_layers)
    per_kv = 2 * n_attn * context_length * cfg.num_key_value_heads * cfg.head_dim * kv
    per_ssm = n_gdn * cfg.linear_num_value_heads * cfg.linear_key_head_dim * cfg.linear_value_head_dim * ssm
    per_conv = n_gdn * cfg.conv_dim * (cfg.linear_conv_kernel_dim - 1) * 2  # bf16
    return per_kv + per_ssm + per_conv


@dataclass(frozen=True)
class PoolPlan:
    slots: int  # request slots (the pad slot not counted)
    slot_bytes: int
    budget_bytes: int | None  # None: sized from max_running_requests alone
    source: str  # how the budget was found

    def describe(self) -> str:
        pools = (self.slots + 1) * self.slot_bytes / 2**30
        if self.budget_bytes is None:
            return f"{self.slots} request slots ({pools:.2f} GiB, from --max-running-requests)"
        return (f"{self.slots} request slots ({pools:.2f} GiB of a {self.budget_bytes / 2**30:.2f} GiB budget "
                f"from {self.source}; {self.slot_bytes / 2**20:.1f} MiB per slot)")


def plan_pools(options: EngineOptions, cfg: ModelConfig, device: torch.device, ssm_dtype: str) -> PoolPlan:
    """The slot count for these options on this device (call it after the weights are loaded)."""
    per = slot_bytes(cfg, options.context_length, options.kv_cache_dtype, ssm_dtype)
    if options.pool_memory_gib is not None:
        budget, source = int(options.pool_memory_gib * 2**30), "--pool-memory-gib"
    elif device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        # blocks this process's caching allocator holds but no tensor uses are free for the pools too
        free += torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        frac = options.mem_fraction_static or DEFAULT_MEM_FRACTION
        budget = int(free - total * (1.0 - frac))
        source = (f"free device memory ({free / 2**30:.2f} of {total / 2**30:.2f} GiB, "
                  f"mem_fraction_static {frac:g})")
    else:
        return PoolPlan(options.max_running_requests, per, None, "--max-running-requests")
    slots = min(options.max_running_requests, budget // per - 1)  # one slot's worth for the pad row
    if slots < 1:
        raise OptionsError(f"the KV and state pools need {2 * per / 2**30:.2f} GiB for one request of "
                           f"--context-length {options.context_length} (and the pad slot), but {source} leaves "
                           f"{max(0, budget) / 2**30:.2f} GiB: lower --context-length or raise the budget")
    plan = PoolPlan(slots, per, budget, source)
    if slots < options.max_running_requests:
        log.warning("memory holds %d of --max-running-requests %d: %s", slots, options.max_running_requests,
                    plan.describe())
    return plan
