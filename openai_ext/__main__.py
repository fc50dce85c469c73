"""Standalone mode: python -m openai_ext (or python script.py) serves the API on llama.cpp.

Every setting has a flag: the setting ``max_queue`` is ``--max-queue``. Lists are given as JSON
or comma-separated (``--cors-origins '["http://localhost:3000"]'``, ``--mcp-allow localhost:8000``),
tables as JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import types
import typing


def _json(text: str) -> typing.Any:
    try:
        return json.loads(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not JSON; give a list as '[\"a\", \"b\"]' and a table "
                                         "as '{\"name\": \"value\"}'") from None


def _list(text: str) -> typing.Any:
    """A list flag: JSON, or plain comma-separated items (--mcp-allow localhost:8000,mcp.lan)."""
    if text.lstrip().startswith("["):
        return _json(text)
    return [item.strip() for item in text.split(",") if item.strip()]


def _flag_type(annotation: typing.Any):
    # Only an optional (X | None) is unwrapped: list[str]'s arguments are its items' type.
    kind = annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        kind = next(a for a in typing.get_args(annotation) if a is not type(None))
    if typing.get_origin(kind) is list:
        return _list
    if typing.get_origin(kind) is dict:
        return _json
    return kind if kind in (int, float, str) else str


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from .core.config import Settings

    p = argparse.ArgumentParser(prog="python -m openai_ext", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    for name, field in Settings.model_fields.items():
        flag = "--" + name.replace("_", "-")
        if field.annotation is bool:
            # --x turns a setting on, --no-x off; without either, the lower layers decide
            p.add_argument(flag, action=argparse.BooleanOptionalAction, default=None, help=field.description)
        elif typing.get_origin(field.annotation) is typing.Literal:
            p.add_argument(flag, choices=typing.get_args(field.annotation), default=None, help=field.description)
        else:
            p.add_argument(flag, type=_flag_type(field.annotation), default=None, help=field.description)
    p.add_argument("--settings", help="settings file (default: settings.json next to script.py)")
    return p.parse_args(argv)


def catalog(settings: typing.Any) -> list[typing.Any]:
    """The models a request may name: the models_dir folder's GGUF files (by name without .gguf)
    and the models setting (name -> path or hub reference, fetched now)."""
    from pathlib import Path

    from .hosts import hub
    from .text.lanes import Entry

    entries = []
    folder = Path(settings.models_dir).expanduser() if settings.models_dir else None
    if folder is not None and folder.is_dir():
        for path in sorted(folder.glob("*.gguf")):
            if path.is_file() and "mmproj" not in path.name.lower():
                entries.append(Entry(path.name.removesuffix(".gguf"), path, path.name, hub.projector_beside(path)))
    for name, source in settings.models.items():
        fetched = hub.resolve(source)
        entries.append(Entry(name, fetched.model, source, fetched.mmproj))
    return entries


def main(argv: list[str] | None = None) -> int:
    from .core.config import SettingsError

    try:
        return serve(parse_args(argv))
    except SettingsError as e:
        # Standalone, a setting to fix ends the process, in one line instead of a traceback.
        raise SystemExit(f"Cannot start: {e}") from None


def serve(args: argparse.Namespace) -> int:
    from .core.config import load_settings

    cli = {k: v for k, v in vars(args).items() if k != "settings"}
    settings = load_settings(cli=cli, file=args.settings)
    from .hosts import hub

    if not any(hub.is_reference(m) for m in [settings.model, settings.draft_model, *settings.models.values()]):
        # Nothing reaches a model hub unless a model is given as a hub reference (libraries that
        # look names up there, sentence-transformers among them, would otherwise retry for a minute).
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
    # INFO for every library; this server's own debug lines are turned on by create_app (debuglog)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # The MCP SDK's HTTP client logs every request's URL at INFO: a line per call, and a URL a
    # client chose (which may carry a token in its query) in the server's log.
    logging.getLogger("httpx2").setLevel(logging.WARNING)

    from .app import create_app
    from .core import tunnel
    from .core.server import ApiServer, PortInUse, announce, bind_all
    from .hosts.files import default_gguf
    from .hosts.llamacpp import LlamaCppHost
    from .hosts.llamacpp.probe import CannotRun
    from .hosts.manager import StandaloneModels
    from .text.lanes import Lanes

    def make_host(path, alias=None, mmproj=None, draft=None):
        return LlamaCppHost(path, alias=alias, n_ctx=settings.n_ctx, n_threads=settings.n_threads,
                            n_gpu_layers=settings.n_gpu_layers, parallel=settings.parallel, repack=settings.repack,
                            flash_attn=settings.flash_attn, mmproj=mmproj, speculation=settings.speculation,
                            draft_max=settings.draft_max, draft_model=draft, cache_type_v=settings.cache_type_v,
                            cache_ram_mb=settings.cache_ram_mb)

    try:
        sockets = bind_all(settings)   # first: a taken port is told before the model loads
    except PortInUse as e:
        print(e, file=sys.stderr)
        return 1
    if settings.upstream_url:
        from .hosts.upstream import UpstreamHost

        # No model here: every text request is generated by the upstream engine.
        host: typing.Any = UpstreamHost(settings.upstream_url, api_key=settings.upstream_api_key,
                                        model=settings.upstream_model or None, parallel=settings.upstream_parallel,
                                        connect_timeout=settings.upstream_connect_timeout,
                                        first_byte_timeout=settings.upstream_first_byte_timeout,
                                        idle_timeout=settings.upstream_idle_timeout, context=settings.n_ctx)
        manager = None
    else:
        try:
            entries = catalog(settings)   # hub references fetched first, with their progress
            chosen = hub.resolve(settings.model) if settings.model else hub.Fetched(default_gguf())
            # (the draft model drafts for the default model only: the catalog's may be of other families)
            draft = hub.resolve(settings.draft_model).model if settings.draft_model else None
            host = make_host(chosen.model, settings.model_alias, settings.mmproj or chosen.mmproj, draft)
        except (FileNotFoundError, ValueError, CannotRun) as e:
            for sock in sockets:
                sock.close()
            print(f"Cannot load the model: {e}", file=sys.stderr)
            return 1
        # the models_dir folder, plus the model served now and the embedded default
        known = {host.path.name: host.path}
        with contextlib.suppress(FileNotFoundError):
            known.setdefault(default_gguf().name, default_gguf())
        # (a model loaded by name takes the projector beside it, as the catalog's do)
        manager = StandaloneModels(settings, lambda path: make_host(path, None, hub.projector_beside(path)),
                                   extra=known)
    server = ApiServer(create_app(settings, host, manager), settings, sockets)
    if manager is not None:
        text = server.app.state.api.text
        text.lanes = Lanes(settings, text, entries, lambda entry: make_host(entry.path, entry.id, entry.mmproj))
    announce(server)
    where = f" through {host.shown}" if settings.upstream_url else ""
    print(f"Serving {host.model_id}{where} (context {host.context_length()} tokens, up to {host.parallel} "
          "requests at once)",
          file=sys.stderr, flush=True)
    tunnel.start(settings, server.port, server.scheme)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        # uvicorn has shut down cleanly (streams ended, requests given their grace) and re-raises
        # the Ctrl-C it caught: the usual exit status of an interrupted program, without a traceback
        return 130
    finally:
        server.app.state.api.host.close()   # the model served last (model management may have swapped it)
    return 0


if __name__ == "__main__":
    sys.exit(main())
