"""Chat through the API vs llama.cpp called in-process, side by side in one run.

Measures time to first token (TTFT) and decode speed (tokens/s after the first token) for:
  in-process  llama-cpp-python's Llama.generate on the same GGUF (the no-HTTP limit)
  in-process host  this project's llama.cpp host (C sampler chain), called without HTTP
  this API    python -m openai_ext in a separate process, streamed over HTTP
  llama-cpp-python's own server, when its extras are installed (reference only)
Runs alternate between the contenders so drift on a shared machine hits all of them alike.
Greedy decoding: every contender produces the same tokens.

    python bench/bench_chat.py [--rounds 5] [--max-tokens 200] [--model PATH]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import httpx
from serving import PROMPTS, free_port, start_api, start_server, stop, stream_chat, wait_up


def in_process(llm, formatter, prompt: str, max_tokens: int) -> tuple[float, float, int]:
    import llama_cpp

    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    t0 = time.perf_counter()
    text = formatter(messages=[{"role": "user", "content": prompt}]).prompt
    tokens = llm.tokenize(text.encode(), add_bos=False, special=True)
    first = last = None
    n = 0
    for tok in llm.generate(tokens, temp=0.0, top_k=0, top_p=1.0, min_p=0.0, repeat_penalty=1.0):
        if llama_cpp.llama_vocab_is_eog(vocab, tok):
            break
        now = time.perf_counter()
        first = first or now
        last = now
        n += 1
        if n >= max_tokens:
            break
    return first - t0, (n - 1) / (last - first), n


def host_in_process(host, prompt: str, max_tokens: int) -> tuple[float, float, int]:
    """This project's own llama.cpp host, called in-process: what the API adds on top of it is the
    HTTP, the queue and the stream assembly."""
    import threading

    from openai_ext.hosts.base import Prompt
    from openai_ext.text import params
    from openai_ext.text.protocol import ChatCompletionRequest

    t0 = time.perf_counter()
    messages = [{"role": "user", "content": prompt}]
    text = host.chat_prompt(messages).text
    tokens = host.tokenize(text)
    # the same settings the API gives the host for this request
    request = ChatCompletionRequest(messages=messages, max_tokens=max_tokens, temperature=0)
    settings = params.plan(request, abilities=host.abilities, room=host.context_length() - len(tokens),
                           max_n=1).settings
    first = last = None
    n = 0
    for piece in host.generate(Prompt(text, tokens), settings, threading.Event()):
        if piece.text:
            now = time.perf_counter()
            first = first or now
            last = now
        n += piece.tokens or 0
    return first - t0, (n - 1) / (last - first), n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=200)
    ap.add_argument("--model", help="GGUF path (default: the embedded SmolLM2)")
    ap.add_argument("--n-ctx", type=int, default=2048)
    ap.add_argument("--skip-reference", action="store_true", help="do not run llama-cpp-python's server")
    args = ap.parse_args()

    from llama_cpp import Llama
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    from openai_ext.hosts.files import default_gguf

    model = str(args.model or default_gguf())
    llm = Llama(model, n_ctx=args.n_ctx, verbose=False)
    import llama_cpp

    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    eos = llama_cpp.llama_vocab_get_text(vocab, llm.token_eos()).decode()
    formatter = Jinja2ChatFormatter(llm.metadata["tokenizer.chat_template"], eos_token=eos, bos_token="")
    print(f"model {Path(model).name}, n_ctx {args.n_ctx}, threads {llm.context_params.n_threads}/"
          f"{llm.context_params.n_threads_batch}, {args.rounds} rounds x {len(PROMPTS)} prompts, "
          f"up to {args.max_tokens} tokens, greedy")

    contenders: dict[str, tuple] = {}
    procs = []
    port = free_port()
    procs.append(start_api(port, "--model", model, "--n-ctx", str(args.n_ctx)))
    contenders["this API"] = (f"http://127.0.0.1:{port}/v1",)
    if not args.skip_reference:
        try:
            import llama_cpp.server  # noqa: F401
            import starlette_context  # noqa: F401
            ref_port = free_port()
            procs.append(start_server(["-m", "llama_cpp.server", "--model", model, "--host", "127.0.0.1",
                                       "--port", str(ref_port), "--n_ctx", str(args.n_ctx)]))
            contenders["llama-cpp-python server"] = (f"http://127.0.0.1:{ref_port}/v1",)
        except ImportError:
            print("(llama-cpp-python's server is not installed: pip install 'llama-cpp-python[server]' to compare)")
    from openai_ext.hosts.llamacpp import LlamaCppHost

    host = LlamaCppHost(model, n_ctx=args.n_ctx)
    results: dict[str, list[tuple[float, float, int]]] = {"in-process": [], "in-process host": [],
                                                           **{k: [] for k in contenders}}
    try:
        for (base,), proc in zip(contenders.values(), procs, strict=False):
            wait_up(base, proc)
        client = httpx.Client(timeout=300)
        # warm-up: load pages, compile templates
        in_process(llm, formatter, "Hello", 8)
        host_in_process(host, "Hello", 8)
        for (base,) in contenders.values():
            stream_chat(client, f"{base}/chat/completions", "Hello", 8)
        for _ in range(args.rounds):
            for prompt in PROMPTS:
                results["in-process"].append(in_process(llm, formatter, prompt, args.max_tokens))
                results["in-process host"].append(host_in_process(host, prompt, args.max_tokens))
                for name, (base,) in contenders.items():
                    results[name].append(stream_chat(client, f"{base}/chat/completions", prompt, args.max_tokens))
    finally:
        stop(procs)

    base = results["in-process"]
    print(f"\n{'contender':26} {'TTFT ms':>9} {'decode tok/s':>13} {'tokens':>7} {'TTFT +ms':>9} {'decode ratio':>13}")
    for name, rows in results.items():
        ttft = statistics.median(r[0] for r in rows)
        tps = statistics.median(r[1] for r in rows)
        toks = statistics.median(r[2] for r in rows)
        # paired with the in-process run of the same prompt in the same round, so drift cancels
        extra = statistics.median((r[0] - b[0]) * 1000 for r, b in zip(rows, base, strict=False))
        ratio = statistics.median(r[1] / b[1] for r, b in zip(rows, base, strict=False))
        print(f"{name:26} {ttft * 1000:9.1f} {tps:13.1f} {toks:7.0f} {extra:+9.1f} {ratio:12.3f}x")
    print("\n(medians over runs; TTFT +ms and decode ratio are medians of per-run differences and ratios\n"
          " against the in-process run of the same prompt in the same round)")


if __name__ == "__main__":
    main()
