"""The web UI's extension entry point, and the standalone launcher (python script.py).

The web UI imports this file, reads ``params`` (and overrides each entry from its own settings,
e.g. ``openai-port: 5002``), then calls ``setup()``, which starts the API on a daemon thread.
"""

import sys
from pathlib import Path

# The web UI may load this file by path, outside any package: make openai_ext importable.
sys.path.insert(0, str(Path(__file__).resolve().parent))

from openai_ext.config import read_settings_file  # noqa: E402

params = {"display_name": "OpenAI-compatible API", "is_tab": False, **read_settings_file()}

server = None  # the running ApiServer, once setup() has run


def setup():
    global server
    from openai_ext.extension import start

    server = start(params)


if __name__ == "__main__":
    from openai_ext.__main__ import main

    sys.exit(main())
