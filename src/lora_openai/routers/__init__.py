"""The front's routes, one router per API area, as Triton's openai_frontend splits them
(frontend/fastapi/routers/): each route parses, calls Triton through the gateway, and answers
with an OpenAI body or server-sent events. They share `lora_openai.front` (settings, gateway,
catalog) and `lora_openai.streaming`.

  audio.py          /v1/audio/transcriptions, /v1/audio/translations (whisper_lora)
  chat.py           /v1/chat/completions (qwen_vl_lora)
  models.py         /v1/models, /v1/models/{id}
  admin.py          /v1/load_lora_adapter, /v1/unload_lora_adapter (admin keys only)
  realtime          GET /v1/realtime, a WebSocket (lora_openai.realtime.router)
  observability.py  /health, /metrics (the endpoint picker's protocol, per-key usage)
"""

from lora_openai.realtime import router as realtime
from lora_openai.routers import admin, audio, chat, models, observability

ROUTERS = (
    observability.router,
    models.router,
    audio.router,
    chat.router,
    admin.router,
    realtime.router,
)
