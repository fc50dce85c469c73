"""Model management behind the admin-only internal routes: list, load and unload models (and
LoRAs where the host has them). Standalone mode loads GGUF files from one folder; extension
mode asks the web UI's own loader.

A manager's load and unload run on the generation thread while nothing generates. They either
return the host to serve next or raise ModelChangeFailed, which names the host that serves now
(the previous model again, or NoModel): a failed change never leaves the server without a
well-defined host."""

from __future__ import annotations

import logging
import re
import threading
from pathlib import Path
from typing import Any, Callable, NoReturn, Protocol

from ..core.config import Settings
from ..core.errors import (
    InvalidRequestError,
    NotFoundError,
    ServerError,
    ServiceUnavailableError,
)
from .base import ChatPrompt, Host, HostAbilities, Pieces, Prompt
from .request import NO_CHAT_OPTIONS, ChatOptions, GenerationSettings

log = logging.getLogger(__name__)

Names = list[str]   # in the classes below, "list" is their method, not the type

# The web UI applies LoRAs with PEFT on Transformers models (and, in releases that still have it,
# with ExLlamaV2's own LoRA support); its other loaders, llama.cpp among them, fail.
LORA_LOADERS = ("Transformers", "ExLlamav2", "ExLlamav2_HF")

# An absolute path in an error message (POSIX or Windows): only its last part is kept, so the
# folder layout of the server's machine is not told to clients.
_ABSOLUTE_PATH = re.compile(r"(?:\b[A-Za-z]:)?[\\/](?:[^\s'\"\\/:]+[\\/])+([^\s'\"\\/:]+)")


def without_paths(text: str) -> str:
    return _ABSOLUTE_PATH.sub(r"\1", text)


def _reason(exc: BaseException) -> str:
    detail = without_paths(str(exc)).strip()[:300]
    return f"{type(exc).__name__}: {detail}" if detail else type(exc).__name__


class ModelChangeFailed(ServerError):
    """A load that failed. ``serving`` is the host that serves now; the route swaps it in."""

    def __init__(self, message: str, *, serving: Host):
        super().__init__(message, code="model_load_failed", retry=False)
        self.serving = serving


class NoModel(Host):
    """What serves while no model is loaded (after an unload or a failed load, and during a
    change): every generation answers 503 until a model is loaded."""
    model_id = "None"
    abilities = HostAbilities(samplers=frozenset())

    def __init__(self, loader: str | None = "llama.cpp", *,
                 message: str = "No model is loaded. Load one with POST /v1/internal/model/load.",
                 code: str = "model_not_loaded"):
        self.loader = loader
        self.message = message
        self.code = code

    @property
    def loaded(self) -> bool:
        return False

    def _refuse(self, *_: Any, **__: Any) -> NoReturn:
        raise ServiceUnavailableError(self.message, code=self.code)

    context_length = tokenize = detokenize = _refuse

    def chat_prompt(self, messages: list[dict[str, Any]], options: ChatOptions = NO_CHAT_OPTIONS) -> ChatPrompt:
        self._refuse()

    def generate(self, prompt: Prompt, settings: GenerationSettings, stop_event: threading.Event) -> Pieces:
        self._refuse()

    def describe(self) -> dict[str, Any]:
        # The keys a loaded model has, as the web UI answers after an unload: it keeps its loader.
        return {"model_name": "None", "lora_names": [], "loader": self.loader, "file": None}


class ModelManager(Protocol):
    """What the admin routes need of model management (StandaloneModels, TextgenModels)."""

    def list(self) -> list[str]: ...

    def load(self, name: str, args: dict[str, Any] | None, current: Host) -> Host: ...

    def unload(self, current: Host) -> Host: ...

    def loras(self) -> Names: ...

    def load_loras(self, names: Names) -> None: ...

    def unload_loras(self) -> None: ...


def _is_plain_name(name: str) -> bool:
    """No absolute path, drive, '.' or '..' part, empty part or NUL: whatever list it came from,
    such a name could point outside the folder."""
    if not name or "\0" in name or re.match(r"^[A-Za-z]:", name):
        return False
    return all(part not in ("", ".", "..") for part in re.split(r"[\\/]", name))


