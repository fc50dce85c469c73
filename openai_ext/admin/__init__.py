"""/v1/models and /v1/internal/*: the server's own surface."""
