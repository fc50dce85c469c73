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
CRASH = [sys.executable, "-c", "import ctypes; ctypes.string_at(0)"]   # a real SIGSEGV, with them and without
# a build whose extra buffer types crash (a real SIGSEGV) and whose plain path decodes
CRASH_WITH_THEM = [sys.executable, "-c",
                   f"import sys, ctypes; '--plain' in sys.argv or ctypes.string_at(0); print({probe.PROBE_OK!r})"]
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
    # one child; two where it died with them (the second, without them, ran)
    children = 2 if "failed in a child process" in first.reason else 1
    assert len(started) == children and started[0][:3] == REAL
    # a child that would say otherwise, if it ran
    monkeypatch.setattr(probe, "PROBE_COMMAND", CRASH if first.extra_buffers else DECODES)
    again = probe.choose(default_gguf(), "auto")
    assert again.extra_buffers == first.extra_buffers
    assert again.reason.startswith(first.reason) and "kept from an earlier start" in again.reason
    assert len(started) == children


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
    started = ran(monkeypatch)
    monkeypatch.setattr(probe, "PROBE_COMMAND", CRASH_WITH_THEM)
    choice = probe.choose(default_gguf(), "auto")
    # a second child made sure the plain path runs before the server loads the model that way
    assert [cmd[-1] == "--plain" for cmd in started] == [False, True]
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
    monkeypatch.setattr(probe, "PROBE_COMMAND", CRASH_WITH_THEM)
    assert not probe.choose(default_gguf(), "auto").extra_buffers
    copy = tmp_path / "other.gguf"
    shutil.copy(default_gguf(), copy)
    monkeypatch.setattr(probe, "PROBE_COMMAND", DECODES)
    assert probe.choose(copy, "auto").extra_buffers      # another file: tested on its own
    assert not probe.choose(default_gguf(), "auto").extra_buffers   # the first keeps its own verdict
    assert len(started) == 3     # two for the first (with them, then without), one for the other


def test_the_verdict_belongs_to_one_cpu(monkeypatch):
    """A cache carried to a machine whose CPU reports AMX is not trusted there: it tests again."""
    started = ran(monkeypatch)
    cpu_reports(monkeypatch, "avx2", "avx512f")
    monkeypatch.setattr(probe, "PROBE_COMMAND", DECODES)
    assert probe.choose(default_gguf(), "auto").extra_buffers
    cpu_reports(monkeypatch, "avx2", "avx512f", "amx_tile", "amx_int8")
    monkeypatch.setattr(probe, "PROBE_COMMAND", CRASH_WITH_THEM)
    choice = probe.choose(default_gguf(), "auto")
    assert not choice.extra_buffers and "SIGSEGV" in choice.reason and "reports Intel AMX" in choice.reason
    assert len(started) == 3


def test_a_cache_that_cannot_be_written_only_means_testing_again(monkeypatch, tmp_path):
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the cache folder would be")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocked))
    monkeypatch.setattr(probe, "PROBE_COMMAND", CRASH_WITH_THEM)
    assert not probe.choose(default_gguf(), "auto").extra_buffers
    assert not os.path.isdir(blocked)


@pytest.mark.parametrize("amx", [True, False])
def test_a_build_that_crashes_without_them_too_is_refused_with_where_it_died(monkeypatch, amx):
    """A llama.cpp build can die on a machine whatever its buffer types (one crashed compiling its
    tokenizer's pattern while it loaded a model, on a CPU that also reported AMX): the server must
    not load the model in its own process, and must not blame AMX."""
    cpu_reports(monkeypatch, "avx2", *(["amx_tile", "amx_int8"] if amx else []))
    started = ran(monkeypatch)
    # the real child's first line, then a real SIGSEGV, with them and without
    monkeypatch.setattr(probe, "PROBE_COMMAND", [
        sys.executable, "-c", f"import ctypes; print({probe.PROBE_STAGE + 'load'!r}, flush=True); ctypes.string_at(0)"])
    with pytest.raises(probe.CannotRun) as caught:
        probe.choose(default_gguf(), "auto")
    message = str(caught.value)
    assert message.count("killed by SIGSEGV while loading the model") == 2, message
    assert "with its extra CPU buffer types" in message and "and without them" in message
    assert default_gguf().name in message and "--upstream-url" in message
    assert "AMX" not in message
    assert [cmd[-1] == "--plain" for cmd in started] == [False, True]
    # nothing kept: the next start tests again (a rebuilt llama.cpp may run)
    monkeypatch.setattr(probe, "PROBE_COMMAND", DECODES)
    assert probe.choose(default_gguf(), "auto").extra_buffers


def test_the_real_child_says_how_far_it_got_and_decodes_without_them(monkeypatch):
    """The stages a crash is placed by, and the plain path the server falls back on, read off
    the real child (which runs the plain path on any CPU: the server itself runs it)."""
    import subprocess

    done = subprocess.run([*REAL, str(default_gguf()), "--plain"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert [line for line in lines if line.startswith(probe.PROBE_STAGE)] == [
        probe.PROBE_STAGE + "load", probe.PROBE_STAGE + "decode"]
    assert lines[-1] == probe.PROBE_OK


def test_amx_is_read_off_the_cpu_flags(monkeypatch):
    assert probe.has_amx({"avx2", "amx_tile", "amx_int8"})
    assert not probe.has_amx({"avx2", "avx512f"})
    cpu_reports(monkeypatch, "avx2", "amx_tile")
    assert probe.has_amx()
    cpu_reports(monkeypatch, "avx2", "avx512f")
    assert not probe.has_amx()


def test_the_standalone_server_refuses_such_a_build_in_one_line_at_start(monkeypatch, capsys):
    from openai_ext.__main__ import main

    monkeypatch.setattr(probe, "PROBE_COMMAND", CRASH)
    assert main(["--model", str(default_gguf()), "--port", "0"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("Cannot load the model: llama.cpp crashed in a test child process"), err
    assert "Traceback" not in err
