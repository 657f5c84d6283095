"""An OpenAI-compatible HTTP API in front of the Triton server (issue 15).

A separate process that holds no model: it turns OpenAI requests into whisper_lora /
qwen_vl_lora requests and sends them to Triton over gRPC (tritonclient.grpc.aio, one
bidirectional stream per request). Model ids are the Triton model names for the base models and
`<triton model>/<adapter>` for adapters.

  errors.py   OpenAIError (OpenAI's error JSON) and Triton error messages -> HTTP status
  triton.py   TritonGateway: the async gRPC client (stream a request, adapter listing, readiness)
  models.py   ModelCatalog: ids <-> (Triton model, adapter), live listing cached ~1 s
  audio.py    /v1/audio/*: form -> whisper_lora inputs; json/text/verbose_json/srt/vtt; SSE events
  chat.py     /v1/chat/completions: messages -> qwen_vl_lora inputs; completion and chunk bodies
  limits.py   request body size limit (ASGI middleware)
  front.py    FrontSettings; Front, what every route shares (gateway, catalog, tenancy)
  streaming.py  Triton's replies -> a whole answer or server-sent events
  routers/    one APIRouter per area: audio, chat, models, admin, observability; thin:
              parse -> gateway -> response or SSE
  app.py      create_app(): the routers on one FastAPI, errors as OpenAI's body
  cli.py      lora-openai --triton-url HOST:GRPC_PORT --port 9000
"""
