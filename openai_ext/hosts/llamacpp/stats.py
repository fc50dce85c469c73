"""What the batch scheduler (llamacpp/batch.py) has done, for the model info."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Stats:
    steps: int = 0
    decoded: int = 0            # tokens decoded, prompts and generated
    prompt_tokens: int = 0      # prompt tokens decoded
    reused_tokens: int = 0      # prompt tokens taken from cells already there instead
    copies: int = 0             # prefixes shared from another slot
    most_running: int = 0
    preempted: int = 0          # sequences that gave their cells back to let the others go on
    evicted: int = 0            # cached prefixes dropped to make room
    drafted: int = 0            # tokens drafted by speculation and checked
    accepted: int = 0           # drafted tokens the model agreed with
    passed: int = 0             # newcomers let in before one that waited for room
    stashed: int = 0            # idle slots' sequences moved to host memory (llamacpp/stash.py)
    restored: int = 0           # prompts whose start was copied back from there
    compacted: int = 0          # idle sequences moved together to the start of the cache while nothing ran
