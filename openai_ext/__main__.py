"""Standalone mode: python -m openai_ext (or python script.py) serves the API on llama.cpp."""

from __future__ import annotations

import argparse
import logging
import os
import sys

# Nothing here may reach a model hub; a user can still unset this to use hub names.
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m openai_ext", description=__doc__)
    p.add_argument("--model", help="path of a GGUF file (default: the embedded SmolLM2-135M-Instruct)")
    p.add_argument("--model-alias", help="model id to report instead of the file name")
    p.add_argument("--port", type=int, help="port to listen on (default 5001)")
    p.add_argument("--listen", action="store_true", default=None, help="listen beyond localhost")
    p.add_argument("--listen-host", help="address to bind when --listen is given (default 0.0.0.0)")
    p.add_argument("--api-key", help="require 'Authorization: Bearer KEY' on every request but health")
    p.add_argument("--n-ctx", type=int, help="context length (default: the model's own)")
    p.add_argument("--n-threads", type=int, help="decode threads (default: llama.cpp's choice)")
    p.add_argument("--n-gpu-layers", type=int, help="layers to offload to a GPU build of llama.cpp")
    p.add_argument("--truncate-prompt", action="store_true", default=None,
                   help="cut over-long prompts from the start instead of answering 400")
    p.add_argument("--max-queue", type=int, help="generations allowed to wait before 429 (default 64)")
    p.add_argument("--max-n", type=int, help="largest n per request (default 8)")
    p.add_argument("--settings", help="settings file (default: settings.json next to script.py)")
    p.add_argument("--debug", action="store_true", default=None, help="verbose logging (keys are never logged)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from .config import load_settings

    cli = {k: v for k, v in vars(args).items() if k != "settings"}
    settings = load_settings(cli=cli, file=args.settings)
    logging.basicConfig(level=logging.DEBUG if settings.debug else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    from .app import create_app
    from .hosts.llamacpp import LlamaCppHost
    from .model_files import default_gguf
    from .server import ApiServer, PortInUse, announce

    try:
        model_path = settings.model or default_gguf()
        host = LlamaCppHost(model_path, alias=settings.model_alias, n_ctx=settings.n_ctx,
                            n_threads=settings.n_threads, n_gpu_layers=settings.n_gpu_layers)
    except (FileNotFoundError, ValueError) as e:
        print(f"Cannot load the model: {e}", file=sys.stderr)
        return 1
    try:
        server = ApiServer(create_app(settings, host), settings)
    except PortInUse as e:
        print(e, file=sys.stderr)
        return 1
    announce(server)
    print(f"Serving {host.model_id} (context {host.context_length()} tokens)", file=sys.stderr, flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
