"""Op modules: one per op family, each with ``<op>_ref`` (the plain-PyTorch oracle), the dispatching
entry point, its fallback, and ``explain_signatures()`` for `netra explain`.

`OPS` is the list of op modules (op name -> module). Tactics themselves are registered only by
their contract files (netra/catalog.py); this list exists so `netra explain` can show ops whose
every call is on the fallback (no contract at all) too. Adding an op family adds one line here.
"""

from __future__ import annotations

OPS: dict[str, str] = {
    "argmax": "netra.ops.argmax",
}
