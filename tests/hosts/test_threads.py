"""The embedded host's thread count follows the CPUs that other processes leave free."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest

from openai_ext.hosts.llamacpp import threads as lt


class Machine:
    """/proc's clock ticks, as a test sets them: four CPUs, 100 ticks a second each."""

    def __init__(self, monkeypatch):
        self.t, self.busy, self.total, self.own = 0.0, 0, 0, 0
        monkeypatch.setattr(lt, "usable_cpus", lambda: {0, 1, 2, 3})
        monkeypatch.setattr(lt, "cores", lambda cpus: 2)   # two cores of two hardware threads each
        monkeypatch.setattr(lt, "_cpu_ticks", lambda cpus: (self.busy, self.total))
        monkeypatch.setattr(lt, "_own_ticks", lambda: self.own)

    def second(self, own_cpus: float, other_cpus: float) -> None:
        """One second in which this process used ``own_cpus`` CPUs and others ``other_cpus``."""
        self.t += 1.0
        self.total += 400
        self.own += int(own_cpus * 100)
        self.busy += int((own_cpus + other_cpus) * 100)


def governed(machine, **kw):
    applied = []
    threads = lt.Threads(lambda gen, batch: applied.append((gen, batch)), clock=lambda: machine.t, **kw)
    return threads, applied


def test_it_starts_with_every_cpu_and_a_thread_per_core_for_one_token(monkeypatch):
    threads, applied = governed(Machine(monkeypatch))
    assert applied == [(2, 4)] and threads.adaptive


def test_cores_count_hyperthreads_of_one_core_once(monkeypatch, tmp_path):
    import builtins

    siblings = {0: "0,2", 1: "1,3", 2: "0,2", 3: "1,3", 4: "4", 5: "5"}
    real_open = builtins.open

    def sysfs(path, *args, **kw):
        if str(path).startswith("/sys/devices/system/cpu/"):
            cpu = int(str(path).split("/cpu/cpu")[1].split("/")[0])
            if cpu not in siblings:
                raise FileNotFoundError(path)
            f = tmp_path / f"cpu{cpu}"
            f.write_text(siblings[cpu] + "\n")
            return real_open(f, *args, **kw)
        return real_open(path, *args, **kw)
    monkeypatch.setattr(builtins, "open", sysfs)
    assert lt.cores({0, 1, 2, 3}) == 2          # two cores, two hardware threads each
    assert lt.cores({0, 1, 2, 3, 4, 5}) == 4
    assert lt.cores({4, 5}) == 2                # two cores without a second thread
    assert lt.cores({0, 1, 7, 8}) == 2          # no sysfs for some: half the CPUs


def test_busy_cpus_are_left_to_their_processes_once_it_lasts_and_taken_back_after(monkeypatch):
    machine = Machine(monkeypatch)
    threads, applied = governed(machine)
    for own, others, expected in [(4.0, 0.0, (2, 4)),    # alone: all of them
                                  (2.7, 1.3, (2, 4)),    # another process took a CPU: seen once ...
                                  (2.7, 1.3, (2, 3)),    # ... and again: one CPU left to it
                                  (3.0, 1.0, (2, 3)),
                                  (1.0, 3.0, (2, 3)),    # a burst of three others, once
                                  (2.9, 0.1, (2, 3)),    # gone again: nothing changes yet
                                  (3.0, 0.0, (2, 4)),    # free for two seconds: taken back
                                  (1.0, 3.0, (2, 4)),
                                  (1.0, 3.0, (1, 1))]:   # three busy: one thread, for both
        machine.second(own, others)
        threads.before_step()
        assert applied[-1] == expected, (own, others, applied)


def test_it_checks_once_a_second(monkeypatch):
    machine = Machine(monkeypatch)
    threads, applied = governed(machine)
    machine.second(1.0, 3.0)
    threads.before_step()
    machine.t += 0.5                     # half a second later: no new reading
    machine.busy += 150
    machine.total += 200
    threads.before_step()
    assert applied == [(2, 4)]


def test_a_count_that_is_set_is_kept(monkeypatch):
    machine = Machine(monkeypatch)
    threads, applied = governed(machine, fixed=3)
    for _ in range(3):
        machine.second(1.0, 3.0)
        threads.before_step()
    assert applied == [(3, 3)] and not threads.adaptive


def test_without_proc_it_keeps_its_first_counts(monkeypatch):
    machine = Machine(monkeypatch)
    monkeypatch.setattr(lt, "_cpu_ticks", lambda cpus: None)
    threads, applied = governed(machine)
    machine.second(1.0, 3.0)
    threads.before_step()
    assert applied == [(2, 4)] and not threads.adaptive


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux") or len(lt.usable_cpus()) < 2,
                    reason="needs Linux's /proc and two CPUs")
def test_the_real_host_gives_busy_cpus_to_their_processes(llama_host):
    """Every CPU but one kept busy by another process while the real host generates: it comes
    down to one thread (no timing is asserted: it is waited for, as the host reports it)."""
    from test_batching import GREEDY, prompt

    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(len(lt.usable_cpus()) - 1)]
    stop = threading.Event()
    try:
        for _ in llama_host.generate(prompt(llama_host, "Write a long story."),
                                     GREEDY.replace(max_new_tokens=100_000, samplers={"ban_eos_token": True}), stop):
            if llama_host.threads.batch == 1:
                stop.set()
        assert llama_host.threads.batch == llama_host.threads.gen == 1
    finally:
        for hog in hogs:
            hog.kill()


def test_a_reading_that_fails_leaves_the_count_as_it_is(monkeypatch):
    machine = Machine(monkeypatch)
    threads, applied = governed(machine)

    def broken(cpus):
        raise ValueError("a line /proc/stat never had")
    monkeypatch.setattr(lt, "_cpu_ticks", broken)
    machine.second(1.0, 3.0)
    threads.before_step()
    assert applied == [(2, 4)] and not threads.adaptive
