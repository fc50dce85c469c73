"""The Responses API family: /v1/responses (stateful, streamed, with tools and structured output)
and /v1/conversations.

A response request becomes the text family's chat request (``convert``), so prompts, tools,
grammars and parameters are mapped in one place for both APIs; the generation runs through the
text family's line and host (``stream``, ``service``); responses and conversations are kept in a
store (``store``): SQLite in the data folder, or PostgreSQL shared by several servers; background
responses run after their request returned (``background``).
"""
