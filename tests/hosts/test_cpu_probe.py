"""Whether llama.cpp's extra CPU buffer types are used: forced by the repack setting, or found out
once by a test decode in a child process, which falls back to the safe buffer types when the child
dies or hangs.

The verdict depends on the CPU the tests run on (on one that reports Intel AMX the real child
dies), so no test here expects one verdict of the real child: where a verdict is the subject, the
child is a program that really succeeds, really crashes or really hangs, and the CPU's flags are
set by the test; where the real child runs, what is asserted holds whichever verdict it gives."""

from __future__ import annotations

import os
import sys

import pytest

from openai_ext.hosts.files import default_gguf
from openai_ext.hosts.llamacpp import probe as probe

DECODES = [sys.executable, "-c", f"print({probe.PROBE_OK!r})"]   # a CPU and build on which the decode works
CRASH = [sys.executable, "-c", "import ctypes; ctypes.string_at(0)"]   # a real SIGSEGV
HANG = [sys.executable, "-c", "import time; time.sleep(60)"]
REAL = list(probe.PROBE_COMMAND)


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    """Verdicts go to a folder of the test's own, never the user's cache."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def ran(monkeypatch) -> list[list[str]]:
    """The children started, recorded."""
    import subprocess

    started, real = [], subprocess.run

    def run(cmd, **kw):
        started.append(cmd)
        return real(cmd, **kw)
    monkeypatch.setattr(probe.subprocess, "run", run)
    return started


def cpu_reports(monkeypatch, *flags: str) -> None:
    """The CPU's flags, as the probe reads them (and keys its verdicts by)."""
    monkeypatch.setattr(probe, "cpu_flags", lambda: set(flags))


def assert_a_verdict_of_the_real_decode(choice: probe.Choice) -> None:
    """What the real child gives on any CPU: on where the decode ran, off where it died (as on a
    CPU whose AMX path crashes) or hung; never "could not run", which a child that did not find
    the package or the model would give."""
    assert choice.settled, choice
    if choice.extra_buffers:
        assert "ran in a child process" in choice.reason, choice
    else:
        assert "failed in a child process (killed by" in choice.reason or "did not finish" in choice.reason, choice
        assert "--repack on" in choice.reason
    # the reason names AMX exactly where the child failed on a CPU that reports it
    assert ("reports Intel AMX" in choice.reason) == (not choice.extra_buffers and probe.has_amx()), choice


def test_on_and_off_are_forced_without_a_test(monkeypatch):
    started = ran(monkeypatch)
    assert probe.choose(default_gguf(), "on") == probe.Choice(True, "forced by the repack setting ('on')")
    assert not probe.choose(default_gguf(), "off").extra_buffers
    assert started == []
    with pytest.raises(ValueError, match="auto, on, off"):
        probe.choose(default_gguf(), "maybe")


def test_auto_runs_the_real_test_decode_once_and_keeps_its_verdict(monkeypatch):
    started = ran(monkeypatch)
    first = probe.choose(default_gguf(), "auto")
    assert_a_verdict_of_the_real_decode(first)
    assert len(started) == 1 and started[0][:3] == REAL
    # a child that would say otherwise, if it ran
    monkeypatch.setattr(probe, "PROBE_COMMAND", CRASH if first.extra_buffers else DECODES)
    again = probe.choose(default_gguf(), "auto")
    assert again.extra_buffers == first.extra_buffers
    assert again.reason.startswith(first.reason) and "kept from an earlier start" in again.reason
    assert len(started) == 1


def test_a_child_that_decodes_keeps_them_on_and_the_verdict_is_kept(monkeypatch):
    started = ran(monkeypatch)
    monkeypatch.setattr(probe, "PROBE_COMMAND", DECODES)
    first = probe.choose(default_gguf(), "auto", n_threads=3)
    assert first.extra_buffers and "ran in a child process" in first.reason, first
    assert ": on: " in first.line()
    assert started == [[*DECODES, str(default_gguf()), "--gpu-layers", "0", "--threads", "3"]]
    monkeypatch.setattr(probe, "PROBE_COMMAND", CRASH)     # would say otherwise, if it ran
    again = probe.choose(default_gguf(), "auto")
    assert again.extra_buffers and "kept from an earlier start" in again.reason
    assert len(started) == 1


