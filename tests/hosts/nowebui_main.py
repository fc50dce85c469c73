"""Runs the way the web UI's server.py runs with --nowebui (bde878f): its signal handler, its
extension loader, then its main returns, unless its own --api (given as the second argument
here) blocks it in the built-in API's server until SIGTERM. Prints "ready" once the extensions
are set up and "main returned" when the interpreter starts shutting down."""

import importlib.util
import logging
import signal
import sys
import threading
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "doubles" / "textgen_webui"))

from modules import logging_colors, shared  # noqa: E402

port, api = int(sys.argv[1]), "--api" in sys.argv[2:]
shared.args.nowebui, shared.args.api = True, api
logging_colors.logger.addHandler(logging.StreamHandler(sys.stdout))   # the host's console


def signal_handler(sig, frame):   # as server.py's
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    sys.exit(0)


signal.signal(signal.SIGINT, signal_handler)
signal.signal(signal.SIGTERM, signal_handler)

# as modules/extensions.py loads a user extension
shared.settings["openai_ext-port"] = port
spec = importlib.util.spec_from_file_location("user_ext_openai_ext", HERE.parents[1] / "script.py")
extension = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = extension
spec.loader.exec_module(extension)
for param in extension.params:
    if f"openai_ext-{param}" in shared.settings:
        extension.params[param] = shared.settings[f"openai_ext-{param}"]
extension.setup()

# Registered after the extension's own hooks, so it runs first when main has returned.
threading._register_atexit(lambda: print("main returned", flush=True))
print("ready", flush=True)

if api:
    # The built-in API runs uvicorn in the main thread: it takes SIGINT/SIGTERM for itself and
    # returns once it has shut down.
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *a: stopped.set())
    while not stopped.wait(0.1):
        pass
