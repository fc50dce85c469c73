"""The web UI's extension entry point, and the standalone launcher (python script.py).

The web UI imports this file, reads ``params`` (and overrides each entry from its own settings,
e.g. ``openai-port: 5002``), then calls ``setup()``, which starts the API on a daemon thread.
"""

import sys
from pathlib import Path

# The web UI may load this file by path, outside any package: make openai_ext importable.
sys.path.insert(0, str(Path(__file__).resolve().parent))

from openai_ext.core.config import Settings, SettingsError, defaults, read_settings_file  # noqa: E402

# The web UI's name for this extension: its folder, the prefix of its settings ("<name>-port").
NAME = Path(__file__).resolve().parent.name


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
