"""/v1/moderations: a small local classifier for OpenAI's categories."""
