"""Stream assembly: stop strings across token boundaries, log-probabilities in step with text."""

import itertools
import random

import pytest

from openai_ext.text.assembly import ChoiceAssembler, Piece, StopMatcher, TokenLogprob


def run(stops, fragments):
    m = StopMatcher(stops)
    out = [m.push(f) for f in fragments]
    if not m.stopped:
        out.append(m.flush())
    return out, m.stopped


def test_no_stops_passes_text_through_unchanged():
    out, stopped = run([], ["Hel", "lo"])
    assert out == ["Hel", "lo", ""] and not stopped


def test_stop_inside_one_fragment_cuts_before_it():
    out, stopped = run(["END"], ["abcENDxyz"])
    assert "".join(out) == "abc" and stopped


@pytest.mark.parametrize("fragments", [
    ["Hello wo", "rld!"],
    ["Hello w", "o", "r", "l", "d", "!"],
    ["Hello ", "world", "!"],
    ["H", "e", "l", "l", "o", " ", "w", "o", "r", "l", "d", "!"],
])
def test_stop_split_across_fragments_never_leaks(fragments):
    out, stopped = run(["world"], fragments)
    assert stopped
    assert "".join(out) == "Hello "
    # no released fragment may carry any character of the stop string
    assert all("w" not in o for o in out)


def test_held_prefix_is_released_when_it_does_not_become_a_stop():
    out, stopped = run(["world"], ["Hello wo", "rm"])
    assert not stopped
    assert out[0] == "Hello "          # "wo" held back: could still become "world"
    assert "".join(out) == "Hello worm"


def test_first_completed_stop_wins_however_the_text_is_split():
    for fragments in (["xbbbz"], ["x", "b", "b", "b", "z"], ["xb", "bbz"]):
        out, stopped = run(["bb", "xbbb"], fragments)
        assert stopped and "".join(out) == "x", fragments


def test_overlapping_stop_prefixes():
    # "aab" must be found even though "aa" first looks like a prefix that fails
    out, stopped = run(["aab"], ["a", "a", "a", "b", "z"])
    assert stopped and "".join(out) == "a"


def test_randomised_splits_match_plain_find():
    rng = random.Random(7)
    alphabet = "ab\n"
    for _ in range(500):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30)))
        stops = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 4))) for _ in range(rng.randint(1, 3))]
        cuts = sorted(rng.sample(range(len(text) + 1), k=min(len(text) + 1, rng.randint(0, 6))))
        fragments = [text[i:j] for i, j in itertools.pairwise([0, *cuts, len(text)])]
        out, stopped = run(stops, fragments)
        # oracle: scan character by character, stop at the first completed stop string
        expected, hits = text, False
        for end in range(1, len(text) + 1):
            done = [text[:end].find(s) for s in stops if text[:end].endswith(s)]
            if done:
                expected, hits = text[:min(done)], True
                break
        assert "".join(out) == expected, (text, stops, fragments)
        assert stopped == bool(hits)


def test_held_back_tail_is_the_longest_that_could_start_a_stop():
    # What is held back after each push: the longest end of the text that begins some stop
    # string (checked against every end in turn), no more, so everything else goes out at once.
    rng = random.Random(11)
    alphabet = "ab<|\n"
    for _ in range(2000):
        stops = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 7))) for _ in range(rng.randint(1, 4))]
        buf = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12)))
        if any(s in buf for s in stops):
            continue
        want = max((k for k in range(1, len(buf) + 1) if any(s.startswith(buf[-k:]) for s in stops)), default=0)
        m = StopMatcher(stops)
        assert len(m.push(buf)) == len(buf) - want, (buf, stops)


def lp(tok):
    return TokenLogprob(token=tok, logprob=-0.5, bytes=list(tok.encode()))


def test_assembler_counts_tokens_and_reports_length():
    a = ChoiceAssembler(None)
    for t in ["a", "b", "c"]:
        a.feed(Piece(t))
    a.finish("length")
    assert (a.text, a.tokens, a.finish_reason) == ("abc", 3, "length")


def test_assembler_stop_sets_finish_reason_stop_and_counts_returned_tokens():
    a = ChoiceAssembler(["\n\n"])
    deltas = [a.feed(Piece(t)) for t in ["One", ".", "\n", "\n", "Two"]]
    assert a.stopped and a.finish_reason == "stop"
    assert a.text == "One."
    assert a.tokens == 2            # the stop string's tokens are not returned, so not counted
    assert deltas[-1] is None


def test_a_token_cut_by_the_stop_string_still_counts():
    a = ChoiceAssembler(["orld"])
    for t in ["The", " wor", "ld", " is"]:
        a.feed(Piece(t))
    assert (a.text, a.tokens) == ("The w", 2)   # " wor" gave " w"; "ld" is all stop string


def test_logprobs_are_released_with_their_text_and_cut_with_the_stop():
    a = ChoiceAssembler(["wor"], want_logprobs=True)
    got = []
    for t in ["Hel", "lo", " w", "or", "ld"]:
        d = a.feed(Piece(t, logprob=lp(t)))
        if d:
            got.append((d.text, [e.token for e in d.logprobs]))
    # " w" is held until we know "wor" follows; then the stop cuts inside " w"
    assert got == [("Hel", ["Hel"]), ("lo", ["lo"]), (" ", []), ("", [" w"])]
    assert a.text == "Hello " and [e.token for e in a.logprobs] == ["Hel", "lo", " w"]


def test_empty_pieces_from_partial_utf8_keep_alignment():
    a = ChoiceAssembler(None, want_logprobs=True)
    a.feed(Piece("", logprob=lp("\ufffd")))   # first byte of a multi-byte character
    d = a.feed(Piece("é", logprob=lp("é")))
    assert d.text == "é" and [e.token for e in d.logprobs] == ["é"]
    assert [e.token for e in a.logprobs] == ["\ufffd", "é"]


def test_unknown_token_counts_are_flagged():
    a = ChoiceAssembler(None)
    a.feed(Piece("text", tokens=None))
    assert not a.tokens_known
