"""Chat and completions (and the legacy routes), over a host: the text family."""
