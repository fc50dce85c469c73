"""Extension mode: what script.setup() runs inside the web UI."""

from __future__ import annotations

import importlib
import logging
import sys
import threading
from pathlib import Path
from typing import Any, Mapping

from .app import create_app
from .core import debuglog, tunnel
from .core.config import SettingsError, load_settings
from .core.server import ApiServer, PortInUse, announce, bind_all
from .hosts.manager import TextgenModels
from .hosts.textgen import TextgenHost

PACKAGE = __name__.split(".")[0]
log = logging.getLogger(__name__)

# Names the web UI takes for itself: `--extensions openai` (and 'openai' in its settings'
# default_extensions) turns on its built-in API instead of loading a folder of that name
# (server.py), so an extension in such a folder is never loaded.
RESERVED_NAMES = ("openai",)
NOT_STARTED = "The OpenAI-compatible API is not started."


def host_settings(params: Mapping[str, Any], shared: Any) -> dict[str, Any]:
    """The host's layer of settings: this extension's params (which the web UI has already
    overridden from its own settings file), plus the web UI's own --listen and --api-key.

    Not its --public-api: that flag starts the web UI's built-in API (port 5000) with a tunnel
    of its own, and taking it here too would open a second tunnel for the one flag. This API's
    tunnel is its own public_api setting."""
    layer = dict(params)
    args: Any = getattr(shared, "args", None)
    if getattr(args, "listen", False):
        layer["listen"] = True
        if getattr(args, "listen_host", None):
            layer["listen_host"] = args.listen_host
    if not layer.get("api_key") and getattr(args, "api_key", None):
        layer["api_key"] = args.api_key
    if not layer.get("admin_key") and getattr(args, "admin_key", None):
        layer["admin_key"] = args.admin_key
    if getattr(args, "api_enable_ipv6", False):
        layer["ipv6"] = True
    return layer


def user_data(shared: Any) -> Path:
    """The web UI's user data folder (where it keeps models, characters, settings), relative to
    the folder it runs in unless it says otherwise."""
    args = getattr(shared, "args", None)
    return Path(getattr(shared, "user_data_dir", None) or getattr(args, "user_data_dir", None) or "user_data")


def start(params: Mapping[str, Any], modules: Any = None, name: str = "openai_ext") -> ApiServer | None:
    """Starts the API on a daemon thread. A problem the user must fix (a bad setting, a taken
    port) is told in one line in the web UI's console and the API stays off: the web UI itself
    keeps running. ``name`` is the extension's folder name, the prefix of its entries in the
    web UI's settings."""
    route_logs()
    if name in RESERVED_NAMES:
        log.warning("This extension is loaded as '%s', a name the web UI reserves for its built-in API (--extensions "
                    "%s turns that API on instead of loading this folder). Rename the folder, e.g. to openai_ext, "
                    "and its settings to 'openai_ext-<setting>'.", name, name)
    host = TextgenHost(modules)
    try:
        settings = load_settings(host=host_settings(params, host.m.shared))
        route_logs(debug=settings.debug)
        if not settings.data_dir:
            settings = settings.model_copy(update={"data_dir": str(user_data(host.m.shared) / "openai_ext")})
        sockets = bind_all(settings)
        try:
            server = ApiServer(create_app(settings, host, TextgenModels(host.m)), settings, sockets)
        except BaseException:
            for sock in sockets:   # the web UI runs on: a port left bound would stay taken
                sock.close()
            raise
    except (SettingsError, PortInUse) as e:
        log.error("%s %s", NOT_STARTED, _with_setting_names(e, name))
        return None
    except OSError as e:   # binding an address this machine does not have, say
        log.error("%s It cannot listen on %s: %s. In the web UI's settings.yaml the address is '%s-listen_host' "
                  "(or the web UI's --listen-host) and the port '%s-port'.", NOT_STARTED,
                  _addresses(params, host.m.shared), e.strerror or e, name, name)
        return None
    server.start()
    announce(server)
    tunnel.start(settings, server.port, server.scheme)
    _stop_with_the_web_ui(server, host.m.shared)
    return server


def _addresses(params: Mapping[str, Any], shared: Any) -> str:
    try:
        settings = load_settings(host=host_settings(params, shared))
    except SettingsError:
        return "the configured address"
    return f"{settings.listen_host if settings.listen else '127.0.0.1'} port {settings.port}"


