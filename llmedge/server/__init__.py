"""The local REST server behind ``llmedge serve``: Ollama's native API and OpenAI's, on one engine worker.

Modules: ``app`` (the Starlette app and its routes), ``ollama`` / ``openai`` (request parsing and
response shapes of each API), ``scheduler`` (loaded models, keep-alive, the bounded request queue and
the engine worker thread), ``security`` (Host check, CORS, API key, body limit), ``grammar``
(structured output through llguidance) and ``metrics`` (Prometheus text).
"""
