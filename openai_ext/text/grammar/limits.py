"""How much work one request's schemas may cost, counted in schema nodes, grammar rules and bytes
(never in seconds), so turning any schema into a grammar is quick and the grammar is one llama.cpp
parses in milliseconds and samples with a few stacks at a time.

What a schema would need beyond these is not enforced by the grammar: for a strict schema that is
a 400 naming where, for any other it is left to the validation after generation (see rewrite).
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_STEPS = 50_000          # schema nodes rewritten (and enum values checked) per request
MAX_GRAMMAR_BYTES = 1 << 20  # grammar text per request
MAX_GRAMMAR_RULES = 20_000   # grammar rules per request
MAX_LITERAL_BYTES = 64 << 10  # the JSON text of one enum's values, or of one const
MAX_BRANCHES = 128          # branches of one anyOf/oneOf (after type lists are split)
MAX_LIVE = 256              # alternatives the grammar may follow at once (nested unions multiply)
MAX_PATTERN_CHARS = 4096    # one regular expression
MAX_PATTERN_NESTING = 32    # groups inside groups in one regular expression
MAX_AUTOMATON_STATES = 4096  # states of the automaton that combines patterns and lengths
MAX_MATCH_STEPS = 4_000_000  # characters x states when an enum value or const is matched to a pattern


class OverBudget(Exception):
    """The request's schemas need more than the limits above (``what`` says which; ``path``,
    where in the schema the allowance ran out, when known)."""

    def __init__(self, what: str, path: str | None = None):
        super().__init__(what)
        self.what, self.path = what, path


@dataclass
class Budget:
    """What is left of one request's allowance; every schema of the request draws on it."""
    steps: int = MAX_STEPS
    grammar_bytes: int = MAX_GRAMMAR_BYTES
    rules: int = MAX_GRAMMAR_RULES

    def step(self, n: int = 1, path: str | None = None) -> None:
        self.steps -= n
        if self.steps < 0:
            raise OverBudget(f"more than {MAX_STEPS} schema nodes and enum values", path)

    def grammar(self, body: str) -> None:
        self.grammar_bytes -= len(body) + 16
        self.rules -= 1
        if self.grammar_bytes < 0:
            raise OverBudget(f"a grammar of more than {MAX_GRAMMAR_BYTES} bytes")
        if self.rules < 0:
            raise OverBudget(f"more than {MAX_GRAMMAR_RULES} grammar rules")

    def give_back(self, body: str) -> None:
        """A rule written, then taken out again (its schema was relaxed)."""
        self.grammar_bytes += len(body) + 16
        self.rules += 1
