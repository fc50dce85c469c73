"""One Settings object, read from layers.

Precedence, highest first: command-line flag > environment variable (``OPENEDAI_*``) >
host settings (the web UI's settings for this extension) > ``settings.json`` > default.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Mapping

from pydantic import Field, ValidationError
from pydantic_settings import BaseSettings, EnvSettingsSource, SettingsConfigDict

log = logging.getLogger(__name__)

SETTINGS_FILE = Path(__file__).resolve().parent.parent / "settings.json"


class Settings(BaseSettings):
    """Every knob of the server. Each field ``x`` is also read from ``OPENEDAI_X``."""

    model_config = SettingsConfigDict(env_prefix="OPENEDAI_", extra="ignore")

    port: int = Field(5001, ge=0, le=65535, description="TCP port of the API (0 picks a free one).")
    listen: bool = Field(False, description="Listen beyond localhost (on listen_host).")
    listen_host: str = Field("0.0.0.0", description="Address bound when listen is on.")
    api_key: str = Field("", description="When set, requests need 'Authorization: Bearer <key>'.")
    model: str | None = Field(None, description="Standalone: path of a GGUF file. Empty: the embedded SmolLM2.")
    model_alias: str | None = Field(None, description="Model id to report instead of the file name.")
    n_ctx: int = Field(0, ge=0, description="Standalone: context length; 0 uses the model's own.")
    n_threads: int | None = Field(None, ge=1, description="Standalone: decode threads (default: llama.cpp's).")
    n_gpu_layers: int = Field(0, description="Standalone: layers offloaded to a GPU, if llama.cpp was built for one.")
    truncate_prompt: bool = Field(False, description="Cut prompts that do not fit the context instead of answering 400.")
    max_queue: int = Field(64, ge=1, description="Generations allowed to wait; more get 429.")
    max_n: int = Field(8, ge=1, description="Largest n (choices per request).")
    debug: bool = Field(False, description="Log requests in detail (never keys).")

    @classmethod
    def settings_customise_sources(cls, settings_cls, init_settings, env_settings, dotenv_settings,
                                   file_secret_settings):
        # load_settings() merges the layers itself, so the precedence lives in one readable place.
        return (init_settings,)


def read_settings_file(path: Path | str | None = None) -> dict[str, Any]:
    path = Path(path) if path else SETTINGS_FILE
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise SystemExit(f"{path} is not valid JSON ({e}); fix it or remove it.") from None
    if not isinstance(data, dict):
        raise SystemExit(f"{path} must hold a JSON object of settings.")
    return data


def load_settings(cli: Mapping[str, Any] | None = None, host: Mapping[str, Any] | None = None,
                  file: Path | str | None = None) -> Settings:
    layers: dict[str, Any] = {}
    layers.update(read_settings_file(file))
    layers.update(host or {})
    layers.update(EnvSettingsSource(Settings)())
    layers.update({k: v for k, v in (cli or {}).items() if v is not None})
    known = {k: v for k, v in layers.items() if k in Settings.model_fields}
    unknown = sorted(set(layers) - set(known))
    if unknown:
        log.debug("ignoring settings this server does not know: %s", ", ".join(unknown))
    try:
        return Settings(**known)
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors())
        raise SystemExit(f"Invalid settings: {problems}") from None
