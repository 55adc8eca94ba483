"""Drafters without trained weights: the replay oracle and forced acceptance.

`OracleDrafter` replays a recorded output (the non-speculative greedy output of each request, by request id)
and injects an error at a scheduled position: at a request's k-th verify the schedule says how many drafts
``a`` it accepts; the oracle proposes the recording's next T - 1 tokens with the one at index ``a`` replaced
by a different token (none replaced when ``a >= T - 1``). Under greedy acceptance the realised count is then
exactly the schedule (the target's argmax is the recording wherever the prefix is), so tests sweep every
rejection position, full acceptance, and cuts by EOS or max_tokens inside a block, and the output must equal
the recording. It reads the host's view of each request (output length, verify count): a test drafter, not a
capturable one.

`ForcedAcceptance` (honest cost curves without trained weights): the step runs the real draft and verify
networks, then commits a count decided by a seeded schedule instead of the acceptance rule — the accepted
drafts then the target's greedy token after them. The output is not the target's; the cost of a step at a
given acceptance length is. Random weights route experts about uniformly, real models do not.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch

from netra.engine.cache import PAD_SLOT

if TYPE_CHECKING:
    from netra.engine.request import Request

# (request id, verify index of that request, 0-based) -> drafts the verify accepts (>= T - 1: all of them)
Schedule = Callable[[str, int], int]


def _mix(*values: int) -> int:
    """A 64-bit hash of integers (splitmix64 steps): the schedules' counter-based randomness."""
    h = 0x9E3779B97F4A7C15
    for v in values:
        h = (h ^ (v & 0xFFFFFFFFFFFFFFFF)) * 0xBF58476D1CE4E5B9 & 0xFFFFFFFFFFFFFFFF
        h ^= h >> 31
        h = h * 0x94D049BB133111EB & 0xFFFFFFFFFFFFFFFF
        h ^= h >> 29
    return h


def seeded_schedule(seed: int, accept: Sequence[int]) -> Schedule:
    """Each verify of each request accepts ``accept[h % len(accept)]`` drafts, ``h`` a hash of (seed, request
    id, verify index): a reproducible draw from ``accept``'s values (repeat a value to weight it)."""
    values = tuple(accept)

    def schedule(rid: str, k: int) -> int:
        return values[_mix(seed, int.from_bytes(rid.encode()[:16].ljust(16, b"\0"), "little"), k) % len(values)]

    return schedule


class OracleDrafter:
    """Replays ``recorded[rid]`` with an error after ``schedule(rid, k)`` correct drafts at the k-th verify."""

    capture_layers: tuple[int, ...] = ()

    def __init__(self, recorded: dict[str, list[int]], schedule: Schedule, vocab_size: int) -> None:
        self.recorded, self.schedule, self.vocab = recorded, schedule, vocab_size
        self.requests: dict[int, Request] = {}
        self.proposals: dict[str, list[list[int]]] = {}  # per request, the drafts of each verify (tests read them)

    def admit(self, slot: int, request: Request) -> None:
        self.requests[slot] = request

    def release(self, slot: int) -> None:
        self.requests.pop(slot, None)

    def extend(self, slots: torch.Tensor, features: torch.Tensor, counts: torch.Tensor) -> None:
        pass

    def propose(self, slots: torch.Tensor, pending: torch.Tensor, steps: int) -> torch.Tensor:
        rows = []
        for slot in slots.tolist():
            req = self.requests.get(slot) if slot != PAD_SLOT else None
            if req is None:
                rows.append([0] * (steps - 1))
                continue
            rec = self.recorded.get(req.rid, [])
            n = len(req.output)  # the pending token is output[n - 1]; the drafts continue at n
            drafts = [rec[n + i] if n + i < len(rec) else 0 for i in range(steps - 1)]
            k = len(self.proposals.setdefault(req.rid, []))
            a = self.schedule(req.rid, k)
            if a < steps - 1:
                drafts[a] = (drafts[a] + 1) % self.vocab
            self.proposals[req.rid].append(drafts)
            rows.append(drafts)
        return torch.tensor(rows, dtype=torch.int64, device=pending.device).view(len(rows), steps - 1)


class NullDrafter:
    """Proposes the pending token repeated and keeps no context: the draft network's cost left out (forced
    acceptance without a drafter network)."""

    capture_layers: tuple[int, ...] = ()

    def admit(self, slot: int, request: Request) -> None:
        pass

    def release(self, slot: int) -> None:
        pass

    def extend(self, slots: torch.Tensor, features: torch.Tensor, counts: torch.Tensor) -> None:
        pass

    def propose(self, slots: torch.Tensor, pending: torch.Tensor, steps: int) -> torch.Tensor:
        return pending[:, None].expand(pending.shape[0], steps - 1).contiguous()


class ForcedAcceptance:
    """The drafts each verify commits, by ``schedule`` (see the module docstring)."""

    def __init__(self, schedule: Schedule) -> None:
        self.schedule = schedule

    def accepts(self, reqs: Sequence[Request]) -> list[int]:
        """Drafts to accept for each request at its next verify (its ``spec_verify_ct`` is the verify index)."""
        return [self.schedule(r.rid, r.spec_verify_ct) for r in reqs]
