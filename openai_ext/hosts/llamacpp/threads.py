"""How many threads llama.cpp decodes with: as many as there are CPUs not busy with other work.

llama.cpp splits each step's work between its threads, which wait for each other at a barrier
after every operation. When another process takes a CPU, one of the threads is descheduled for a
time slice now and then and the others wait for it at every barrier: on two cores with one busy
process beside the server, eight streams on two threads got a quarter of their throughput, where
one thread on the free core keeps all of its own. So the count follows the machine: every second
the scheduler reads how much CPU time other processes took (Linux's /proc/stat, less this
process's own), and decodes with the CPUs left, at least one. A count that is set (the n_threads
setting) is kept as it is, and so is everything on systems without /proc.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Callable

log = logging.getLogger(__name__)

INTERVAL_S = 1.0


def usable_cpus() -> set[int]:
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):   # not on Linux
        return set(range(os.cpu_count() or 1))


def cores(cpus: set[int]) -> int:
    """Physical cores among ``cpus`` (CPUs that are hyperthreads of one core count once), as
    llama.cpp counts them for its own default; half the CPUs where Linux's sysfs does not tell."""
    seen = set()
    for cpu in cpus:
        try:
            with open(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list", encoding="ascii") as f:
                seen.add(f.read().strip())
        except OSError:
            return max(len(cpus) // 2, 1)
    return max(len(seen), 1)


def _cpu_ticks(cpus: set[int]) -> tuple[int, int] | None:
    """(busy, total) clock ticks of ``cpus`` since boot; None without /proc. Steal time counts as
    busy: on a virtual machine it is time the host gave to others."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            lines = f.readlines()
    except OSError:
        return None
    busy = total = 0
    for line in lines:
        name, _, rest = line.partition(" ")
        if not name.startswith("cpu") or name == "cpu" or int(name[3:]) not in cpus:
            continue
        v = [int(x) for x in rest.split()]
        user, nice, system, idle, iowait, irq, softirq, steal = (v + [0] * 8)[:8]
        busy += user + nice + system + irq + softirq + steal
        total += user + nice + system + idle + iowait + irq + softirq + steal
    return (busy, total) if total else None


def _own_ticks() -> int | None:
    try:
        with open("/proc/self/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(fields[11]) + int(fields[12])   # utime, stime


class Threads:
    """Decides the thread counts before each step and tells llama.cpp (``apply(gen, batch)``)
    when they change: llama.cpp uses ``gen`` threads for a step of one token (one sequence
    generating), ``batch`` for the others."""

    def __init__(self, apply: Callable[[int, int], None], *, fixed: int | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self._apply, self._clock = apply, clock
        self.cpus = usable_cpus()
        n = len(self.cpus)
        # one token a step: a thread per physical core, as llama.cpp's own default (a core's second
        # hardware thread slows a step that is all memory reads; on two cores without them, one
        # stream ran at 37-40 tokens/s on one thread and 47-54 on two)
        self.most_gen, self.most_batch = (fixed, fixed) if fixed else (min(cores(self.cpus), n), n)
        self.adaptive = fixed is None and _cpu_ticks(self.cpus) is not None and _own_ticks() is not None
        self.gen, self.batch = self.most_gen, self.most_batch
        self._pending: int | None = None
        self._last = self._sample()
        apply(self.gen, self.batch)

    def _sample(self) -> tuple[float, tuple[int, int] | None, int | None]:
        return self._clock(), _cpu_ticks(self.cpus), _own_ticks()

    def free_cpus(self, before, after) -> float | None:
        """CPUs that other processes left free between two samples."""
        (_, c0, o0), (_, c1, o1) = before, after
        if c0 is None or c1 is None or o0 is None or o1 is None or c1[1] <= c0[1]:
            return None
        busy, total = c1[0] - c0[0], c1[1] - c0[1]
        others = max(0.0, (busy - (o1 - o0)) / total)     # a share of all the CPUs
        return len(self.cpus) * (1.0 - others)

    def before_step(self) -> None:
        if not self.adaptive or self._clock() - self._last[0] < INTERVAL_S:
            return
        try:
            self._follow()
        except Exception:  # noqa: BLE001 - a reading gone wrong must not stop the decoding
            log.exception("the CPUs' load could not be read; the thread count stays at %d", self.batch)
            self.adaptive = False

    def _follow(self) -> None:
        now = self._sample()
        free = self.free_cpus(self._last, now)
        self._last = now
        if free is None:
            return
        wanted = max(1, min(self.most_batch, int(free + 0.5)))
        # a new count holds for two samples before it is used: a short burst moves nothing
        if wanted == self.batch or wanted != self._pending:
            self._pending = wanted if wanted != self.batch else None
            return
        self._pending = None
        self.batch, self.gen = wanted, max(1, min(self.most_gen, wanted))
        log.info("decoding with %d thread%s (%.1f of %d CPUs free of other work)", wanted,
                 "" if wanted == 1 else "s", free, len(self.cpus))
        self._apply(self.gen, self.batch)
