"""/v1/audio/*: speech (piper, espeak-ng) and transcription and translation (faster-whisper)."""
