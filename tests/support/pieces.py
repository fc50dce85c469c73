"""Watching a host's pieces in tests, whichever way the server reads them: ``Host.generate`` on
the generation thread, or ``Host.stream`` in the event loop (the embedded host)."""

from __future__ import annotations

import contextlib
from typing import Any, Callable


def hook_pieces(host: Any, monkeypatch: Any, *, start: Callable[[Any], None] | None = None,
                piece: Callable[[int, Any], None] | None = None, end: Callable[[], None] | None = None) -> None:
    """Calls ``start(prompt)`` when a generation begins, ``piece(i, piece)`` before each piece is
    handed on (it may raise, as a failing model would), and ``end()`` when the generation is over."""
    real_generate, real_stream = host.generate, host.stream

    def generate(prompt, settings, stop_event):
        if start:
            start(prompt)
        try:
            with contextlib.closing(real_generate(prompt, settings, stop_event)) as pieces:
                for i, p in enumerate(pieces):
                    if piece:
                        piece(i, p)
                    yield p
        finally:
            if end:
                end()

    def stream(prompt, settings, stop_event):
        inner = real_stream(prompt, settings, stop_event)
        if inner is None:
            return None

        async def pieces():
            if start:
                start(prompt)
            try:
                i = 0
                async for p in inner:
                    if piece:
                        piece(i, p)
                    i += 1
                    yield p
            finally:
                await inner.aclose()
                if end:
                    end()
        return pieces()

    monkeypatch.setattr(host, "generate", generate)
    monkeypatch.setattr(host, "stream", stream)
