"""Netra: serve hybrid mixture-of-experts LLMs from one GPU node.

Importable on any machine: nothing here touches a GPU, a driver or the network at import time.
"""

from __future__ import annotations

__version__ = "0.1.0"
