"""Test double of modules.reasoning: the host's splitter of thinking and answer, for three of
its formats (<think> tags, gpt-oss's channels, which the extension's own splitter lacks, and a
closing </think> alone, last, as the host lists it)."""

FORMATS = [("<think>", "</think>", None),
           ("<|channel|>analysis<|message|>", "<|end|>", "<|channel|>final<|message|>"),
           (None, "</think>", None)]


def extract_reasoning(text, html_escaped=False):
    """(reasoning or None, content), as the host's."""
    if not text:
        return None, text
    for start, end, content_tag in FORMATS:
        if start is None:   # the end alone: thinking from the start, once the end has come
            if end not in text:
                continue
            pos, start = 0, ""
        else:
            pos = text.find(start)
        if pos == -1:
            if text.strip() and start.startswith(text.strip()):
                return "", ""
            continue
        begin = pos + len(start)
        stop = text.find(end, begin)
        if stop == -1:
            return text[begin:], ""
        rest = stop + len(end)
        if content_tag:
            found = text.find(content_tag, rest)
            if found == -1:
                return text[begin:stop], ""
            rest = found + len(content_tag)
        return text[begin:stop], text[rest:].lstrip()
    return None, text
