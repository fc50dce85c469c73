"""Test double of modules.text_generation (see ../README.md).

Its "model" replays ``SCRIPT``, one token per entry, with a small made-up distribution at each
step (``distribution``), and reports it the way the host's loaders do: the llama.cpp loader's
``LlamaServer`` fills ``last_completion_probabilities`` when ``state['logprobs']`` is set, and
the Transformers path calls ``state['logits_processor']`` before each token is sampled."""

import ast
import copy
import math
import subprocess
import sys
import time
import weakref

import numpy as np

from . import logging_colors, models, shared

BOS, EOS = 256, 257
SPECIALS = {"<s>": BOS, "</s>": EOS}
VOCAB_SIZE = 512
# The tokens the double's "model" generates: strings, or bytes for a token that holds only part
# of a character's UTF-8 bytes.
SCRIPT = ["Hello", ",", " world", "!"]
FAIL_AFTER = None                         # raise inside generation after this many tokens
TOKEN_SECONDS = 0.0015                    # time per token; the host drops yields < 1 ms apart
CALLS = []                                # (question, state, stopping_strings, is_chat) per call
# Whether the llama.cpp loader's llama-server scores prompts (prompt_logprobs). Upstream
# llama.cpp's server has no such option: it ignores it and answers no prompt_probabilities, so
# the host's get_prompt_logprob_entries returns [] (the real web UI's own llama-server did so).
PROMPT_LOGPROBS = False
# The host's use of the lock (generate_reply): skipped for a request with a stop_event on
# loaders that serve parallel slots.
PARALLEL_MODELS = ("Exllamav3Model", "LlamaServer", "TensorRTLLMModel")

_token_ids = {}    # multi-byte tokens of SCRIPT, by their bytes: ids from 258 on


def token_id(token):
    raw = token if isinstance(token, bytes) else token.encode("utf-8")
    if len(raw) == 1:
        return raw[0]
    if raw not in _token_ids:
        _token_ids[raw] = 258 + len(_token_ids)
    return _token_ids[raw]


def token_bytes(tid):
    tid = int(tid)
    if tid < 256:
        return bytes([tid])
    if tid == BOS:
        return b"<s>"
    if tid == EOS:
        return b"</s>"
    return next((raw for raw, i in _token_ids.items() if i == tid), b"")   # an unused id: no text


def distribution(step, tid):
    """The double's logits at a generation step where ``tid`` is sampled: the token and three
    byte tokens; every third step one of those is more likely than the token sampled (as
    sampling with a temperature does). Every other token is impossible."""
    logits = {}
    for alt, value in zip((ord("a"), ord("b"), ord("c")), (1.0, 0.5, 0.0), strict=False):
        logits[alt] = value
    logits[ord("a")] = 2.5 if step % 3 == 2 else 1.0
    logits[tid] = 2.0
    return logits


def log_softmax(logits):
    top = max(logits.values())
    z = top + math.log(sum(math.exp(v - top) for v in logits.values()))
    return {t: v - z for t, v in logits.items()}


def _need_tokenizer():
    # as the host's encode/decode: an idle-unloaded model is loaded again first
    if shared.tokenizer is None:
        models.load_model_if_idle_unloaded()
        if shared.tokenizer is None:
            raise ValueError("No tokenizer is loaded")


def _tokenize(text):
    """Bytes, with the special tokens' texts read as those tokens (as the host's tokenizers do)."""
    ids, i = [], 0
    while i < len(text):
        special = next((s for s in SPECIALS if text.startswith(s, i)), None)
        if special:
            ids.append(SPECIALS[special])
            i += len(special)
        else:
            ids.extend(text[i].encode("utf-8"))
            i += 1
    return ids


def encode(prompt, add_special_tokens=True, add_bos_token=True, truncation_length=None):
    _need_tokenizer()
    if type(shared.model).__name__ == "LlamaServer":   # as the host's: llama-server tokenizes
        shared.model.reach("/tokenize")
    return _encode(prompt, add_bos_token=add_bos_token, truncation_length=truncation_length)


