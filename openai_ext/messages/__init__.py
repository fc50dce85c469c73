"""Anthropic's Messages API (/v1/messages) on the text family's host, queue, params mapping,
grammar and tools: the messages family."""
