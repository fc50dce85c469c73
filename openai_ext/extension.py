"""Extension mode: what script.setup() runs inside the web UI."""

from __future__ import annotations

import logging
from typing import Any, Mapping

from . import tunnel
from .app import create_app
from .config import load_settings
from .hosts.textgen import TextgenHost
from .model_manager import TextgenModels
from .server import ApiServer, PortInUse, announce

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


def start(params: Mapping[str, Any], modules: Any = None) -> ApiServer | None:
    host = TextgenHost(modules)
    settings = load_settings(host=host_settings(params, host.m.shared))
    try:
        server = ApiServer(create_app(settings, host, TextgenModels(host.m)), settings)
    except PortInUse as e:
        log.error("%s", e)
        return None
    server.start()
    announce(server)
    tunnel.start(settings, server.port, server.scheme)
    return server
