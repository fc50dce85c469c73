"""pyproject.toml makes the project an installable package whose extras match the requirements
files (the web UI installs from requirements.txt, so those stay)."""

from __future__ import annotations

import re
import sys

import pytest
from support import ROOT

tomllib = pytest.importorskip("tomllib") if sys.version_info >= (3, 11) else pytest.importorskip("tomli")


def requirements(name: str) -> list[str]:
    """The requirement lines of a file, without comments and -r includes, spaces removed."""
    out = []
    for line in (ROOT / name).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line and not line.startswith("-r"):
            out.append(re.sub(r"\s+", "", line).replace('"', "'"))
    return out


def normalised(items: list[str]) -> list[str]:
    return [re.sub(r"\s+", "", item).replace('"', "'") for item in items]


def test_the_extras_match_the_requirements_files():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert normalised(project["dependencies"]) == requirements("requirements.txt")
    extras = project["optional-dependencies"]
    assert normalised(extras["engines"]) == requirements("requirements-engines.txt")
    assert normalised(extras["standalone"]) == requirements("requirements-standalone.txt")
    assert normalised(extras["dev"]) == requirements("requirements-dev.txt")


def test_every_package_folder_is_a_package():
    """setuptools finds only folders with an __init__.py: one without would be left out of a wheel."""
    for folder in (ROOT / "openai_ext").rglob("*"):
        if folder.is_dir() and folder.name != "__pycache__" and any(folder.glob("*.py")):
            assert (folder / "__init__.py").is_file(), folder


def test_every_file_of_the_package_that_is_not_python_is_package_data():
    """A file the package reads at run time (the Realtime page) must be listed in package-data, or
    an installed package lacks it."""
    import fnmatch

    listed = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"].get("package-data", {})
    for path in (ROOT / "openai_ext").rglob("*"):
        if path.is_file() and path.suffix not in (".py", ".pyc") and "__pycache__" not in path.parts:
            package = ".".join(path.parent.relative_to(ROOT).parts)
            patterns = listed.get(package, []) + listed.get("*", [])
            assert any(fnmatch.fnmatch(path.name, p) for p in patterns), f"{path} is not in package-data"
