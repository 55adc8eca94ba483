"""Per-request state pools: KV cache of the attention layers, GDN recurrent and convolution state.

Everything is allocated once at start-up at fixed addresses (CUDA graphs capture pointers): a
request owns one slot index for its lifetime, and each pool is indexed ``[layer][slot]``. Slot 0 is
never handed out: padded rows of a decode bucket point at it, so their writes land somewhere
harmless and no real request's state is touched.
"""

from __future__ import annotations

import torch

from netra.engine.config import ModelConfig
from netra.ops import fp8

KV_DTYPES = {"fp8_e4m3": fp8.E4M3, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "auto": torch.bfloat16}
SSM_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
PAD_SLOT = 0


class PoolExhausted(RuntimeError):
    pass


class StatePools:
    def __init__(self, cfg: ModelConfig, max_requests: int, context_length: int, device: torch.device,
                 kv_cache_dtype: str = "fp8_e4m3", ssm_dtype: str = "float32") -> None:
        if kv_cache_dtype not in KV_DTYPES:
            raise ValueError(f"kv cache dtype {kv_cache_dtype!r}: expected one of {sorted(KV_DTYPES)}")
        if ssm_dtype not in SSM_DTYPES:
            raise ValueError(f"mamba ssm dtype {ssm_dtype!r}: expected one of {sorted(SSM_DTYPES)}")
        self.num_slots = max_requests + 1
        self.context_length = context_length
        n_attn, n_gdn = len(cfg.attention_layers), len(cfg.gdn_layers)
        kv = KV_DTYPES[kv_cache_dtype]
        shape = (n_attn, self.num_slots, context_length, cfg.num_key_value_heads, cfg.head_dim)
        self.k = torch.zeros(shape, dtype=kv, device=device)
        self.v = torch.zeros(shape, dtype=kv, device=device)
        self.ssm = torch.zeros(n_gdn, self.num_slots, cfg.linear_num_value_heads, cfg.linear_key_head_dim,
                               cfg.linear_value_head_dim, dtype=SSM_DTYPES[ssm_dtype], device=device)
        self.conv = torch.zeros(n_gdn, self.num_slots, cfg.conv_dim, cfg.linear_conv_kernel_dim - 1,
                                dtype=torch.bfloat16, device=device)
        # Layer index -> index into its pool.
        self.attn_index = {layer: i for i, layer in enumerate(cfg.attention_layers)}
        self.gdn_index = {layer: i for i, layer in enumerate(cfg.gdn_layers)}
        self._free = list(range(self.num_slots - 1, PAD_SLOT, -1))

    @property
    def free_slots(self) -> int:
        return len(self._free)

    def alloc(self) -> int:
        """A free slot with its recurrent and convolution state zeroed (a new sequence starts from zero)."""
        if not self._free:
            raise PoolExhausted("no free request slot")
        slot = self._free.pop()
        self.ssm[:, slot].zero_()
        self.conv[:, slot].zero_()
        return slot

    def release(self, slot: int) -> None:
        if slot == PAD_SLOT or slot in self._free:
            raise ValueError(f"slot {slot} released twice or never allocated")
        self._free.append(slot)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.k, self.v, self.ssm, self.conv))
