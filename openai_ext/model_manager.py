"""Model management behind the admin-only internal routes: list, load and unload models (and
LoRAs where the host has them). Standalone mode loads GGUF files from one folder; extension
mode asks the web UI's own loader."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Callable, Iterator

from .config import Settings
from .errors import InvalidRequestError, NotFoundError, ServiceUnavailableError
from .hosts.base import ChatPrompt, Host, Prompt
from .params import HostAbilities

log = logging.getLogger(__name__)


class NoModel(Host):
    """What serves after an unload: every generation answers 503 until a model is loaded."""
    model_id = "None"
    abilities = HostAbilities(samplers=frozenset())

    @property
    def loaded(self) -> bool:
        return False

    def _refuse(self, *_: Any, **__: Any):
        raise ServiceUnavailableError("No model is loaded. Load one with POST /v1/internal/model/load.",
                                      code="model_not_loaded")

    context_length = tokenize = detokenize = _refuse

    def chat_prompt(self, messages, settings) -> ChatPrompt:
        self._refuse()

    def generate(self, prompt: Prompt, settings, stop_event) -> Iterator:
        self._refuse()


def _checked_name(name: str, choices: list[str]) -> str:
    """A model name from the list, never a path: nothing may escape the models folder."""
    if not name or "/" in name or "\\" in name or name.startswith(".") or "\0" in name:
        raise InvalidRequestError(f"Invalid model name {name!r}: give a name from /v1/internal/model/list.",
                                  param="model_name")
    for candidate in (name, f"{name}.gguf"):
        if candidate in choices:
            return candidate
    raise NotFoundError(f"There is no model named {name!r}. Available: {', '.join(choices) or 'none'}.",
                        param="model_name", code="model_not_found")


class StandaloneModels:
    """GGUF files in the models_dir setting, plus the embedded default model."""

    def __init__(self, settings: Settings, make_host: Callable[[Path], Host], extra: dict[str, Path] | None = None):
        self.folder = Path(settings.models_dir).expanduser() if settings.models_dir else None
        self.make_host = make_host
        self.extra = dict(extra or {})

    def _files(self) -> dict[str, Path]:
        files = dict(self.extra)
        if self.folder and self.folder.is_dir():
            for path in sorted(self.folder.glob("*.gguf")):
                if path.is_file():
                    files[path.name] = path
        return files

    def list(self) -> list[str]:
        return sorted(self._files())

    def load(self, name: str, args: dict[str, Any] | None, current: Host) -> Host:
        """The new host; the caller swaps it in and closes the old one."""
        files = self._files()
        path = files[_checked_name(name, list(files))]
        if args:
            raise InvalidRequestError("Standalone mode takes no loader args; set n_ctx, n_threads and n_gpu_layers "
                                      "in the settings.", param="args")
        try:
            return self.make_host(path)
        except (ValueError, OSError) as e:
            raise InvalidRequestError(f"{path.name} could not be loaded: {e}", param="model_name") from None

    def unload(self, current: Host) -> Host:
        return NoModel()

    # Standalone mode has no LoRAs: the list is empty, so it is the true answer, not an error.
    def loras(self) -> list[str]:
        return []

    def load_loras(self, names: list[str]) -> None:
        if names:
            raise NotFoundError(f"There is no LoRA named {names[0]!r}: standalone mode serves none (LoRAs are "
                                "loaded by the web UI host, in extension mode).", param="lora_names",
                                code="lora_not_found")

    def unload_loras(self) -> None:
        pass


class TextgenModels:
    """The web UI's own model and LoRA loaders (modules.models, modules.utils, modules.LoRA)."""

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
        # Start from the startup values, so that args of an earlier load do not leak into this one;
        # then the model's own settings (its metadata and the web UI's per-model settings); then args.
        original = getattr(shared, "original_args", None)
        for key in allowed | self.BLOCKED_ARGS:
            if original is not None and hasattr(original, key) and hasattr(shared.args, key):
                setattr(shared.args, key, getattr(original, key))
        self.m.models_settings.update_model_parameters(self.m.models_settings.get_model_metadata(name))
        for key, value in (args or {}).items():
            setattr(shared.args, key, value)
        shared.model, shared.tokenizer = self.m.models.load_model(name)
        return current

    def unload(self, current: Host) -> Host:
        self.m.models.unload_model()
        return current

    def loras(self) -> list[str]:
        return [name for name in self.m.utils.get_available_loras() if name != "None"]

    def load_loras(self, names: list[str]) -> None:
        available = self.loras()
        for name in names:
            _checked_name(name, available)
        self.m.LoRA.add_lora_to_model(names)

    def unload_loras(self) -> None:
        self.m.LoRA.add_lora_to_model([])