def _encode(prompt, add_bos_token=True, truncation_length=None):
    ids = _tokenize(str(prompt))
    if add_bos_token and not ids[:1] == [BOS]:
        ids = [BOS] + ids
    if truncation_length is not None:
        ids = ids[-truncation_length:]
    return np.array(ids, dtype=np.int64).reshape(1, len(ids))


def decode(output_ids, skip_special_tokens=True):
    _need_tokenizer()
    if type(shared.model).__name__ == "LlamaServer":
        shared.model.reach("/detokenize")
    return _decode(output_ids, skip_special_tokens)


def _decode(output_ids, skip_special_tokens=True):
    # as a Hugging Face tokenizer does: special tokens are dropped unless asked for
    raw = b"".join(token_bytes(i) for i in output_ids if not (skip_special_tokens and int(i) in (BOS, EOS)))
    return raw.decode("utf-8", errors="replace")


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
    name = type(shared.model).__name__
    use_parallel = (state.get("stop_event") is not None and name in PARALLEL_MODELS
                    and (name != "LlamaServer" or shared.args.parallel > 1))
    if not use_parallel:
        shared.generation_lock.acquire()
    try:
        CALLS.append((question, copy.copy(state), list(stopping_strings or []), is_chat))
        yield from _generate_reply(question, state, stopping_strings, is_chat)
    finally:
        if not use_parallel:
            shared.generation_lock.release()


def _generate_reply(question, state, stopping_strings, is_chat):
    stops = _stop_strings(stopping_strings, state["custom_stopping_strings"])
    shared.stop_everything = False
    reply = ""
    last_update = -1
    for reply in _model_replies(question, state, is_chat):
        now = time.monotonic()
        reply, found = apply_stopping_strings(reply, stops)
        if state["stream"]:
            # as the host's: a yield less than 1 ms after the last one is dropped
            if now - last_update > 1 / 1000:
                yield reply
            last_update = time.monotonic()
        stop_event = state.get("stop_event")
        if found or shared.stop_everything or (stop_event is not None and stop_event.is_set()):
            break
    yield reply   # the host yields the final text again after its output hooks


def _model_replies(question, state, is_chat):
    """The loader's cumulative texts. As the host's generate_reply_custom / _HF: a failure is
    logged and ends the reply, which the caller sees as a reply that stops short."""
    hf = type(shared.model).__name__ not in PARALLEL_MODELS
    reply = ""
    try:
        if not is_chat:
            yield ""
        if hf:
            for reply in _hf_replies(question, state):
                yield reply
        else:
            for reply in shared.model.generate_with_streaming(question, state):
                yield reply
    except Exception:  # noqa: BLE001 - as the web UI does: logged, not raised
        logging_colors.logger.exception(f"Failed to generate reply ({'HF' if hf else 'custom'})")
    finally:
        # as the host's generate_reply_custom: the reply's tokens are counted for its log line,
        # with the model's tokenizer (llama-server's /tokenize, which raises once it is gone)
        if not hf and reply:
            encode(reply)


def _steps(question, state):
    """(step, token) for each token the model generates; None for the end-of-text token."""
    limit = state["max_new_tokens"]
    if state["auto_max_new_tokens"]:
        limit = state["truncation_length"] - len(encode(question)[0])
    for n, token in enumerate(SCRIPT):
        if n >= limit:
            return
        if FAIL_AFTER is not None and n >= FAIL_AFTER:
            raise RuntimeError("double: the model failed")
        if TOKEN_SECONDS:
            time.sleep(TOKEN_SECONDS)
        yield n, token
    yield len(SCRIPT), None


