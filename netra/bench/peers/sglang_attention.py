"""The attention-decode peer: SGLang 0.5.23's Triton decode attention, as its Triton backend calls it.

SGLang's own files from the pinned wheel, loaded without the server by
``netra.bench.peers.sglang_loader``: ``decode_attention_fwd`` (sglang/kernels/ops/attention/
decode_attention.py: GQA takes ``decode_attention_fwd_grouped``, stage 1 ``_fwd_grouped_kernel_stage1``
with ``BLOCK_H=16``, ``BLOCK_N=32``, 4 warps, 2 stages, then stage 2 ``_fwd_kernel_stage2``), called as
``TritonAttnBackend.forward_decode`` calls it (sglang/srt/layers/attention/triton_backend.py):
``max_kv_splits = 8`` (``--triton-attention-num-kv-splits`` default), per-request ``num_kv_splits``
from SGLang's ``get_num_kv_splits_triton`` (sglang/kernels/ops/attention/metadata.py) with the
device's SM count, ``use_pdl`` on sm90 (``is_arch_support_pdl``), k/v scales 1.0, FP32
``attn_logits [B, Hq, 8, 256]`` and ``attn_lse [B, Hq, 8]``. On an FP8 cache its stage 1 casts q to
the cache dtype (``q.to(K_Buffer.dtype.element_ty)``) and the probabilities too (``p.to(v.dtype)``):
SGLang's decode runs Q·K and P·V as E4M3 MMAs.

The KV cache is Netra's pool ``[slots, context, kv_heads, head_dim]`` viewed as SGLang's page-size-1
token buffers ``[slots * context, kv_heads, head_dim]``; ``kv_indices`` lists request b's tokens
``slots[b] * context + [0, seq_lens[b])``. What SGLang runs once per step for all layers (the
indices, ``get_num_kv_splits``) runs once at construction, outside the timed call (RUN_NOTES).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from netra.bench.peers.sglang_loader import DEFAULT_ROOT, Manifest

MAX_KV_SPLITS = 8  # sglang/srt/arg_groups/fields/exec_.py: triton_attention_num_kv_splits


def _core_count(device_id: int = 0) -> int:
    """The device's SM count, as the backend passes it to ``get_num_kv_splits_triton`` (132 on an H200)."""
    import torch

    return int(torch.cuda.get_device_properties(device_id).multi_processor_count) if torch.cuda.is_available() else 132


# SGLang's platform probes these files make (is_hip, is_gfx*_supported, get_device_core_count) and
# sglang.srt.environ come with sglang_common.COMMON.
MODULES = ("sglang.kernels.ops.attention.decode_attention", "sglang.kernels.ops.attention.score_mod",
           "sglang.kernels.ops.attention.metadata")
MANIFEST = Manifest("attention", MODULES)
RUN_NOTES = (
    "per-step metadata (kv_indptr / kv_indices, get_num_kv_splits_triton) computed once outside the timed "
    "call, as SGLang computes it once per step for all layers",
    "Netra's slot-major KV pool viewed as SGLang's page-size-1 token buffers (each request's tokens contiguous)",
    "torch 2.11 / triton 3.6 on the H200 (SGLang 0.5.23 pins torch 2.14.1)",
)


class SglangDecodeAttention:
    """``decode_attention_fwd`` for one batch over one KV pool; buffers built once (graph-capturable calls).

    ``k_cache, v_cache [slots, context, Hkv, D]`` (E4M3), ``slots, seq_lens [B]`` (CUDA); call with
    ``q [B, q_heads, D]`` BF16 (and optionally ``out``) -> ``o [B, q_heads, D]`` BF16. ``use_pdl`` is SGLang's
    choice on sm90 (True); False only for Triton's interpreter, which has no PDL.
    """

    def __init__(self, k_cache: Any, v_cache: Any, slots: Any, seq_lens: Any, q_heads: int, sm_scale: float,
                 root: Path | str = DEFAULT_ROOT, max_kv_splits: int = MAX_KV_SPLITS, use_pdl: bool = True) -> None:
        import importlib

        import torch

        from netra.bench.peers import sglang_loader

        sglang_loader.install(Path(root), peers=(__name__,))  # no-op when a run installed the peers already
        self.da = importlib.import_module("sglang.kernels.ops.attention.decode_attention")
        meta = importlib.import_module("sglang.kernels.ops.attention.metadata")
        dev = k_cache.device
        ctx, hkv, d = k_cache.shape[1], k_cache.shape[2], k_cache.shape[3]
        self.k_buf, self.v_buf = k_cache.view(-1, hkv, d), v_cache.view(-1, hkv, d)
        lens = seq_lens.to(torch.int64)
        b = lens.numel()
        # the backend's per-step metadata: token indices of each request, then its split counts
        self.kv_indptr = torch.zeros(b + 1, dtype=torch.int32, device=dev)
        self.kv_indptr[1:] = torch.cumsum(lens, 0).to(torch.int32)
        first = torch.repeat_interleave(self.kv_indptr[:-1].long(), lens)
        self.kv_indices = (slots.to(torch.int64) * ctx).repeat_interleave(lens) \
            + torch.arange(int(lens.sum()), device=dev) - first
        self.max_kv_splits, self.sm_scale, self.use_pdl = max_kv_splits, sm_scale, use_pdl
        self.num_kv_splits = torch.empty(b, dtype=torch.int32, device=dev)
        self.uneven = torch.zeros(1, dtype=torch.int32, device=dev)
        self.attn_logits = torch.empty((b, q_heads, max_kv_splits, d), dtype=torch.float32, device=dev)
        self.attn_lse = torch.empty((b, q_heads, max_kv_splits), dtype=torch.float32, device=dev)
        meta.get_num_kv_splits_triton[(1,)](
            self.num_kv_splits, lens, b, 1, q_heads, hkv, max_kv_splits, _core_count(dev.index or 0),
            MAX_NUM_SEQ=256 if b < 256 else 1 << (b - 1).bit_length(), uneven_batch_ptr=self.uneven)

    def __call__(self, q: Any, out: Any = None) -> Any:
        import torch

        o = out if out is not None else torch.empty_like(q)
        self.da.decode_attention_fwd(q, self.k_buf, self.v_buf, o, self.kv_indptr, self.kv_indices,
                                     self.attn_logits, self.attn_lse, self.num_kv_splits, self.max_kv_splits,
                                     self.sm_scale, 1.0, 1.0, use_pdl=self.use_pdl, uneven_batch=self.uneven)
        return o
