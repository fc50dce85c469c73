"""The way from the speech-only audio whisper decodes back to the original audio's clock, on the
chunks the VAD finds in the transcription tests' audio: 7.94 s of speech, 6 s of silence, 4 s of
speech, cut with the "auto" chunking's padding of 0.4 s."""

from __future__ import annotations

import numpy as np
import pytest

from openai_ext.audio import vad

pytestmark = pytest.mark.engines
pytest.importorskip("faster_whisper")

CHUNKS = [{"start": 0, "end": 132352}, {"start": 217856, "end": 286961}]   # 0-8.272 s, 13.616-17.935 s
CUT = 8.272                 # where the two chunks meet in the joined audio
SECOND = 13.62              # where the second chunk begins on the original clock (rounded as whisper's times)


def speech_map() -> vad.SpeechMap:
    return vad.SpeechMap(CHUNKS, padding_s=0.4)


@pytest.mark.parametrize("start", [CUT - 0.3, CUT - 0.02, CUT, CUT + 0.02, CUT + 0.4])
def test_a_start_in_the_pause_goes_with_the_speech_after_it(start):
    # the segment of the second sentence, wherever whisper put its start in the pause at the cut:
    # never before the second chunk (faster-whisper's own mapping put 8.25 at 8.25 s, in the
    # silence that was cut out, seconds before the speech)
    placed_start, placed_end = speech_map().place(start, 12.4)
    assert placed_start == max(SECOND, round(start + 13.616 - CUT, 2))
    assert placed_end == 17.74


@pytest.mark.parametrize("end", [CUT - 0.3, CUT - 0.02, CUT, CUT + 0.02, CUT + 0.41])
def test_an_end_in_the_pause_goes_with_the_speech_before_it(end):
    assert speech_map().place(4.88, end) == (4.88, round(min(end, CUT), 2))


def test_a_segment_with_speech_on_both_sides_of_a_cut_spans_it():
    assert speech_map().place(6.0, 10.0) == (6.0, 15.34)


def test_a_segment_wholly_in_the_pause_goes_by_its_middle():
    assert speech_map().place(8.1, 8.3) == (8.1, 8.27)
    assert speech_map().place(8.2, 8.5) == (SECOND, 13.84)
    # within one chunk nothing moves
    assert speech_map().place(8.0, 8.2) == (8.0, 8.2)


def test_no_speech_found_leaves_times_alone():
    assert vad.SpeechMap([], padding_s=0.4).place(1.0, 2.0) == (1.0, 2.0)


def test_restore_places_segments_and_words_and_closes_the_decoder():
    from faster_whisper.transcribe import Segment, Word

    def segment(start, end, text, words=None):
        return Segment(id=1, seek=0, start=start, end=end, text=text, tokens=[], avg_logprob=-0.1,
                       compression_ratio=1.0, no_speech_prob=0.0, words=words, temperature=0.0)
    closed = []

    def decoded():
        try:
            yield segment(4.88, 8.0, " and warm.")
            yield segment(8.0, 12.4, " Please remember your umbrella.")
            yield segment(8.0, 9.0, " Please", [Word(8.0, 8.9, " Please", 0.9), Word(8.9, 9.0, " remember", 0.9)])
            yield segment(12.4, 12.5, " never decoded")
        finally:
            closed.append(True)
    restored = speech_map().restore(decoded())
    assert [(s.start, s.end) for s in [next(restored), next(restored)]] == [(4.88, 8.0), (SECOND, 17.74)]
    with_words = next(restored)
    assert [(w.start, w.end) for w in with_words.words] == [(SECOND, 14.24), (14.24, 14.34)]
    assert (with_words.start, with_words.end) == (SECOND, 14.34)
    restored.close()
    assert closed == [True]


def test_touching_chunks_are_one_stretch(monkeypatch):
    # padding that met in a short pause can leave a sample between two chunks: no cut, no pause
    import faster_whisper.vad as fw_vad

    monkeypatch.setattr(fw_vad, "get_speech_timestamps",
                        lambda audio, options, sampling_rate: [{"start": 0, "end": 8001}, {"start": 8002, "end": 16000},
                                                               {"start": 40000, "end": 48000}])
    audio = np.arange(48000, dtype=np.float32)
    joined, speech = vad.cut_silence(audio, threshold=0.5, silence_ms=500, padding_ms=200)
    assert np.array_equal(joined, np.concatenate([audio[:16000], audio[40000:48000]]))
    assert speech.spans == [(0.0, 1.0), (1.0, 1.5)]
    assert speech.place(0.45, 0.9) == (0.45, 0.9)       # across where the first two met: as decoded
    assert speech.place(0.6, 1.3) == (0.6, 1.0)         # a real cut at 1 s
