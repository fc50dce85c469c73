"""Voice activity detection before decoding: the speech is cut out of the silence and decoded as
one stretch, and the decoded times are put back on the original audio's clock.

faster-whisper's own ``vad_filter`` does this too, but maps a segment's start and its end each on
its own, by the chunk of speech that time falls in. Whisper hears each cut as a short pause (the
padding of the chunks on either side) and puts the boundary between two segments anywhere in it:
at the end of the speech before or at the start of the speech after, as the CPU's numerics go.
A start a few hundredths before the cut was mapped into the earlier chunk, so the segment began
seconds before its speech, in the silence that was cut out (and an end just after a cut ended
seconds late). Here a segment is placed by the chunks that hold its speech.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Iterator

from .decode import SAMPLE_RATE as RATE

if TYPE_CHECKING:
    import numpy as np

# Whisper's boundary in a pause lands near the speech on either side of it, and may reach a little
# into that speech (by its 20 ms steps and the VAD's 32 ms windows): a segment's part in a chunk
# up to this much longer than the chunk's padding is still taken for the pause.
MARGIN_S = 0.2
# Chunks less than one of whisper's time steps (20 ms) apart are one stretch of audio.
TOUCHING = RATE // 50


def cut_silence(audio: "np.ndarray", *, threshold: float, silence_ms: int,
                padding_ms: int) -> tuple["np.ndarray", "SpeechMap"]:
    """The speech of ``audio`` (float32 mono 16 kHz) joined into one array, and the map from its
    times back to those of ``audio``."""
    import numpy as np
    from faster_whisper.vad import VadOptions, collect_chunks, get_speech_timestamps

    chunks = get_speech_timestamps(audio, VadOptions(threshold=threshold, min_silence_duration_ms=silence_ms,
                                                     speech_pad_ms=padding_ms), sampling_rate=RATE)
    # Chunks whose padding met in a short pause are one stretch of audio (the VAD may leave a
    # sample between them), as are chunks a mere step apart: joined, so that only the cuts whisper
    # hears as a pause are taken for one.
    merged: list[dict[str, int]] = []
    for chunk in chunks:
        if merged and chunk["start"] - merged[-1]["end"] < TOUCHING:
            merged[-1] = {"start": merged[-1]["start"], "end": max(merged[-1]["end"], chunk["end"])}
        else:
            merged.append({"start": chunk["start"], "end": chunk["end"]})
    pieces, _ = collect_chunks(audio, merged, sampling_rate=RATE)
    return np.concatenate(pieces), SpeechMap(merged, padding_ms / 1000)


class SpeechMap:
    """Where each chunk of speech (sample spans of the original audio, in order, as joined) lies
    in the joined audio, and how to put a decoded segment back on the original clock."""

    def __init__(self, chunks: list[dict[str, int]], padding_s: float):
        from faster_whisper.vad import SpeechTimestampsMap

        self.map = SpeechTimestampsMap(chunks, RATE) if chunks else None
        ends = [end / RATE for end in (self.map.chunk_end_sample if self.map else [])]
        self.spans = list(zip([0.0] + ends[:-1], ends, strict=False))     # each chunk in the joined audio, seconds
        # how much of a chunk next to a cut is pause: its padding, and whisper's reach into speech
        self.pause = padding_s + MARGIN_S

    def place(self, start: float, end: float) -> tuple[float, float]:
        """``start``-``end`` of the joined audio on the original clock. An end of the span that lies
        in the pause around a cut belongs with the speech across it: the chunks at either edge
        holding no more of it than that pause are left out. A span lying wholly in such a pause
        goes with the chunk holding its middle. Either way start and end stay inside the chunks
        kept, never in silence that was cut out."""
        if self.map is None:
            return start, end
        first = self.map.get_chunk_index(start)
        last = max(first, self.map.get_chunk_index(end, is_end=True))
        held = [k for k in range(first, last + 1)
                if min(end, self.spans[k][1]) - max(start, self.spans[k][0]) > self.pause]
        if held:
            first, last = held[0], held[-1]
        elif first < last:
            first = last = self.map.get_chunk_index((start + end) / 2)
        start = max(start, self.spans[first][0])
        end = max(start, min(end, self.spans[last][1]))
        return self.map.get_original_time(start, first), self.map.get_original_time(end, last)

    def restore(self, segments: Iterator[Any]) -> Iterator[Any]:
        """faster-whisper's segments (and their words) with times of the original audio. Closing
        this closes ``segments``, which stops decoding."""
        try:
            for segment in segments:
                if segment.words:
                    # as faster-whisper does: each word placed on its own, the segment spanning them
                    words = []
                    for word in segment.words:
                        start, end = self.place(word.start, word.end)
                        words.append(dataclasses.replace(word, start=start, end=end))
                    yield dataclasses.replace(segment, start=words[0].start, end=words[-1].end, words=words)
                else:
                    start, end = self.place(segment.start, segment.end)
                    yield dataclasses.replace(segment, start=start, end=end)
        finally:
            close = getattr(segments, "close", None)
            if close:
                close()
