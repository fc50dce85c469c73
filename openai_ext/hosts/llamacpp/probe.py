"""Whether llama.cpp's extra CPU buffer types are safe on this machine.

llama.cpp moves a model's weights into "extra" CPU buffer types where the CPU has a faster
kernel for them: repacked layouts for AVX2, AVX-512 and ARM, and Intel AMX tiles on Xeons since
Sapphire Rapids. llama-cpp-python is built from source with the build machine's own flags, and
on a CPU that reports AMX its AMX path segfaults on the first decode of more than one token
(llama.cpp issue 20824, seen in Ollama and in others' CI on such CPUs): the whole server dies on
its first request. Turning the extra buffer types off (the model parameter ``use_extra_bufts``,
llama-server's ``--no-repack``) avoids it, at some speed where they would have worked.

No CPU flag says whether the path works for a given build, so ``auto`` asks the machine: a child
process loads the model with them on and decodes batches as the server will. If the child dies
(or hangs), they are turned off. The verdict is kept per model file, llama.cpp build and CPU, so
the test runs once. The ``repack`` setting forces either way.

A child that dies is not always the extra buffer types' fault: a llama.cpp build can crash on a
machine whatever its buffer types (one build crashed compiling the tokenizer's pattern while it
loaded the model, on a machine that also reported AMX). So after a crash a second child tries
without them; if it dies too, ``CannotRun`` says so and the model is not loaded in the server's
own process, which would die with it (and with it every other client's request).

Run as ``python -m openai_ext.hosts.llamacpp.probe MODEL [--threads N] [--gpu-layers N] [--plain]`` it is
that child.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import platform
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

MODES = ("auto", "on", "off")
# Seconds the child may take: loading, repacking and a few decodes, plus time per GB of weights.
PROBE_BASE_S, PROBE_PER_GB_S = 90.0, 60.0
# The child is this module run as a program; tests may point it elsewhere.
PROBE_COMMAND = [sys.executable, "-m", "openai_ext.hosts.llamacpp.probe"]
PROBE_OK = "probe ok"
PROBE_STAGE = "probe stage: "   # the child's progress, so a crash can be placed (load, decode)


class CannotRun(RuntimeError):
    """llama.cpp died in a test child with its extra buffer types and without them."""


@dataclass(frozen=True)
class Choice:
    extra_buffers: bool
    reason: str
    settled: bool = True     # worth keeping: not a failure that may pass (a child that could not start)

    def line(self) -> str:
        state = "on" if self.extra_buffers else "off"
        return f"llama.cpp's extra CPU buffer types (weight repacking, AMX): {state}: {self.reason}"


def cpu_flags() -> set[str]:
    """The CPU's feature flags as Linux reports them (empty elsewhere)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def has_amx(flags: set[str] | None = None) -> bool:
    return any(f.startswith("amx") for f in (cpu_flags() if flags is None else flags))


def _cpu_identity() -> str:
    model = platform.machine()   # (platform.processor() would run a program)
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), model)
    except OSError:
        pass
    return f"{model} {' '.join(sorted(cpu_flags()))}"


def _build_identity() -> str:
    import llama_cpp

    return f"{llama_cpp.__version__} {llama_cpp.llama_print_system_info().decode(errors='replace')}"


def probe_key(path: Path, n_gpu_layers: int) -> str:
    """What the verdict depends on: the model's weights (their types choose the kernels), the
    llama.cpp build, the CPU, and how many layers stay on it."""
    st = path.stat()
    parts = [str(path.resolve()), str(st.st_size), str(st.st_mtime_ns), str(n_gpu_layers),
             _build_identity(), _cpu_identity()]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def _verdicts_file() -> Path:
    from ...core.packages import cache_root

    return cache_root() / "llama-cpu-probe.json"


def read_verdicts(file: Path) -> dict:
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def keep(file: Path, key: str, verdict: dict) -> None:
    """Keeps ``verdict`` under ``key`` in ``file`` (this test's, and llamacpp/values.py's). Best
    effort: a cache that cannot be written only means the test runs again next time."""
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        data = read_verdicts(file)
        data[key] = verdict
        tmp = file.with_name(f".{file.name}.{os.getpid()}")
        tmp.write_text(json.dumps(data, indent=1), encoding="utf-8")
        os.replace(tmp, file)
    except OSError as e:
        log.warning("could not keep the verdict of a test of this machine in %s (%s); it runs again at the next "
                    "start", file, e)


def choose(path: Path, mode: str = "auto", *, n_threads: int | None = None, n_gpu_layers: int = 0) -> Choice:
    """Whether to load ``path`` with the extra CPU buffer types, and why."""
    if mode == "on":
        return Choice(True, "forced by the repack setting ('on')")
    if mode == "off":
        return Choice(False, "forced by the repack setting ('off')")
    if mode != "auto":
        raise ValueError(f"repack must be one of {', '.join(MODES)}, not {mode!r}")
    file, key = _verdicts_file(), probe_key(path, n_gpu_layers)
    known = read_verdicts(file).get(key)
    if isinstance(known, dict) and isinstance(known.get("extra_buffers"), bool):
        return Choice(known["extra_buffers"], f"{known.get('reason', '')} (kept from an earlier start; "
                                              f"force with --repack on|off)")
    choice = _probe(path, n_threads=n_threads, n_gpu_layers=n_gpu_layers)
    if choice.settled:
        keep(file, key, {"extra_buffers": choice.extra_buffers, "reason": choice.reason, "at": int(time.time())})
    return choice


