"""Vector stores (/v1/vector_stores): files parsed, chunked, embedded with the embeddings engine and
searched; the index behind OpenAI's file_search tool."""
