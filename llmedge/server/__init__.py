"""The local REST server behind ``llmedge serve``: Ollama's native API and OpenAI's, on one engine worker.

Modules: ``app`` (the Starlette app: the route table and the endpoints), ``config`` (``ServerConfig``
from flags and environment), ``generation`` (the one generation path: a typed request from any
protocol, the engine task, the typed deltas and result), ``ollama`` / ``openai`` (each protocol's
request parser and renderer), ``stream`` (the one NDJSON/SSE streaming loop), ``errors`` (the domain
errors and the one function rendering them), ``tools`` (tool calls: template support, forced-call
grammar, each family's syntax parsed back), ``scheduler`` (loaded models and their memory, keep-alive,
the bounded queue and the engine thread), ``security`` (Host check, CORS, API key, body limit),
``limits``, ``grammar`` (structured output through llguidance), ``embed`` and ``metrics``.
"""
