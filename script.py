"""The web UI's extension entry point, and the standalone launcher (python script.py).

The web UI imports this file, reads ``params`` (and overrides each entry from its own settings,
e.g. ``openai_ext-port: 5002`` for a folder named openai_ext), then calls ``setup()``, which
starts the API on a daemon thread. Do not name the folder ``openai``: the web UI takes
``--extensions openai`` for its own built-in API and never loads a folder of that name.
"""

import sys
from pathlib import Path

# The web UI may load this file by path, outside any package: make openai_ext importable.
sys.path.insert(0, str(Path(__file__).resolve().parent))

from openai_ext.core.config import Settings, SettingsError, defaults, read_settings_file  # noqa: E402


def _name() -> str:
    """The web UI's name for this extension, the prefix of its settings ("<name>-port"): the
    name it was loaded by (the web UI imports extensions/<name>/script.py as
    extensions.<name>.script, a user extension as user_ext_<name>), else the folder's."""
    parts = __name__.split(".")
    if len(parts) == 3 and parts[0] == "extensions" and parts[2] == "script":
        return parts[1]
    if __name__.startswith("user_ext_"):
        return __name__[len("user_ext_"):]
    return Path(__file__).resolve().parent.name


NAME = _name()


def _params() -> dict:
    """Every setting (default, then settings.json), so the web UI's settings.yaml can override
    each one: the web UI overrides only the keys params already has."""
    try:
        from_file = read_settings_file()
    except SettingsError:
        # Importing must not fail: setup() reads the file again and reports the problem there.
        from_file = {}
    known = {k: v for k, v in from_file.items() if k in Settings.model_fields}
    return {"display_name": "OpenAI-compatible API", "is_tab": False, **defaults(), **known}


params = _params()

server = None  # the running ApiServer, once setup() has run (None if it could not start)


def setup():
    global server
    from openai_ext.extension import start

    server = start(params, name=NAME)


if __name__ == "__main__":
    from openai_ext.__main__ import main

    sys.exit(main())
