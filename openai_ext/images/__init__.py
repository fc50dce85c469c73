"""/v1/images/*: OpenAI's image API over a Stable Diffusion web UI."""
