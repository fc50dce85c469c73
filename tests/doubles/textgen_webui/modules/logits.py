"""Test double of modules.logits: the next token's most likely candidates, as the web UI's own
/v1/internal/logits returns them (get_next_logits(..., return_dict=True))."""

import math

from . import logging_colors, models, shared, text_generation

CALLS = []   # (prompt, use_samplers, top_logits) per call


def get_next_logits(prompt, state, use_samplers, previous, top_logits=25, return_dict=False):
    models.load_model_if_idle_unloaded()
    CALLS.append((prompt, use_samplers, top_logits))
    needs_lock = not use_samplers   # as the host's: with samplers it generates one token instead
    if needs_lock:
        shared.generation_lock.acquire()
    try:
        result = _get_next_logits(prompt, state, use_samplers, top_logits)
    except Exception:  # noqa: BLE001 - as the web UI does: logged, not raised
        logging_colors.logger.exception("Failed to get next logits")
        result = None
    if needs_lock:
        shared.generation_lock.release()
    return result


def _get_next_logits(prompt, state, use_samplers, top_logits):
    if text_generation.FAIL_AFTER == 0:
        raise RuntimeError("double: the model failed")
    ids = list(text_generation.encode(prompt)[0])
    first = text_generation.token_id(text_generation.SCRIPT[0])
    logits = text_generation.distribution(len(ids), first)
    if use_samplers:   # the double's samplers: temperature only
        logits = {t: v / max(state["temperature"], 1e-3) for t, v in logits.items()}
    lps = text_generation.log_softmax(logits)
    best = sorted(lps.items(), key=lambda kv: -kv[1])[:top_logits]
    name = type(shared.model).__name__
    out = {}
    for tid, lp in best:
        raw = text_generation.token_bytes(tid)
        key = raw.decode("utf-8", errors="replace") if name == "LlamaServer" else \
            shared.tokenizer.convert_ids_to_tokens(tid)   # the host shows the vocabulary's entry there
        out[key] = math.exp(lp)
    return out
