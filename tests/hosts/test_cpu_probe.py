"""Whether llama.cpp's extra CPU buffer types are used: forced by the repack setting, or found out
once by a test decode in a child process, which falls back to the safe buffer types when the child
dies or hangs. The child here is the real one on the real model, or a program that really
crashes or hangs."""

from __future__ import annotations

import os
import sys

import pytest

from openai_ext.hosts import llamacpp_probe as probe
from openai_ext.hosts.files import default_gguf

CRASH = [sys.executable, "-c", "import ctypes; ctypes.string_at(0)"]   # a real SIGSEGV
HANG = [sys.executable, "-c", "import time; time.sleep(60)"]


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
    # this machine's CPU and build decode with them (a CPU whose AMX path crashes says otherwise:
    # the next tests and test_standalone_process show that case)
    assert first.extra_buffers and "ran in a child process" in first.reason, first
    assert len(started) == 1 and started[0][:3] == probe.PROBE_COMMAND
    monkeypatch.setattr(probe, "PROBE_COMMAND", CRASH)     # would say otherwise, if it ran
    again = probe.choose(default_gguf(), "auto")
    assert again.extra_buffers and "kept from an earlier start" in again.reason
    assert len(started) == 1


def test_a_child_that_crashes_turns_them_off(monkeypatch):
    monkeypatch.setattr(probe, "PROBE_COMMAND", CRASH)
    choice = probe.choose(default_gguf(), "auto")
    assert not choice.extra_buffers and "SIGSEGV" in choice.reason and "--repack on" in choice.reason
    assert "off" in choice.line()


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
    assert probe.choose(default_gguf(), "auto").extra_buffers


def test_the_verdict_belongs_to_one_model_file(monkeypatch, tmp_path):
    import shutil

    started = ran(monkeypatch)
    monkeypatch.setattr(probe, "PROBE_COMMAND", CRASH)
    assert not probe.choose(default_gguf(), "auto").extra_buffers
    copy = tmp_path / "other.gguf"
    shutil.copy(default_gguf(), copy)
    monkeypatch.setattr(probe, "PROBE_COMMAND", [sys.executable, "-m", "openai_ext.hosts.llamacpp_probe"])
    assert probe.choose(copy, "auto").extra_buffers      # another file: tested on its own
    assert len(started) == 2


def test_a_cache_that_cannot_be_written_only_means_testing_again(monkeypatch, tmp_path):
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the cache folder would be")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocked))
    monkeypatch.setattr(probe, "PROBE_COMMAND", CRASH)
    assert not probe.choose(default_gguf(), "auto").extra_buffers
    assert not os.path.isdir(blocked)


def test_amx_is_read_off_the_cpu_flags():
    assert probe.has_amx({"avx2", "amx_tile", "amx_int8"})
    assert not probe.has_amx({"avx2", "avx512f"})