def _checked_name(name: str, choices: list[str], *, param: str = "model_name", kind: str = "model") -> str:
    """A name from the list. Names may hold subfolders (the web UI lists 'folder/model.gguf'),
    but only exactly as listed, and never a path that could leave the folder."""
    route = f"/v1/internal/{'lora' if kind == 'LoRA' else 'model'}/list"
    if not _is_plain_name(name):
        raise InvalidRequestError(f"Invalid {kind} name {name!r}: give a name from {route}, not a path.",
                                  param=param)
    candidates = (name, f"{name}.gguf") if kind == "model" else (name,)
    for candidate in candidates:
        if candidate in choices:
            return candidate
    shown = ", ".join(choices[:20]) + (f" and {len(choices) - 20} more" if len(choices) > 20 else "")
    raise NotFoundError(f"There is no {kind} named {name!r}. Available: {shown or 'none'} (see {route}).",
                        param=param, code=f"{kind.lower()}_not_found")


def _close(host: Host) -> None:
    try:
        host.close()
    except Exception:  # noqa: BLE001 - the model is dropped either way
        log.exception("Closing %s failed", host.model_id)


class StandaloneModels:
    """GGUF files in the models_dir setting, plus the embedded default model.

    Symbolic links in the folder are followed, as the web UI follows them: linking a file in is
    how a model kept elsewhere is offered. Only the folder's own entries are listed, and names are
    never paths, so what may load is what the folder's owner put there.

    A load closes the model served before building the next one, so two models never share the
    machine's memory. When the new one fails to load, the previous one is loaded again; if that
    fails too, no model is loaded (generations answer 503) until a load succeeds."""

    def __init__(self, settings: Settings, make_host: Callable[[Path], Host], extra: dict[str, Path] | None = None):
        self.folder = Path(settings.models_dir).expanduser() if settings.models_dir else None
        self.make_host = make_host
        self.extra = dict(extra or {})

    def _files(self) -> dict[str, Path]:
        files = dict(self.extra)
        if self.folder and self.folder.is_dir():
            for path in sorted(self.folder.glob("*.gguf")):
                # follows links (a dangling one is left out); a vision projector is no model
                if path.is_file() and "mmproj" not in path.name.lower():
                    files[path.name] = path
        return files

    def list(self) -> list[str]:
        return sorted(self._files())

    def load(self, name: str, args: dict[str, Any] | None, current: Host) -> Host:
        """The new host. The caller swaps it in; ``current`` is closed here."""
        files = self._files()
        path = files[_checked_name(name, list(files))]
        if args:
            raise InvalidRequestError("Standalone mode takes no loader args; set n_ctx, n_threads and n_gpu_layers "
                                      "in the settings.", param="args")
        previous = getattr(current, "path", None), current.model_id
        _close(current)
        try:
            return self.make_host(path)
        except Exception as e:  # noqa: BLE001 - whatever the loader raised, something must serve next
            reason = _reason(e)
        serving, now = self._restore(*previous)
        raise ModelChangeFailed(f"{path.name} could not be loaded ({reason}). {now}", serving=serving)

    def _restore(self, path: Path | None, model_id: str) -> tuple[Host, str]:
        if path is None:
            return NoModel(), "No model is loaded now."
        try:
            host = self.make_host(path)
        except Exception as e:  # noqa: BLE001
            log.error("Reloading %s after a failed load failed: %s", path.name, _reason(e))
            return NoModel(), (f"{model_id} could not be loaded again either: no model is loaded now. Load one "
                               "with POST /v1/internal/model/load.")
        host.model_id = model_id   # the name it was served under (an alias, maybe)
        return host, f"{model_id} is served again."

    def unload(self, current: Host) -> Host:
        _close(current)
        return NoModel()

    # Standalone mode has no LoRAs: the list is empty, so it is the true answer, not an error.
    def loras(self) -> Names:
        return []

    def load_loras(self, names: Names) -> None:
        if names:
            raise NotFoundError(f"There is no LoRA named {names[0]!r}: standalone mode serves none (LoRAs are "
                                "loaded by the web UI host, in extension mode).", param="lora_names",
                                code="lora_not_found")

    def unload_loras(self) -> None:
        pass