def _probe(path: Path, *, n_threads: int | None, n_gpu_layers: int) -> Choice:
    timeout = PROBE_BASE_S + PROBE_PER_GB_S * path.stat().st_size / 2 ** 30
    cmd = [*PROBE_COMMAND, str(path), "--gpu-layers", str(n_gpu_layers)]
    if n_threads:
        cmd += ["--threads", str(n_threads)]
    amx = " (this CPU reports Intel AMX, whose llama.cpp path is known to crash)" if has_amx() else ""
    t0 = time.monotonic()
    done = _run(cmd, timeout)
    if done is None:
        return Choice(False, f"a test decode with them did not finish in {timeout:.0f} s{amx}; "
                             "the server runs without them (force with --repack on)")
    spent = time.monotonic() - t0
    if done.returncode == 0 and PROBE_OK in done.stdout:
        return Choice(True, f"a test decode with them ran in a child process in {spent:.1f} s")
    if done.returncode < 0:
        plain = _run([*cmd, "--plain"], timeout)
        if plain is not None and plain.returncode < 0:
            raise CannotRun(
                f"llama.cpp crashed in a test child process with its extra CPU buffer types ({_crash(done)}) "
                f"and without them ({_crash(plain)}): this build of llama-cpp-python cannot run {path.name} on "
                "this machine, so it is not loaded (the server would die with it). Try another model, a "
                "llama-cpp-python built elsewhere, or serve through another engine with --upstream-url")
        return Choice(False, f"a test decode with them failed in a child process ({_crash(done)}){amx}; "
                             "the server runs without them (force with --repack on)")
    # An error, not a crash: safe for this start, tested again at the next
    tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or [""]
    return Choice(False, f"the test decode could not run (exit status {done.returncode}: {tail[0][:200]}); "
                         "the server runs without them this time (force with --repack on)", settled=False)


def _run(cmd: list[str], timeout: float) -> subprocess.CompletedProcess[str] | None:
    """The child's run; None: it did not finish in ``timeout`` seconds (it was killed)."""
    # the child imports this package from where the server imports it, whatever the folder
    package_root = str(Path(__file__).resolve().parents[3])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")]))}
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return None


def killed_by(status: int) -> str:
    """``killed by SIGSEGV`` for a process's exit status -11 (the web UI's model server's too)."""
    try:
        return f"killed by {signal.Signals(-status).name}"
    except ValueError:
        return f"killed by signal {-status}"


def _crash(done: subprocess.CompletedProcess[str]) -> str:
    """How a child that died was killed, and in which stage."""
    how = killed_by(done.returncode)
    stages = [line.removeprefix(PROBE_STAGE) for line in done.stdout.splitlines() if line.startswith(PROBE_STAGE)]
    where = {"load": " while loading the model", "decode": " in a test decode"}.get(stages[-1] if stages else "", "")
    return how + where


def _child(argv: list[str] | None = None) -> int:
    """Loads the model with the extra buffer types (without: ``--plain``) and decodes as the server
    does: a prompt of many tokens (the batch that crashes on AMX), then two sequences a token each."""
    ap = argparse.ArgumentParser(prog="python -m openai_ext.hosts.llamacpp.probe")
    ap.add_argument("model")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--gpu-layers", type=int, default=0)
    ap.add_argument("--plain", action="store_true", help="without the extra buffer types")
    args = ap.parse_args(argv)
    import numpy as np

    from .context import load_context, load_model

    print(f"{PROBE_STAGE}load", flush=True)
    model = load_model(Path(args.model), extra_buffers=not args.plain, n_gpu_layers=args.gpu_layers)
    ctx = load_context(model, n_ctx=512, parallel=2, n_threads=args.threads or None)
    import llama_cpp as L

    text = b"The quick brown fox jumps over the lazy dog. " * 8
    tokens = model.tokenize(text, add_bos=True, special=False)[:96]
    batch = L.llama_batch_init(128, 0, 1)
    print(f"{PROBE_STAGE}decode", flush=True)
    try:
        for step in ([(0, p, t) for p, t in enumerate(tokens)], [(0, len(tokens), 1), (1, 0, tokens[0])],
                     [(0, len(tokens) + 1, 2), (1, 1, tokens[1])]):
            n = len(step)
            for i, (seq, pos, tok) in enumerate(step):
                batch.token[i], batch.pos[i], batch.n_seq_id[i] = tok, pos, 1
                batch.seq_id[i][0], batch.logits[i] = seq, i == n - 1 or seq == 1
            batch.n_tokens = n
            rc = L.llama_decode(ctx.ctx, batch)
            if rc != 0:
                print(f"llama_decode returned {rc}", file=sys.stderr)
                return 1
            logits = np.ctypeslib.as_array(L.llama_get_logits_ith(ctx.ctx, n - 1), shape=(8,))
            if not np.all(np.isfinite(logits)):
                print("the logits are not finite", file=sys.stderr)
                return 1
    finally:
        L.llama_batch_free(batch)
        ctx.close()
        model.close()
    print(PROBE_OK, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(_child())
