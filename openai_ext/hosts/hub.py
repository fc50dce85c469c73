"""Models named by a hub reference, fetched with huggingface_hub as llama-server's -hf does.

A reference is ``org/repo`` (the repo's Q4_K_M file, or its first GGUF when it has none),
``org/repo:QUANT`` (the file whose name carries that quantization, case-insensitive), or
``org/repo/path/file.gguf`` (that file); ``hf.co/`` in front is accepted, as Ollama writes it.
A split GGUF (``...-00001-of-00003.gguf``) is fetched in all its parts, and a repo's ``mmproj``
file (a vision projector) with it.

huggingface_hub does the fetching: the hub's cache (``HF_HUB_CACHE``/``HF_HOME``), resumed
downloads, ``HF_TOKEN`` for gated repos, ``HF_ENDPOINT`` for a mirror; with ``HF_HUB_OFFLINE=1``
(or the hub out of reach) only what is cached is used. Every failure is a ``HubError`` whose
message says what to change: a repo that does not resolve, a quant it does not have (listing
those it has), a disk too small for what is missing."""

from __future__ import annotations

import functools
import logging
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

# Which file a reference without a quant gets, as llama-server chooses.
DEFAULT_QUANT = "Q4_K_M"
_SPLIT = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)
_REPO_PART = r"[A-Za-z0-9][A-Za-z0-9._-]*"
_REFERENCE = re.compile(rf"^(?:(?:https?://)?(?:hf\.co|huggingface\.co)/)?(?P<repo>{_REPO_PART}/{_REPO_PART})"
                        rf"(?::(?P<quant>[A-Za-z0-9._-]+)|/(?P<file>[^:\s]+\.gguf))?$")


class HubError(ValueError):
    """A reference that cannot be served; the message says why and what to do."""


@dataclass(frozen=True)
class Reference:
    repo: str
    quant: str | None = None
    file: str | None = None

    def __str__(self) -> str:
        return self.repo + (f":{self.quant}" if self.quant else f"/{self.file}" if self.file else "")


@dataclass(frozen=True)
class Fetched:
    model: Path                 # the GGUF to load (a split model's first part)
    mmproj: Path | None = None  # the repo's vision projector, if it has one


def parse(text: str) -> Reference | None:
    """The hub reference ``text`` is, or None when it is a path. A file that exists is a path,
    and so is anything that starts like one ('/', '.', '~', a drive) or names a .gguf file
    below a single folder (models/x.gguf)."""
    text = text.strip()
    if not text or text.startswith(("/", ".", "~", "\\")) or re.match(r"^[A-Za-z]:", text) or Path(text).exists():
        return None
    if text.lower().endswith(".gguf") and text.count("/") < 2:
        return None
    found = _REFERENCE.match(text)
    if found is None:
        return None
    return Reference(found["repo"], found["quant"], found["file"])


def is_reference(text: str | None) -> bool:
    return bool(text) and parse(str(text)) is not None


def _quant_in(name: str, quant: str) -> bool:
    # "Qwen2.5-0.5B-Instruct-Q4_K_M.gguf", ".Q4_K_M.gguf", "Q4_K_M/part-00001-of-00002.gguf";
    # Q4_K is not Q4_K_M: the quant must end where a separator (or the extension) starts.
    return re.search(rf"(?:^|[-_./]){re.escape(quant)}(?:[-_./]|$)", name, re.IGNORECASE) is not None


def quants(files: list[str]) -> list[str]:
    """The quantizations a repo's GGUF files carry, as their names tell (for an error message)."""
    found = set()
    for name in files:
        m = re.search(r"(?:^|[-_./])((?:I?Q\d[A-Z0-9_]*|F16|BF16|F32))(?:[-_./]|$)", name, re.IGNORECASE)
        if m and name.lower().endswith(".gguf") and "mmproj" not in name.lower():
            found.add(m.group(1).upper())
    return sorted(found)


