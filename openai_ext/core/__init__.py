"""The shared core: settings, errors, guards, the server, streaming, admission and loading."""