def _with_setting_names(error: Exception, name: str) -> str:
    """The error, with where the setting is set inside the web UI."""
    if isinstance(error, PortInUse):
        return f"{error} In the web UI's settings.yaml the port is '{name}-port'."
    text = str(error).rstrip()
    return (f"{text}{'' if text.endswith('.') else '.'} Settings come from settings.json next to script.py, "
            f"the web UI's settings.yaml ('{name}-<setting>: value') and OPENEDAI_* environment variables.")


# --- the web UI's console -----------------------------------------------------------------------

class _ToHost(logging.Handler):
    """Hands this package's records to the handlers of the web UI's own logger (its console).
    Only to them: the record goes on to the root logger by its own propagation, once."""

    def __init__(self, target: logging.Logger):
        super().__init__()
        self.target = target

    def emit(self, record: logging.LogRecord) -> None:
        if not self.target.isEnabledFor(record.levelno):
            return
        for handler in self.target.handlers:
            if record.levelno >= handler.level:
                handler.handle(record)


class _ToStderr(logging.StreamHandler):
    def __init__(self) -> None:
        super().__init__(sys.stderr)
        self.setFormatter(logging.Formatter("%(levelname)s [%(name)s] %(message)s"))


def route_logs(debug: bool = False) -> None:
    """Makes this package's records visible in the web UI's console.

    The web UI sends the root logger to a NullHandler at level ERROR (modules/logging_colors.py),
    so a record left to reach the root is printed nowhere. They go to the web UI's own logger
    when there is one, else to stderr (unless something already prints them there)."""
    pkg = logging.getLogger(PACKAGE)
    for handler in [h for h in pkg.handlers if isinstance(h, (_ToHost, _ToStderr))]:
        pkg.removeHandler(handler)
    debuglog.configure(debug, streams=False)   # the levels; create_app sets them again from the settings
    target = _host_logger()
    if target is not None:
        pkg.addHandler(_ToHost(target))
    elif not _printed_to_console(pkg):
        pkg.addHandler(_ToStderr())


def _host_logger() -> logging.Logger | None:
    try:
        return getattr(importlib.import_module("modules.logging_colors"), "logger", None)
    except ImportError:
        return None


def _printed_to_console(logger: logging.Logger) -> bool:
    """Whether a handler above ``logger`` already writes its records to the console."""
    current: logging.Logger | None = logger.parent if logger.propagate else None
    while current is not None:
        for handler in current.handlers:
            if isinstance(handler, logging.StreamHandler) and getattr(handler, "stream", None) in (
                    sys.stderr, sys.stdout, sys.__stderr__, sys.__stdout__):
                return True
        current = current.parent if current.propagate else None
    return False


# --- stopping with the web UI -------------------------------------------------------------------

def _stop_with_the_web_ui(server: ApiServer, shared: Any) -> None:
    """Ties the API's life to the web UI's.

    With --nowebui and without its own --api, the web UI's main returns right after loading
    extensions (server.py); the server's daemon thread would die with the interpreter a moment
    later. The hook below runs then, in the main thread, before the interpreter joins its
    threads: it serves until the web UI is stopped (its Ctrl+C / SIGTERM handler raises
    SystemExit there), then stops the server cleanly. In every other case it only stops the
    server when the web UI exits (with --api the web UI's own API blocks its main, and its
    server's return is the web UI stopping). Stopping is as on SIGTERM: open streams end with an
    error event, other requests get the grace period."""
    args = getattr(shared, "args", None)
    alone = bool(getattr(args, "nowebui", False)) and not (
        getattr(args, "api", False) or getattr(args, "public_api", False))

    def at_exit() -> None:
        try:
            if alone:
                log.info("serving until the web UI is stopped (--nowebui)")
                while server.thread is not None and server.thread.is_alive():
                    server.thread.join(0.5)   # wakes for the web UI's signal handler
        except (KeyboardInterrupt, SystemExit):
            pass
        finally:
            if server.thread is not None and server.thread.is_alive():
                server.stop()
                log.info("The OpenAI-compatible API stopped.")

    register = getattr(threading, "_register_atexit", None)
    if register is not None:
        register(at_exit)
    elif alone:   # a Python without the hook: a thread that is not a daemon keeps the process up
        threading.Thread(target=lambda: server.thread.join() if server.thread else None,
                         name="openai-api-keepalive").start()
