"""Test double of modules.text_generation (see ../README.md)."""

import ast
import copy

import numpy as np

from . import models, shared

BOS = 256
# The tokens the double's "model" generates: strings, or bytes for a token that holds only part
# of a character's UTF-8 bytes.
SCRIPT = ["Hello", ",", " world", "!"]
FAIL_AFTER = None                         # raise inside generation after this many tokens
CALLS = []                                # (question, state, stopping_strings, is_chat) per call


def _need_tokenizer():
    # as the host's encode/decode: an idle-unloaded model is loaded again first
    if shared.tokenizer is None:
        models.load_model_if_idle_unloaded()
        if shared.tokenizer is None:
            raise ValueError("No tokenizer is loaded")


def encode(prompt, add_special_tokens=True, add_bos_token=True, truncation_length=None):
    _need_tokenizer()
    ids = list(str(prompt).encode("utf-8"))
    if add_bos_token:
        ids = [BOS] + ids
    if truncation_length is not None:
        ids = ids[-truncation_length:]
    return np.array(ids).reshape(1, len(ids))


def decode(output_ids, skip_special_tokens=True):
    _need_tokenizer()
    # as a Hugging Face tokenizer does: special tokens are dropped unless asked for
    text = bytes(i for i in output_ids if i < 256).decode("utf-8", errors="replace")
    if not skip_special_tokens and output_ids and output_ids[0] == BOS:
        text = "<s>" + bytes(i for i in output_ids[1:] if i < 256).decode("utf-8", errors="replace")
    return text


def stop_everything_event():
    shared.stop_everything = True


def _stop_strings(stopping_strings, custom):
    # as the host's: a string setting holds comma-separated quoted strings
    found = []
    for st in (stopping_strings, custom):
        if type(st) is str:
            st = ast.literal_eval(f"[{st}]")
        if type(st) is list:
            found += st
    return found


def apply_stopping_strings(reply, stops):
    """As the host's: cuts at the first stop string found; without one, trims the end of the
    reply where it is the start of a stop string still being written."""
    for s in stops:
        idx = reply.find(s)
        if idx != -1:
            return reply[:idx], True
    for s in stops:
        for j in range(len(s) - 1, 0, -1):
            if reply[-j:] == s[:j]:
                return reply[:-j], False
    return reply, False


def generate_reply(question, state, stopping_strings=None, is_chat=False, escape_html=False, for_ui=False):
    models.load_model_if_idle_unloaded()   # as the host does, before it takes its lock
    shared.generation_lock.acquire()
    try:
        CALLS.append((question, copy.copy(state), list(stopping_strings or []), is_chat))
        shared.stop_everything = False
        stops = _stop_strings(stopping_strings, state["custom_stopping_strings"])
        if not is_chat:
            yield ""
        output = b""
        reply = ""
        limit = state["max_new_tokens"]
        if state["auto_max_new_tokens"]:
            limit = state["truncation_length"] - len(encode(question)[0])
        for n, token in enumerate(SCRIPT):
            if n >= limit:
                break
            if FAIL_AFTER is not None and n >= FAIL_AFTER:
                raise RuntimeError("double: the model failed")
            output += token if isinstance(token, bytes) else token.encode("utf-8")
            # The whole output is decoded at each step, as some loaders do: a character whose
            # bytes are not all generated yet shows as U+FFFD.
            reply = output.decode("utf-8", errors="replace")
            shown, found = apply_stopping_strings(reply, stops)
            if state["stream"]:   # without stream, the host yields only the final text
                yield shown
            stop_event = state.get("stop_event")
            if found or shared.stop_everything or (stop_event is not None and stop_event.is_set()):
                reply = shown
                break
        reply, _ = apply_stopping_strings(reply, stops)
        yield reply   # the host yields the final text again after its output hooks
    finally:
        shared.generation_lock.release()
