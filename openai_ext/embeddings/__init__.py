"""/v1/embeddings: sentence-transformers models with dynamic batching."""
