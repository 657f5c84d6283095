"""Live transcription over a WebSocket (GET /v1/realtime), one concern per module:

events.py      both protocols' client events (checked) and server events (built)
vad.py         Silero VAD frame by frame on onnxruntime (no torch in the front)
turns.py       server_vad turn detection on per-frame speech probabilities
agreement.py   local agreement: partial text that is never retracted
session.py     one session: audio, turns, partial and final decodes, limits
transcribe.py  a turn's audio -> text through the file-upload path to whisper_lora
router.py      the WebSocket route
"""
