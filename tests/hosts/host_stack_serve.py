"""Serves the extension the way the web UI loads it, on the double of the web UI's `modules`,
inside the virtual environment of test_host_stack.py (the web UI's pinned packages). Prints
"ready <port>" and serves until its stdin closes."""

import importlib.util
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "doubles" / "textgen_webui"))


port = int(sys.argv[1])
spec = importlib.util.spec_from_file_location("user_ext_openai_ext", HERE.parents[1] / "script.py")
ext = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ext)
ext.params["port"] = port
ext.setup()
import importlib  # noqa: E402

versions = {name: importlib.import_module(name).__version__ for name in ("fastapi", "starlette", "pydantic")}
print("ready", port, json.dumps(versions), flush=True)
sys.stdin.read()
ext.server.stop()
