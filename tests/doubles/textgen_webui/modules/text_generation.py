"""Test double of modules.text_generation (see ../README.md)."""

import copy

import numpy as np

from . import shared

BOS = 256
SCRIPT = ["Hello", ",", " world", "!"]   # the token strings the double's "model" generates
FAIL_AFTER = None                         # raise inside generation after this many tokens
CALLS = []                                # (question, state, stopping_strings, is_chat) per call


def encode(prompt, add_special_tokens=True, add_bos_token=True, truncation_length=None):
    ids = list(str(prompt).encode("utf-8"))
    if add_bos_token:
        ids = [BOS] + ids
    if truncation_length is not None:
        ids = ids[-truncation_length:]
    return np.array(ids).reshape(1, len(ids))


def decode(output_ids, skip_special_tokens=True):
    # as a Hugging Face tokenizer does: special tokens are dropped unless asked for
    text = bytes(i for i in output_ids if i < 256).decode("utf-8", errors="replace")
    if not skip_special_tokens and output_ids and output_ids[0] == BOS:
        text = "<s>" + bytes(i for i in output_ids[1:] if i < 256).decode("utf-8", errors="replace")
    return text


def stop_everything_event():
    shared.stop_everything = True


def _apply_stopping_strings(reply, stops):
    for s in stops:
        idx = reply.find(s)
        if idx != -1:
            return reply[:idx], True
    for s in stops:  # trim a stop string that is still being written
        for j in range(len(s) - 1, 0, -1):
            if reply[-j:] == s[:j]:
                return reply[:-j], False
    return reply, False


def generate_reply(question, state, stopping_strings=None, is_chat=False, escape_html=False, for_ui=False):
    shared.generation_lock.acquire()
    try:
        CALLS.append((question, copy.copy(state), list(stopping_strings or []), is_chat))
        shared.stop_everything = False
        stops = list(stopping_strings or []) + list(state["custom_stopping_strings"] or [])
        if not is_chat:
            yield ""
        reply = ""
        limit = state["max_new_tokens"]
        if state["auto_max_new_tokens"]:
            limit = state["truncation_length"] - len(encode(question)[0])
        for n, token in enumerate(SCRIPT):
            if n >= limit:
                break
            if FAIL_AFTER is not None and n >= FAIL_AFTER:
                raise RuntimeError("double: the model failed")
            reply += token
            shown, found = _apply_stopping_strings(reply, stops)
            yield shown
            stop_event = state.get("stop_event")
            if found or shared.stop_everything or (stop_event is not None and stop_event.is_set()):
                reply = shown
                break
        reply, _ = _apply_stopping_strings(reply, stops)
        yield reply   # the host yields the final text again after its output hooks
    finally:
        shared.generation_lock.release()
