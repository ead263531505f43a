"""Phoenix Chat's inference engine: model files, tokenizer, backends, sampling, generation. No Qt here.

The public names load lazily (PEP 562): the GUI imports `engine.sampling` for its defaults at
start-up without paying for the loader, the backends and their dependencies.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from phoenix_chat.engine.errors import PhoenixError
    from phoenix_chat.engine.loader import LoadedModel, load
    from phoenix_chat.engine.sampling import SamplingParams

__all__ = ["load", "LoadedModel", "SamplingParams", "PhoenixError"]
_HOME = {"load": "loader", "LoadedModel": "loader", "SamplingParams": "sampling", "PhoenixError": "errors"}


def __getattr__(name: str) -> Any:
    if name in _HOME:
        return getattr(importlib.import_module(f".{_HOME[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
