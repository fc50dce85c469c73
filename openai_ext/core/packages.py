"""Models that ship inside PyPI packages: finding them without importing their packages, and
building a usable folder from their parts once, in a cache that several processes may share."""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable

log = logging.getLogger(__name__)


def installed(module: str) -> bool:
    """Whether ``module`` can be imported, without importing it."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):   # a parent package missing, or a module loaded without a spec
        return False


def package_dir(package: str) -> Path | None:
    """The folder of an installed package. find_spec() locates it without running its
    __init__ (some model packages import a whole CLI there)."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def cache_root() -> Path:
    """Where models unpacked or joined from package parts are kept."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "openai_ext"


def build_once(target: Path, build: Callable[[Path], Path], *, complete: Callable[[Path], bool]) -> Path:
    """``target``, made by ``build`` unless it is ``complete`` already.

    ``build(work)`` fills a private temporary folder and returns the folder (``work`` or one
    inside it) that becomes ``target``; it is renamed into place last. So a half-written folder
    never counts, and when two processes build at once both end with the one complete folder."""
    if complete(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        made = build(work)
        try:
            os.replace(made, target)
        except OSError:
            if not complete(target):   # else another process finished first: use its folder
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    log.info("made %s", target)
    return target
