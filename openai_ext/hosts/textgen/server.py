"""The web UI's model server: its llama.cpp loader runs llama-server in a process of its own
(``shared.model.process``, a ``subprocess.Popen``) and talks to it over HTTP.

When that process dies (on a CPU whose llama.cpp AMX path is broken, the first prompt of more
than one token kills it with SIGSEGV; a build broken on the machine can die whatever the CPU
path, see llamacpp/probe.py), the web UI only logs a connection error and every reply
comes back empty until the model is loaded again. The API instead answers 503 naming what
happened and what to do, on every request until then.
"""

from __future__ import annotations

import contextlib
import signal
from typing import Any, Iterator

from ...core.errors import ServiceUnavailableError
from ..llamacpp.probe import has_amx, killed_by

CRASHES = {signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGABRT, signal.SIGFPE}


def exit_status(model: Any) -> int | None:
    """The model server's exit status once it has exited (negative: killed by that signal);
    None while it runs, or for a loader without a process of its own."""
    process = getattr(model, "process", None)
    poll = getattr(process, "poll", None)
    return poll() if callable(poll) else None


def _how(status: int) -> str:
    return f"exited with status {status}" if status >= 0 else f"was {killed_by(status)}"


def stopped_error(status: int, during: str = "") -> ServiceUnavailableError:
    advice = "Load the model again in the web UI (its console says why the server stopped)."
    if status < 0 and -status in CRASHES:
        amx = " (this one reports it)" if has_amx() else ""
        advice = ("It crashed: on a CPU with Intel AMX" + amx + ", llama.cpp's AMX path does that on the first "
                  "prompt; start the web UI with --extra-flags=--no-repack (or add no-repack to the model's extra "
                  "flags) and load the model again. Should it crash with no-repack too, that llama.cpp build fails "
                  "on this machine whatever its kernels (as one did loading a model's tokenizer): try another "
                  "model or another build of the web UI's llama.cpp. " + advice)
    return ServiceUnavailableError(f"The web UI's llama.cpp server (llama-server) {_how(status)}{during}, so "
                                   f"the model cannot answer. {advice}", code="model_server_stopped")


def check(model: Any, during: str = "") -> None:
    """A 503 when the model server has stopped."""
    status = exit_status(model)
    if status is not None:
        raise stopped_error(status, during)


@contextlib.contextmanager
def guarded(model: Any, during: str = "") -> Iterator[None]:
    """A call to the model server that fails because the server died becomes that 503."""
    try:
        yield
    except Exception as e:
        status = exit_status(model)
        if status is not None:
            raise stopped_error(status, during) from e
        raise
