"""Text generation backends: the Host contract, the embedded llama.cpp host and the web UI host."""