def choose(ref: Reference, files: list[str]) -> tuple[list[str], str | None]:
    """The files to fetch for ``ref`` from a repo's ``files``: the model (every part of a split
    one, first part first) and the projector, if any."""
    ggufs = sorted(f for f in files if f.lower().endswith(".gguf"))
    projectors = [f for f in ggufs if "mmproj" in f.lower().rsplit("/", 1)[-1]]
    models = [f for f in ggufs if f not in projectors]
    if ref.file:
        if ref.file not in files:
            raise HubError(f"{ref.repo} has no file {ref.file}. Its GGUF files: {', '.join(models) or 'none'}.")
        chosen = ref.file
    else:
        if not models:
            raise HubError(f"{ref.repo} has no GGUF model file: use a repo of GGUF files (its name often ends in "
                           "-GGUF), or convert the model with llama.cpp's convert_hf_to_gguf.py.")
        quant = ref.quant or DEFAULT_QUANT
        matching = [f for f in models if _quant_in(f, quant)]
        if not matching and ref.quant:
            raise HubError(f"{ref.repo} has no {ref.quant} file. Quantizations there: "
                           f"{', '.join(quants(models)) or 'none named'}; give one as {ref.repo}:QUANT, or a file "
                           f"as {ref.repo}/FILE.gguf.")
        chosen = (matching or models)[0]
    parts = [chosen]
    split = _SPLIT.search(chosen)
    if split:
        stem = chosen[:split.start()]
        parts = sorted(f for f in files if f.startswith(stem) and _SPLIT.search(f)
                       and _SPLIT.search(f).group(2) == split.group(2))   # type: ignore[union-attr]
        if len(parts) != int(split.group(2)):
            raise HubError(f"{ref.repo}: {chosen} is part of a model split in {int(split.group(2))} files, and the "
                           f"repo has {len(parts)} of them.")
    # A projector in the same folder as the model first (repos with a folder per quant).
    folder = chosen.rsplit("/", 1)[0] if "/" in chosen else ""
    near = [p for p in projectors if (p.rsplit("/", 1)[0] if "/" in p else "") == folder] or projectors
    mmproj = next((p for p in near if "f16" in p.lower()), near[0] if near else None)
    return parts, mmproj


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def _endpoint() -> str | None:
    return os.environ.get("HF_ENDPOINT") or None


@functools.cache
def _logged_progress() -> Any:
    """A tqdm that also tells the log every tenth of a file (the console bar is lost in a service's
    log); made once, on the first fetch (tqdm is imported only then)."""
    from tqdm.auto import tqdm  # type: ignore[import-untyped]

    class Logged(tqdm):
        def __init__(self, *args: Any, **kwargs: Any):
            super().__init__(*args, **kwargs)
            self._told = -1

        def update(self, n: float | None = 1) -> bool | None:
            shown = super().update(n)
            if self.total:
                tenth = int(10 * self.n / self.total)
                if tenth > self._told:
                    self._told = tenth
                    log.info("Fetching %s: %d%% of %.1f MB", self.desc or "model", 10 * tenth, self.total / 1e6)
            return shown

    return Logged


def _listing(ref: Reference, cache_dir: Path | None) -> tuple[list[str], dict[str, int], str | None]:
    """The repo's files, their sizes and its commit, from the hub; from the cache when offline."""
    from huggingface_hub import HfApi, snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
    )

    reason = "HF_HUB_OFFLINE is set"
    if not _offline():
        try:
            info = HfApi(endpoint=_endpoint()).model_info(ref.repo, files_metadata=True, timeout=30)
            sizes = {s.rfilename: int(s.size or 0) for s in info.siblings or []}
            return sorted(sizes), sizes, info.sha
        except GatedRepoError:
            raise HubError(f"{ref.repo} is gated: accept its terms on the hub, then set HF_TOKEN to a token of "
                           "yours.") from None
        except RepositoryNotFoundError:
            raise HubError(f"There is no model {ref.repo} on the hub ({_endpoint() or 'huggingface.co'}); a private "
                           "repo needs HF_TOKEN. Check the name, or give a path to a GGUF file.") from None
        except Exception as e:  # noqa: BLE001 - the hub client
            # raises its HTTP library's errors too (httpx's, in huggingface_hub 2): any failure to
            # list falls back to the cache, which says clearly when it has nothing
            reason = f"the hub could not be reached ({type(e).__name__})"
    try:
        folder = Path(snapshot_download(ref.repo, local_files_only=True, cache_dir=cache_dir))
    except (LocalEntryNotFoundError, OSError, ValueError):
        raise HubError(f"{ref} is not in the hub's cache and {reason}: fetch it once online (unset "
                       "HF_HUB_OFFLINE), or give a path to a GGUF file.") from None
    files = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    log.info("Using %s from the hub's cache (%s)", ref, reason)
    return files, {}, None