def _hf_replies(question, state):
    import torch

    processors = state.get("logits_processor") or []
    if not isinstance(processors, list):
        processors = list(processors) if hasattr(processors, "__iter__") else [processors]
    ids = list(encode(question, add_bos_token=state["add_bos_token"])[0])
    output = b""
    for n, token in _steps(question, state):
        tid = EOS if token is None else token_id(token)
        scores = torch.full((1, VOCAB_SIZE), -float("inf"))
        for t, v in distribution(n, tid).items():
            scores[0, t] = v
        for processor in processors:
            scores = processor(torch.tensor([ids]), scores)
        if token is None:
            return
        ids.append(tid)
        output += token_bytes(tid)
        if state["stream"]:
            # The whole output is decoded at each step, as some loaders do: a character whose
            # bytes are not all generated yet shows as U+FFFD.
            yield output.decode("utf-8", errors="replace")
        stop_event = state.get("stop_event")
        if shared.stop_everything or (stop_event is not None and stop_event.is_set()):
            break
    if not state["stream"]:
        yield output.decode("utf-8", errors="replace")


class _CustomModel:
    """A loader that samples by itself (generate_reply_custom): it streams text and keeps the
    probabilities it was asked for (``state['logprobs']``) in last_completion_probabilities."""

    reports_logprobs = True
    reports_end_token = False   # llama-server: an entry for the end-of-text token, its text ""

    def __init__(self):
        self.last_completion_probabilities = []
        self.last_prompt_token_count = 0

    @staticmethod
    def _entry(step, tid, n_probs, sent=None):
        """One entry of llama-server's completion_probabilities (logprobs, not probs). Its
        token is the text the server sent for it (``sent``: "" for the end-of-text token)."""
        lps = log_softmax(distribution(step, tid))
        best = sorted(lps.items(), key=lambda kv: -kv[1])[:n_probs]

        def item(t, lp, raw=None):
            raw = token_bytes(t) if raw is None else raw
            return {"id": t, "token": raw.decode("utf-8", errors="replace"), "bytes": list(raw), "logprob": lp}
        return {**item(tid, lps[tid], sent), "top_logprobs": [item(t, lp) for t, lp in best]}

    def generate_with_streaming(self, prompt, state):
        self.last_prompt_token_count = len(encode(prompt, add_bos_token=state["add_bos_token"])[0])
        n_probs = state.get("logprobs", 0)
        self.last_completion_probabilities = []
        output = b""
        for n, token in _steps(prompt, state):
            if token is None:
                # llama-server sends the end-of-text token as a last partial response with no
                # text and, when asked, its probabilities (server-context.cpp process_token)
                if n_probs and n_probs > 0 and self.reports_logprobs and self.reports_end_token:
                    self.last_completion_probabilities.append(self._entry(n, EOS, n_probs, sent=b""))
                return
            output += token if isinstance(token, bytes) else token.encode("utf-8")
            if state["stream"]:
                yield output.decode("utf-8", errors="replace")
            # as the host's: the token's probabilities are kept after its text was yielded
            if n_probs and n_probs > 0 and self.reports_logprobs:
                self.last_completion_probabilities.append(self._entry(n, token_id(token), n_probs))
            stop_event = state.get("stop_event")
            if shared.stop_everything or (stop_event is not None and stop_event.is_set()):
                break
        if not state["stream"]:
            yield output.decode("utf-8", errors="replace")


# Every LlamaServer made (weak references)
LLAMA_SERVERS = []


