"""Documents' text: what a file holds, as vector stores ingest it and as a request's file parts
give it to the model (parse: text, code, Markdown, JSON, HTML, PDF; inputs: a file part's bytes)."""