def _check_disk(ref: Reference, wanted: list[str], sizes: dict[str, int], cache_dir: Path | None) -> None:
    from huggingface_hub import constants, try_to_load_from_cache

    missing = sum(sizes.get(f, 0) for f in wanted
                  if not isinstance(try_to_load_from_cache(ref.repo, f, cache_dir=cache_dir), str))
    folder = Path(cache_dir or constants.HF_HUB_CACHE)
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    free = shutil.disk_usage(folder).free
    if missing > free:
        raise HubError(f"{ref} needs {missing / 1e9:.2f} GB and {folder} has {free / 1e9:.2f} GB free: free some "
                       "space, or point HF_HUB_CACHE at a larger disk.")


def fetch(ref: Reference, *, cache_dir: Path | None = None) -> Fetched:
    """The local paths of ``ref``'s files, fetched into the hub's cache where they are missing."""
    from huggingface_hub import hf_hub_download

    files, sizes, commit = _listing(ref, cache_dir)
    parts, mmproj = choose(ref, files)
    wanted = parts + ([mmproj] if mmproj else [])
    _check_disk(ref, wanted, sizes, cache_dir)
    paths = []
    for name in wanted:
        try:
            # The repo's main revision, by name: the cache records which commit that was, for offline use.
            paths.append(Path(hf_hub_download(ref.repo, name, cache_dir=cache_dir,
                                              endpoint=_endpoint(), local_files_only=_offline() or commit is None,
                                              tqdm_class=_logged_progress())))
        except Exception as e:  # noqa: BLE001 - as in _listing: the hub library's errors, its HTTP library's
            raise HubError(f"Fetching {name} of {ref.repo} failed ({type(e).__name__}: {str(e)[:200]}); run again "
                           "to resume.") from None
    log.info("Model %s: %s%s", ref, paths[0], f" with projector {paths[-1].name}" if mmproj else "")
    return Fetched(paths[0], paths[-1] if mmproj else None)


def resolve(text: str, *, cache_dir: Path | None = None) -> Fetched:
    """A model setting (a path or a hub reference) as local files."""
    ref = parse(text)
    if ref is None:
        path = Path(text).expanduser()
        if not path.is_file():
            raise HubError(f"There is no model file {text}: give the path of a GGUF file, or a hub reference "
                           "(org/repo, org/repo:Q4_K_M, org/repo/file.gguf).")
        return Fetched(path, projector_beside(path))
    return fetch(ref, cache_dir=cache_dir)


def projector_beside(path: Path) -> Path | None:
    """A projector kept beside a model file, as llama-server's and LM Studio's folders keep them:
    a GGUF with "mmproj" in its name that, without that word, starts with the model's name
    (its quantization left out): mmproj-SmolVLM-256M-Instruct-f16.gguf beside
    SmolVLM-256M-Instruct-Q8_0.gguf."""
    base = re.sub(r"[-_.](?:I?Q\d\w*|F16|BF16|F32)$", "", path.name.removesuffix(".gguf"), flags=re.IGNORECASE)
    base = base.lower()
    for candidate in sorted(path.parent.glob("*.gguf")):
        name = candidate.name.lower()
        if "mmproj" in name and candidate != path:
            rest = name.removesuffix(".gguf").replace("mmproj", "").strip("-_.")
            if base and rest.startswith(base):
                return candidate
    return None
