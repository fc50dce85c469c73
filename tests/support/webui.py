"""Loading script.py the way the web UI loads a user extension, on the double of its `modules`."""

from __future__ import annotations

import importlib.util

import pytest

from support import ROOT


def import_extension(name="openai_ext"):
    """Imports script.py the way the host imports a user extension."""
    spec = importlib.util.spec_from_file_location(f"user_ext_{name}", ROOT / "script.py")
    ext = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ext)
    return ext


def load_extension(shared, name="openai_ext"):
    """Loads script.py the way the host loads a user extension, applies the host's settings
    (`<name>-<param>` keys) to its params, as the host does to the keys params has, then calls
    setup(). Like the host's loader, it lets an Exception through but not a SystemExit."""
    try:
        ext = import_extension(name)
        for key in ext.params:
            if f"{name}-{key}" in shared.settings:
                ext.params[key] = shared.settings[f"{name}-{key}"]
        ext.setup()
    except SystemExit as e:
        pytest.fail(f"the extension ended the web UI: SystemExit({e})")
    return ext
