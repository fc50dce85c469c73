"""Extension mode: what script.setup() runs inside the web UI."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Mapping

from .app import create_app
from .core import tunnel
from .core.config import SettingsError, load_settings
from .core.server import ApiServer, PortInUse, announce, bind_all
from .hosts.manager import TextgenModels
from .hosts.textgen import TextgenHost

log = logging.getLogger(__name__)


def host_settings(params: Mapping[str, Any], shared: Any) -> dict[str, Any]:
    """The host's layer of settings: this extension's params (which the web UI has already
    overridden from its own settings file), plus the web UI's own --listen and --api-key."""
    layer = dict(params)
    args = getattr(shared, "args", None)
    if getattr(args, "listen", False):
        layer["listen"] = True
        if getattr(args, "listen_host", None):
            layer["listen_host"] = args.listen_host
    if not layer.get("api_key") and getattr(args, "api_key", ""):
        layer["api_key"] = args.api_key
    if not layer.get("admin_key") and getattr(args, "admin_key", ""):
        layer["admin_key"] = args.admin_key
    if getattr(args, "public_api", False):
        layer["public_api"] = True
        if getattr(args, "public_api_id", None):
            layer["public_api_id"] = args.public_api_id
    if getattr(args, "api_enable_ipv6", False):
        layer["ipv6"] = True
    return layer


def user_data(shared: Any) -> Path:
    """The web UI's user data folder (where it keeps models, characters, settings), relative to
    the folder it runs in unless it says otherwise."""
    args = getattr(shared, "args", None)
    return Path(getattr(shared, "user_data_dir", None) or getattr(args, "user_data_dir", None) or "user_data")


def start(params: Mapping[str, Any], modules: Any = None, name: str = "openai") -> ApiServer | None:
    """Starts the API on a daemon thread. A problem the user must fix (a bad setting, a taken
    port) is logged in one line and the API stays off: the web UI itself keeps running.
    ``name`` is the extension's folder name, the prefix of its entries in the web UI's settings."""
    host = TextgenHost(modules)
    try:
        settings = load_settings(host=host_settings(params, host.m.shared))
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
        log.error("The OpenAI-compatible API is not started. %s", _with_setting_names(e, name))
        return None
    server.start()
    announce(server)
    tunnel.start(settings, server.port, server.scheme)
    return server


def _with_setting_names(error: Exception, name: str) -> str:
    """The error, with where the setting is set inside the web UI."""
    if isinstance(error, PortInUse):
        return f"{error} In the web UI's settings.yaml the port is '{name}-port'."
    return (f"{error} Settings come from settings.json next to script.py, the web UI's settings.yaml "
            f"('{name}-<setting>: value') and OPENEDAI_* environment variables.")