class TextgenModels:
    """The web UI's own model and LoRA loaders (modules.models, modules.utils, modules.LoRA).

    The web UI unloads the model before it loads the next one, and so does this; a failed load
    leaves no model loaded, as in the web UI."""

    # Loader flags a request may never set, whatever the host allows.
    BLOCKED_ARGS = frozenset({"extra_flags", "trust_remote_code"})

    def __init__(self, modules: Any):
        self.m = modules

    def list(self) -> list[str]:
        return [m for m in self.m.utils.get_available_models() if m != "None"]

    def loader_settings(self) -> frozenset[str]:
        """What args may set: the loader settings the web UI's Model tab offers, no more. Paths
        (model_dir), network and security flags are not among them."""
        return frozenset(self.m.loaders.list_model_elements()) - self.BLOCKED_ARGS

    def load(self, name: str, args: dict[str, Any] | None, current: Host) -> Host:
        """The web UI loads it, as its own Model tab would; the same host object then serves it."""
        name = _checked_name(name, self.list())
        shared = self.m.shared
        allowed = self.loader_settings()
        for key in args or {}:   # all checked before anything changes
            if key not in allowed or not hasattr(shared.args, key):
                raise InvalidRequestError(f"args.{key} is not a loader setting that may be changed here. Loader "
                                          f"settings: {', '.join(sorted(allowed))}.", param=f"args.{key}")
        self.m.models.unload_model()
        try:
            self._apply_settings(name, args, allowed)
            model, tokenizer = self.m.models.load_model(name)
        except Exception as e:  # noqa: BLE001 - the host's loaders raise anything
            self._forget(name)
            raise ModelChangeFailed(f"The web UI could not load {name} ({_reason(e)}). No model is loaded now.",
                                    serving=current) from None
        if model is None:
            # The host's loaders log the cause and return (None, None).
            self._forget(name)
            raise ModelChangeFailed(f"The web UI could not load {name}; its log says why. No model is loaded now.",
                                    serving=current)
        shared.model, shared.tokenizer = model, tokenizer
        return current

    def _apply_settings(self, name: str, args: dict[str, Any] | None, allowed: frozenset[str]) -> None:
        """Starts from the startup values, so that args of an earlier load do not leak into this one;
        then the model's own settings (its metadata and the web UI's per-model settings); then args."""
        shared = self.m.shared
        original = getattr(shared, "original_args", None)
        for key in allowed | self.BLOCKED_ARGS:
            if original is not None and hasattr(original, key) and hasattr(shared.args, key):
                setattr(shared.args, key, getattr(original, key))
        self.m.models_settings.update_model_parameters(self.m.models_settings.get_model_metadata(name))
        for key, value in (args or {}).items():
            setattr(shared.args, key, value)

    def _forget(self, name: str) -> None:
        """After a failed load: the host's load_model set model_name before it failed. A name with no
        model would look loaded to the web UI's idle-timeout reload, which would try it again."""
        shared = self.m.shared
        shared.model = shared.tokenizer = None
        if shared.model_name == name:
            shared.model_name = "None"

    def unload(self, current: Host) -> Host:
        self.m.models.unload_model()
        return current

    def loras(self) -> Names:
        return [name for name in self.m.utils.get_available_loras() if name != "None"]

    def _check_lora_support(self) -> None:
        shared = self.m.shared
        if shared.model is None or str(shared.model_name) in ("", "None"):
            raise InvalidRequestError("No model is loaded, so no LoRA can be applied: load a model first "
                                      "(POST /v1/internal/model/load).", param="lora_names", code="model_not_loaded")
        loader = getattr(shared.args, "loader", None)
        if loader not in LORA_LOADERS:
            raise InvalidRequestError(
                f"The web UI cannot apply LoRAs to a model loaded with its {loader} loader; it applies them with "
                f"{' or '.join(LORA_LOADERS)}. Load the model with one of those (args.loader), or use a model "
                "with the LoRA merged in.", param="lora_names", code="lora_not_supported")

    def _apply_loras(self, names: Names) -> None:
        try:
            self.m.LoRA.add_lora_to_model(names)
        except Exception as e:  # noqa: BLE001 - the host's LoRA code raises anything
            raise InvalidRequestError(f"The web UI could not apply the LoRA(s): {_reason(e)}.",
                                      param="lora_names", code="lora_failed") from None

    def load_loras(self, names: Names) -> None:
        available = self.loras()
        for name in names:
            _checked_name(name, available, param="lora_names", kind="LoRA")
        if not names:
            return self.unload_loras()
        self._check_lora_support()
        self._apply_loras(list(names))

    def unload_loras(self) -> None:
        # Nothing applied, nothing to undo (and no loader needs to support LoRAs for that).
        if getattr(self.m.shared, "lora_names", None):
            self._apply_loras([])

