"""The Realtime API (``/v1/realtime``): spoken conversations over a WebSocket, on the local
engines (Whisper in, the text model, speech out)."""