@pytest.mark.parametrize("amx", [True, False])
def test_a_child_that_crashes_turns_them_off(monkeypatch, amx):
    cpu_reports(monkeypatch, "avx2", *(["amx_tile", "amx_int8"] if amx else []))
    monkeypatch.setattr(probe, "PROBE_COMMAND", CRASH)
    choice = probe.choose(default_gguf(), "auto")
    assert not choice.extra_buffers and "SIGSEGV" in choice.reason and "--repack on" in choice.reason
    assert ": off: " in choice.line()
    # the reason names AMX only where the CPU reports it
    assert ("this CPU reports Intel AMX" in choice.reason) == amx, choice


def test_a_child_that_hangs_is_stopped_and_turns_them_off(monkeypatch):
    monkeypatch.setattr(probe, "PROBE_COMMAND", HANG)
    monkeypatch.setattr(probe, "PROBE_BASE_S", 1.0)
    monkeypatch.setattr(probe, "PROBE_PER_GB_S", 0.0)
    choice = probe.choose(default_gguf(), "auto")
    assert not choice.extra_buffers and "did not finish" in choice.reason


def test_a_child_that_fails_without_crashing_is_safe_now_and_tested_again_next_time(monkeypatch):
    started = ran(monkeypatch)
    monkeypatch.setattr(probe, "PROBE_COMMAND", [sys.executable, "-c", "raise SystemExit('no such model')"])
    first = probe.choose(default_gguf(), "auto")
    assert not first.extra_buffers and "could not run" in first.reason and "no such model" in first.reason
    assert not probe.choose(default_gguf(), "auto").extra_buffers
    assert len(started) == 2      # not kept: the next start tests again


def test_the_child_finds_the_package_from_any_folder(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PYTHONPATH", raising=False)
    # a child without the package would exit with an error ("could not run"); this one decoded or died
    # in the decode, whichever this CPU does
    assert_a_verdict_of_the_real_decode(probe.choose(default_gguf(), "auto"))


def test_the_verdict_belongs_to_one_model_file(monkeypatch, tmp_path):
    import shutil

    started = ran(monkeypatch)
    monkeypatch.setattr(probe, "PROBE_COMMAND", CRASH)
    assert not probe.choose(default_gguf(), "auto").extra_buffers
    copy = tmp_path / "other.gguf"
    shutil.copy(default_gguf(), copy)
    monkeypatch.setattr(probe, "PROBE_COMMAND", DECODES)
    assert probe.choose(copy, "auto").extra_buffers      # another file: tested on its own
    assert not probe.choose(default_gguf(), "auto").extra_buffers   # the first keeps its own verdict
    assert len(started) == 2


def test_the_verdict_belongs_to_one_cpu(monkeypatch):
    """A cache carried to a machine whose CPU reports AMX is not trusted there: it tests again."""
    started = ran(monkeypatch)
    cpu_reports(monkeypatch, "avx2", "avx512f")
    monkeypatch.setattr(probe, "PROBE_COMMAND", DECODES)
    assert probe.choose(default_gguf(), "auto").extra_buffers
    cpu_reports(monkeypatch, "avx2", "avx512f", "amx_tile", "amx_int8")
    monkeypatch.setattr(probe, "PROBE_COMMAND", CRASH)
    choice = probe.choose(default_gguf(), "auto")
    assert not choice.extra_buffers and "SIGSEGV" in choice.reason and "reports Intel AMX" in choice.reason
    assert len(started) == 2


def test_a_cache_that_cannot_be_written_only_means_testing_again(monkeypatch, tmp_path):
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the cache folder would be")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocked))
    monkeypatch.setattr(probe, "PROBE_COMMAND", CRASH)
    assert not probe.choose(default_gguf(), "auto").extra_buffers
    assert not os.path.isdir(blocked)


def test_amx_is_read_off_the_cpu_flags(monkeypatch):
    assert probe.has_amx({"avx2", "amx_tile", "amx_int8"})
    assert not probe.has_amx({"avx2", "avx512f"})
    cpu_reports(monkeypatch, "avx2", "amx_tile")
    assert probe.has_amx()
    cpu_reports(monkeypatch, "avx2", "avx512f")
    assert not probe.has_amx()