class LlamaServer(_CustomModel):
    """The host's llama.cpp loader: a llama-server process it talks to over HTTP.

    ``process`` is a real child process standing in for llama-server (a sleeping Python), as the
    host keeps its Popen. Once it has exited (a test kills it, as a crash would), every call the
    host makes to the server fails as the host's requests.Session calls to a dead port do: a
    ConnectionError before a reply, a ChunkedEncodingError in the middle of a streamed one."""

    bos_token = "<s>"
    reports_end_token = True

    def __init__(self):
        super().__init__()
        self.port = 8000 + len(LLAMA_SERVERS)
        self.process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(10**6)"],
                                        stdin=subprocess.DEVNULL)
        weakref.finalize(self, self.process.kill)
        LLAMA_SERVERS.append(weakref.ref(self))

    def reach(self, path):
        """What the host's HTTP call to ``path`` meets: an error when the server is gone."""
        import requests

        if self.process is None or self.process.poll() is not None:
            raise requests.exceptions.ConnectionError(
                f"HTTPConnectionPool(host='127.0.0.1', port={self.port}): Max retries exceeded with url: {path} "
                "(Caused by NewConnectionError('Failed to establish a new connection: [Errno 111] Connection "
                "refused'))")

    def encode(self, text, add_bos_token=False, **kwargs):
        self.reach("/tokenize")
        return list(_encode(text, add_bos_token=add_bos_token)[0])

    def decode(self, token_ids, **kwargs):
        self.reach("/detokenize")
        return _decode(token_ids, skip_special_tokens=False)

    media_marker = "<__media_marker__>"   # llama-server's own marker (the host asks /props for it)
    last_multimodal = None                 # the prompt of the last request with images, as sent

    def is_multimodal(self):
        """As the host's: a model loaded with an --mmproj file reads images."""
        return shared.args.mmproj not in [None, "None"]

    def _process_images_for_generation(self, state):
        """As the host's: the web UI's attachments, else the Chat API's messages, else raw_images."""
        from PIL import Image

        if state.get("image_attachments"):
            raise NotImplementedError("double: the web UI's own attachments are not modelled")
        if "history" in state and state.get("history", {}).get("messages"):
            raise NotImplementedError("double: the web UI API's history messages are not modelled")
        images = list(state.get("raw_images") or [])
        assert all(isinstance(i, Image.Image) for i in images), "raw_images holds PIL images"
        return images

    def generate_with_streaming(self, prompt, state):
        import requests

        self.reach("/completion")
        if shared.is_multimodal:
            images = self._process_images_for_generation(state)
            if images:
                # as the host's: placeholders become the server's marker, the images go as base64
                # PNGs (llama-server fails a request whose markers and images differ in number)
                sent = prompt.replace("<__media__>", self.media_marker)
                if sent.count(self.media_marker) != len(images):
                    raise requests.exceptions.HTTPError("400 Client Error: number of bitmaps does not match "
                                                        "number of markers")
                self.last_multimodal = {"prompt_string": sent, "multimodal_data": [_png64(i) for i in images]}
        for text in super().generate_with_streaming(prompt, state):
            if self.process.poll() is not None:
                raise requests.exceptions.ChunkedEncodingError(
                    "('Connection broken: IncompleteRead(0 bytes read)', IncompleteRead(0 bytes read))")
            yield text

    def stop(self):
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None

    def get_prompt_logprob_entries(self, token_ids, n_probs=5, prompt=""):
        """As the host's: a null first entry, then llama-server's prompt_probabilities; [] when
        the server answers none (see PROMPT_LOGPROBS)."""
        self.reach("/completion")
        ids = [int(t) for t in token_ids]
        if not PROMPT_LOGPROBS:
            return []
        first = decode(ids[:1], skip_special_tokens=False)
        entries = [{"token": "" if first == self.bos_token or not prompt.startswith(first) else first,
                    "null_logprob": True}]
        entries += [self._entry(1000 + i, t, n_probs) for i, t in enumerate(ids[1:])]
        return entries


def _png64(image):
    import base64
    import io

    buffered = io.BytesIO()
    image.save(buffered, format="PNG")
    return base64.b64encode(buffered.getvalue()).decode("utf-8")


class Exllamav3Model(_CustomModel):
    """The ExLlamaV3 loader: parallel-capable, reports probabilities, cannot score a prompt."""


class TensorRTLLMModel(_CustomModel):
    """The TensorRT-LLM loader: parallel-capable, reports no probabilities."""

    reports_logprobs = False


def prompt_logits(ids):
    """The double's logits over a prompt: row j scores token j + 1 (as llama-server's
    prompt_probabilities above do)."""
    import torch

    ids = [int(t) for t in ids]
    logits = torch.full((1, len(ids), VOCAB_SIZE), -float("inf"))
    for j in range(len(ids)):
        nxt = ids[j + 1] if j + 1 < len(ids) else EOS
        for t, v in distribution(1000 + j, nxt).items():
            logits[0, j, t] = v
    return logits
