"""A stand-in for a CPU on which llama.cpp's AMX path crashes, for the processes of one test.

What it stands for: on a CPU that reports Intel AMX (Xeon Sapphire Rapids and later), a
llama-cpp-python built there puts a model's weights into ggml's AMX buffer type when the model is
loaded with its extra buffer types on (``use_extra_bufts``, llama.cpp's default), and the first
``llama_decode`` of more than one token dies with SIGSEGV (llama.cpp issue 20824; SIGILL on some
machines); one token at a time works, and a model loaded with the extra buffer types off works.
This does the same on any CPU: a process with this folder on PYTHONPATH imports it at start
(Python's sitecustomize hook), and from then on such a decode kills the process with a real
SIGSEGV before llama.cpp's own decode runs, so a test sees the same signal on a CPU whose own AMX
path dies another way.

Where it differs: the real crash happens inside ggml's AMX kernels and only for weight types that
have them (Q4_0, Q4_1, Q8_0 and some K-quants); this crashes for any model loaded with the extra
buffer types on, which the embedded SmolLM2 (Q4_1) would be.
"""

import os
import signal

import llama_cpp
import llama_cpp.llama_cpp as raw

_extra_buffers = False
_load = raw.llama_model_load_from_file
_decode = raw.llama_decode


def _loaded(path, params):
    global _extra_buffers
    _extra_buffers = _extra_buffers or bool(params.use_extra_bufts)
    return _load(path, params)


def _decoded(ctx, batch):
    if _extra_buffers and batch.n_tokens > 1:
        os.kill(os.getpid(), signal.SIGSEGV)
    return _decode(ctx, batch)


raw.llama_model_load_from_file = _loaded
raw.llama_decode = llama_cpp.llama_decode = _decoded
