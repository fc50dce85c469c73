"""An OpenAI-compatible API for local models: a web UI extension that also runs on its own."""

__version__ = "0.1.0"
