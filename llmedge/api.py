"""The public Python API: ``llmedge.load`` and the :class:`Model` it returns."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from llmedge.backends import choose_backend, make_backend
from llmedge.engine import Chunk, Engine, Timings
from llmedge.errors import LlmedgeError
from llmedge.gguf import GGUFFile
from llmedge.models import model_class
from llmedge.sampling import Sampler, SamplingOptions
from llmedge.template import ChatTemplate
from llmedge.tokenizer import Tokenizer

_SAMPLING_FIELDS = set(SamplingOptions.__dataclass_fields__)


class Model:
    """A loaded GGUF model: tokenizer, chat template, forward pass and an engine to generate with."""

    def __init__(self, path: Path, backend: str = "auto", n_ctx: int = 4096, n_threads: int | None = None,
                 kv_type: str = "f16", n_batch: int = 512, name: str | None = None) -> None:
        t0 = time.perf_counter_ns()
        self.path = Path(path)
        self.name = name or self.path.name
        self.gguf = GGUFFile(self.path)
        self.backend_name, self.backend_reason = choose_backend(backend)
        self.backend = make_backend(self.backend_name, n_threads)
        self.tokenizer = Tokenizer.from_metadata(self.gguf.metadata)
        self.template = ChatTemplate.from_metadata(self.gguf.metadata, self.tokenizer)
        self.model = model_class(self.gguf.architecture)(self.gguf, self.backend)
        self.params = self.model.params
        if n_ctx <= 0:
            n_ctx = self.params.n_ctx_train
        if n_ctx < 8:
            raise LlmedgeError(f"a context of {n_ctx} tokens is too small")
        self.n_ctx = min(n_ctx, self.params.n_ctx_train)
        self.engine = Engine(self.model, self.tokenizer, self.n_ctx, n_batch, kv_type,
                             load_duration=time.perf_counter_ns() - t0)

    # -- text <-> tokens -------------------------------------------------------------------------
    def tokenize(self, text: str, add_bos: bool = False, special: bool = False) -> list[int]:
        return self.tokenizer.encode(text, add_bos=add_bos, special=special)

    def detokenize(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids))

    def apply_chat_template(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> str:
        return self.template.render(messages, add_generation_prompt=add_generation_prompt)

    def prompt_ids(self, prompt: str | Sequence[int], raw: bool = False) -> list[int]:
        """Token ids for a prompt: a chat-templated user message unless ``raw`` or already ids."""
        if not isinstance(prompt, str):
            return [int(t) for t in prompt]
        if raw:
            return self.tokenize(prompt, add_bos=True, special=True)
        return self.template.encode([{"role": "user", "content": prompt}])

    # -- evaluation ------------------------------------------------------------------------------
    def logits(self, ids: Sequence[int]) -> np.ndarray:
        """float32 [len(ids), n_vocab]: the logits at every position, in a fresh context."""
        return self.engine.logits([int(t) for t in ids])

    def generate(self, prompt: str | Sequence[int], raw: bool = False, max_tokens: int = 128,
                 stop: Sequence[str] = (), **options: Any) -> Iterator[Chunk]:
        """Stream :class:`Chunk` s; options are Ollama's names (temperature, top_k, seed, ...)."""
        if "num_predict" in options:
            max_tokens = options.pop("num_predict")
        unknown = set(options) - _SAMPLING_FIELDS
        if unknown:
            raise LlmedgeError(f"unknown generation option(s): {', '.join(sorted(unknown))}")
        sampler = Sampler(SamplingOptions(**options))
        if isinstance(stop, str):
            stop = (stop,)
        return self.engine.generate(self.prompt_ids(prompt, raw), sampler, max_tokens, tuple(stop))

    def chat(self, messages: list[dict[str, Any]], **options: Any) -> Iterator[Chunk]:
        return self.generate(self.template.encode(messages), **options)

    @property
    def timings(self) -> Timings:
        """Timings of the last generation, in Ollama's terms (nanoseconds)."""
        return self.engine.last


def load(model: str | Path, backend: str = "auto", n_ctx: int = 4096, n_threads: int | None = None,
         kv_type: str = "f16", pull: bool = True, progress: Any = None) -> Model:
    """Load a catalog name, a store name or a path to a ``.gguf`` file (pulling a catalog name if needed)."""
    from llmedge.store import Store

    path = Store().resolve(str(model), pull=pull, progress=progress)
    return Model(path, backend=backend, n_ctx=n_ctx, n_threads=n_threads, kv_type=kv_type, name=str(model))
