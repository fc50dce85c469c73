"""What the routes share, kept on ``app.state.api`` rather than in module globals."""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from typing import Any

import anyio

from .config import Settings
from .generation import GenerationQueue
from .hosts.base import Host


@dataclass
class ApiState:
    settings: Settings
    host: Host
    manager: Any = None      # model management (model_manager.StandaloneModels / TextgenModels)
    queue: GenerationQueue = field(init=False)
    started: int = field(default_factory=lambda: int(time.time()))
    engines: dict[str, Any] = field(default_factory=dict)   # lazily loaded engines, by family
    limiters: dict[str, anyio.CapacityLimiter] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.queue = GenerationQueue(self.settings.max_queue)

    def limiter(self, key: str, tokens: int = 1) -> anyio.CapacityLimiter:
        """A capacity limiter kept here by name, made on first use (inside the event loop)."""
        limiter = self.limiters.get(key)
        if limiter is None:
            limiter = self.limiters.setdefault(key, anyio.CapacityLimiter(tokens))
        return limiter

    @property
    def fingerprint(self) -> str:
        """Changes when the model or its backend changes, as OpenAI's system_fingerprint does,
        so clients can tell when the same seed may give different text."""
        basis = f"{self.host.model_id}|{type(self.host).__name__}|{self.host.context_length()}"
        return "fp_" + hashlib.sha256(basis.encode()).hexdigest()[:10]
