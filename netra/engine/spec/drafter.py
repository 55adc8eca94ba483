"""The drafter interface: what the speculative step asks of a draft model, and what it feeds it.

A drafter proposes the T - 1 tokens that follow each request's pending token (the token sampled but not yet
run through the target). It sees committed state only: the target's hidden states of every committed token
at its ``capture_layers`` (decoder-layer indices: the output of layer i, the residual stream after layer i's
MoE, Hugging Face's ``hidden_states[i + 1]``), handed over by `extend` as tokens are committed — the prompt's
by prefill, the accepted block rows by each verify, the decode rows of plain steps. Rows of a block past its
count (rejected drafts) are never context.

Everything indexed by slot (the request's slot in the engine's pools; `PAD_SLOT` rows are bucket padding and
have count 0), on the engine's device, with fixed shapes per batch: `extend` and `propose` must not read
device values on the host, so a step stays capturable per bucket. `admit` and `release` run on the host at
admission and when a request finishes or is aborted (its slot may be reused by the next request).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import torch

    from netra.engine.request import Request


class Drafter(Protocol):
    # Decoder layers whose outputs `extend` receives, concatenated in this order along the last dimension.
    capture_layers: tuple[int, ...]

    def admit(self, slot: int, request: Request) -> None:
        """A request takes ``slot``: its context starts empty (nothing of the slot's previous owner survives)."""
        ...

    def release(self, slot: int) -> None:
        """The request on ``slot`` finished or was aborted."""
        ...

    def extend(self, slots: torch.Tensor, features: torch.Tensor, counts: torch.Tensor) -> None:
        """Append committed tokens to the requests' contexts. ``slots [B]`` int64, ``features [B, L, F]`` (F =
        len(capture_layers) x hidden, the target's dtype): the hidden states of B blocks of L token rows, of
        which the first ``counts[b]`` (int64 ``[B]``, 0 ≤ counts ≤ L) are the next committed tokens of the
        request on ``slots[b]``, in order. The prompt comes in chunks as prefill runs them (one block each)."""
        ...

    def propose(self, slots: torch.Tensor, pending: torch.Tensor, steps: int) -> torch.Tensor:
        """Drafts ``[B, steps - 1]`` int64 on the device: the tokens proposed after each request's pending token
        ``pending [B]`` int64, from its committed context. Rows on the pad slot: any token ids in range."""
        ...
