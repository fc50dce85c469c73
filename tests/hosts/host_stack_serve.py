"""Serves the extension the way the web UI loads it, on the double of the web UI's `modules`,
inside the virtual environment of test_host_stack.py (the web UI's pinned packages). Beside it,
in the same process, a stand-in of the web UI's own API streams with sse-starlette's
EventSourceResponse from its own uvicorn server on its own thread, as modules/api/script.py does.
Prints "ready <json>" and serves until its stdin closes."""

import asyncio
import importlib
import importlib.metadata
import importlib.util
import json
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "doubles" / "textgen_webui"))

import uvicorn  # noqa: E402
from fastapi import FastAPI  # noqa: E402
from sse_starlette import EventSourceResponse  # noqa: E402

port, builtin_port = int(sys.argv[1]), int(sys.argv[2])

builtin = FastAPI()


@builtin.post("/v1/completions")
async def builtin_completions():
    async def events():
        for word in ("built", "-in", " API"):
            await asyncio.sleep(0)
            yield json.dumps({"choices": [{"text": word}]})
        yield "[DONE]"
    return EventSourceResponse(events())


server = uvicorn.Server(uvicorn.Config(builtin, host="127.0.0.1", port=builtin_port, log_level="warning"))
threading.Thread(target=server.run, daemon=True).start()
while not server.started:
    time.sleep(0.01)

spec = importlib.util.spec_from_file_location("user_ext_openai_ext", HERE.parents[1] / "script.py")
ext = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ext)
ext.params["port"] = port
ext.setup()

names = ("fastapi", "starlette", "pydantic", "sse-starlette", "uvicorn", "numpy")
versions = {name: importlib.metadata.version(name) for name in names}
print("ready", json.dumps(versions), flush=True)
sys.stdin.read()
ext.server.stop()
server.should_exit = True
