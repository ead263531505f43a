"""What the routes share: the scheduler they submit to, the settings, and a few counters
(/health reports them; the tests read them to see a disconnect cancel its request)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .config import ServerConfig

if TYPE_CHECKING:
    from phoenix_chat.engine.scheduler import Scheduler


@dataclass
class Counters:
    requests: int = 0  # generation requests accepted by the engine
    busy: int = 0  # refused with 429: the queue was full
    cancelled_on_disconnect: int = 0  # a client left before its answer ended
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, name: str) -> None:
        with self._lock:
            setattr(self, name, getattr(self, name) + 1)

    def as_dict(self) -> dict[str, int]:
        return {"requests": self.requests, "busy": self.busy, "cancelled_on_disconnect": self.cancelled_on_disconnect}


@dataclass
class ServerState:
    scheduler: Scheduler
    config: ServerConfig
    counters: Counters = field(default_factory=Counters)

    @property
    def model_id(self) -> str:
        return self.config.model_id or self.scheduler.model.path.stem

    @property
    def context_length(self) -> int:
        return int(self.scheduler.model.backend.context_length)
