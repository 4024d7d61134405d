"""Speculative decoding: draft tokens that the target model verifies in one forward of k+1 rows.

Two drafters propose the next tokens of a sequence:

- :class:`LookupDrafter` (prompt lookup decoding, llama.cpp's ``--lookup``): where the last n tokens
  (n from ``ngram_max`` down to ``ngram_min``) occurred earlier in the context (prompt and answer so
  far), the tokens that followed that occurrence. Costs no model; pays on copy-heavy answers
  (editing, code, extraction, summaries quoting their source).
- :class:`ModelDrafter` (``--draft-model``): a small model with the same vocabulary decodes k tokens
  greedily in its own cache (stopping early when its top probability falls below ``p_min``), which is
  brought back to the target's sequence (rejected cells rolled back) before each draft.

:class:`Speculation` is one generation's state: its drafter, the adaptive draft length (doubled
after a fully accepted draft, cut to what was accepted plus one after a rejection, within
``draft_min`` / ``draft_max``) and the counts the timings report (drafted, accepted, verify
forwards). The engine verifies the rows ``[last token, d1..dk]`` with ``row_exact`` batches (every
row's logits bit for bit those of decoding it alone), takes tokens with
:meth:`llmedge.sampling.Sampler.verify` (greedy: identical output; sampling: the speculative
sampling acceptance for a deterministic draft, which leaves the distribution unchanged) and rolls
the rejected rows out of the cache.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from llmedge.errors import LlmedgeError
from llmedge.kvcache import SequenceCache, common_prefix

DEFAULT_DRAFT_MAX = 16  # llama.cpp's --draft-max
DEFAULT_LOOKUP_NGRAM = 3
LOOKUP_NGRAM_MIN = 2  # a single recurring token predicts too little to be worth its verify row
DEFAULT_P_MIN = 0.75  # llama.cpp's --draft-p-min
START_DRAFT = 4  # the first draft's length; doubled after each fully accepted one (each verify row costs)


@dataclass
class SpecConfig:
    """What speculation a generation uses: prompt lookup (``lookup`` = the longest n-gram matched,
    0: off) and/or a draft model (a :class:`DraftModel`), and the draft length bounds."""

    lookup: int = 0
    draft: DraftModel | None = None
    draft_max: int = DEFAULT_DRAFT_MAX
    draft_min: int = 0
    p_min: float = DEFAULT_P_MIN

    @property
    def active(self) -> bool:
        return (self.lookup > 0 or self.draft is not None) and self.draft_max > 0

    def check(self) -> SpecConfig:
        if self.lookup < 0:
            raise LlmedgeError(f"lookup n-gram size must be at least 1, not {self.lookup}")
        if self.draft_max < 0 or self.draft_min < 0:
            raise LlmedgeError("draft_max and draft_min must not be negative")
        if self.draft_min > self.draft_max:
            raise LlmedgeError(f"draft_min ({self.draft_min}) is larger than draft_max ({self.draft_max})")
        return self


class NgramIndex:
    """For every n-gram (n in [n_min, n_max]) of a growing token list, where it last occurred with a
    token after it; updated incrementally as tokens are appended."""

    def __init__(self, n_max: int, n_min: int = LOOKUP_NGRAM_MIN) -> None:
        self.n_max = max(1, n_max)
        self.n_min = max(1, min(n_min, self.n_max))
        self.last: list[dict[tuple[int, ...], int]] = [{} for _ in range(self.n_max + 1)]
        self.tokens: list[int] = []

    def sync(self, tokens: Sequence[int]) -> None:
        """Index ``tokens`` (a list that only grows, or is replaced: then it is indexed anew)."""
        n_old = len(self.tokens)
        if n_old > len(tokens) or (n_old and self.tokens[-1] != tokens[n_old - 1]) \
                or (n_old and self.tokens[0] != tokens[0]):
            self.__init__(self.n_max, self.n_min)  # type: ignore[misc]
            n_old = 0
        self.tokens.extend(int(t) for t in tokens[n_old:])
        toks = self.tokens
        for end in range(max(1, n_old), len(toks)):  # the n-grams ending just before token ``end``
            for n in range(self.n_min, self.n_max + 1):
                if end - n < 0:
                    break
                self.last[n][tuple(toks[end - n : end])] = end

    def propose(self, k: int) -> list[int]:
        """Up to ``k`` tokens that followed the latest earlier occurrence of the longest recurring
        suffix n-gram (none when no suffix of ``n_min`` tokens or more recurs)."""
        toks = self.tokens
        for n in range(min(self.n_max, len(toks)), self.n_min - 1, -1):
            j = self.last[n].get(tuple(toks[len(toks) - n :]))
            if j is not None:
                return toks[j : j + k]
        return []


class LookupDrafter:
    """Prompt lookup decoding: drafts copied from earlier in the context."""

    def __init__(self, ngram_max: int) -> None:
        self.index = NgramIndex(ngram_max)

    def propose(self, context: list[int], k: int) -> list[int]:
        self.index.sync(context)
        return self.index.propose(k)


class DraftModel:
    """A draft model (an :class:`llmedge.api.Model` with the target's vocabulary) and its caches, one
    per target sequence cache (so a server's slots each keep theirs)."""

    def __init__(self, model: Any, target_tokenizer: Any = None) -> None:
        self.model = model
        self.engine = model.engine
        if target_tokenizer is not None:
            check_same_vocab(target_tokenizer, model.tokenizer, getattr(model, "name", "the draft model"))
        self._caches: dict[int, tuple[Any, SequenceCache]] = {}

    def cache_for(self, target: SequenceCache) -> SequenceCache:
        entry = self._caches.get(id(target))
        if entry is None or entry[0] is not target:
            if len(self._caches) >= 16:  # the oldest target's cache goes (a server has few slots)
                self._caches.pop(next(iter(self._caches)))
            # the draft model's own sequence serves the first target, unless it is that target (a model
            # drafting for itself would roll back and extend the very cache it verifies in)
            own = self.engine.cache
            cache = own if not self._caches and own is not target else self.engine.new_cache()
            entry = self._caches[id(target)] = (target, cache)
        return entry[1]


def check_same_vocab(target: Any, draft: Any, name: str) -> None:
    """Refuse a draft model whose tokens are not the target's (ids would mean other text)."""
    a, b = getattr(target, "_tokens", None), getattr(draft, "_tokens", None)
    if a is None or b is None:
        return
    if len(a) != len(b) or list(a) != list(b):
        raise LlmedgeError(f"{name} has another vocabulary than the target model ({len(b)} vs {len(a)} tokens); "
                           "a draft model must share the target's tokenizer")


class ModelDrafter:
    """Greedy drafts from a :class:`DraftModel` in its own cache, kept in step with the target's."""

    def __init__(self, draft: DraftModel, target_cache: SequenceCache, p_min: float) -> None:
        self.draft = draft
        self.cache = draft.cache_for(target_cache)
        self.p_min = p_min

    def sync(self, context: list[int]) -> np.ndarray | None:
        """Bring the draft's cache to ``context`` (rejected drafts rolled back, new tokens evaluated);
        the logits after it, or None when it does not fit the draft's context."""
        eng, cache = self.draft.engine, self.cache
        if len(context) >= eng.n_ctx or not context:
            return None
        common = common_prefix(cache.tokens, context)
        if common == len(context):  # the last token must be evaluated for its logits
            common -= 1
        drop = cache.offset - common
        if drop <= DEFAULT_DRAFT_MAX + 2:
            cache.rollback(drop)  # rejected drafts: the newest cells, rewound in place
        else:
            cache.trim_to(common)  # clears the cache when a ring lost what the prefix needs
        return eng.forward(cache, context[cache.offset :])[-1]

    def prefill(self, context: list[int]) -> None:
        """Evaluate the prompt in the draft's cache too (with the target's prompt, not in decode time)."""
        self.sync(context)

    def propose(self, context: list[int], k: int) -> list[int]:
        if len(context) + k > self.draft.engine.n_ctx:
            return []
        eng, cache = self.draft.engine, self.cache
        logits = self.sync(context)
        if logits is None:
            return []
        out: list[int] = []
        while True:
            t = int(np.argmax(logits))
            if self.p_min > 0:
                z = logits - logits[t]
                p_top = 1.0 / float(np.exp(z, dtype=np.float64).sum())
                if p_top < self.p_min and out:
                    break
            out.append(t)
            if len(out) >= k:
                break
            logits = eng.forward(cache, [t])[-1]
        return out


class Speculation:
    """One generation's speculation: its drafters, the adaptive draft length and the counts.

    The draft length follows a cost model measured as the generation runs: a step without a draft
    costs ``t1``, one with n draft tokens ``t1 + c * n`` (drafting and the verify rows), and each draft
    token is accepted with probability ``a`` (accepted over accepted plus rejections), so a draft of k
    yields (1 - a^(k+1)) / (1 - a) tokens on average. k is the length with the best expected rate
    (0: plain decoding, then re-probed with a short draft every ``PROBE_EVERY`` steps; with a draft
    model, whose probes each catch its cache up, the interval doubles after every probe of it that
    leaves k at 0, up to ``PROBE_MAX``), so speculation turns itself off where its verify rows cost
    more than they save.

    A draft model whose tokens cost so much that no draft length pays even at ``A_MAX`` acceptance
    (the same model at a nearby precision: a Q4_1 draft of a Q8_0 target costs about a target step per
    token) is dropped for the rest of the generation once ``MIN_VERIFIES`` drafts of two tokens or more
    on average measured it (a one-token draft's cost is mostly fixed: the draft's catch-up, the verify
    forward): its probes would keep its cache in step with every token at a prefill's cost (measured
    14% slower than plain decoding on SmolLM2 Q8_0 with its Q4_1 draft). Acceptance depends on the
    text; that cost ratio does not. Other drafters (lookup) go on, their costs measured anew."""

    PROBE_EVERY = 16
    PROBE_MAX = 128
    A_MAX = 0.98
    MIN_VERIFIES = 3

    def __init__(self, config: SpecConfig, cache: SequenceCache) -> None:
        self.config = config
        self.drafters: list[Any] = []
        if config.lookup > 0:
            self.drafters.append(LookupDrafter(config.lookup))
        if config.draft is not None:
            self.drafters.append(ModelDrafter(config.draft, cache, config.p_min))
        self.k = max(1, min(config.draft_max, START_DRAFT))
        self.drafted = 0
        self.accepted = 0
        self.rejections = 0
        self.verifies = 0  # forwards that verified a draft
        self.decodes = 0  # decode forwards in all (with a draft or not)
        self.batched = 0  # decode steps that did not draft because other sequences shared the step
        self.t1: float | None = None  # seconds of a step without a draft (EMA)
        self.c: float | None = None  # seconds per draft token in a step with a draft (EMA)
        self.since_probe = 0
        self.probe_every = self.PROBE_EVERY
        self.probing = False  # the draft being verified is a probe
        self.last_drafter: Any = None  # the drafter that made it
        self.model_dropped = False

    def propose(self, context: list[int], room: int) -> list[int]:
        """A draft of at most ``room`` tokens to follow ``context`` (none: decode one token)."""
        k = min(self.k, room, self.config.draft_max)
        if self.t1 is None and self.verifies:
            return []  # drafts every step so far (a draft model): one plain step, to know what it costs
        if not self.drafters:
            return []
        if self.k == 0:
            self.since_probe += 1
            if self.since_probe < self.probe_every:
                return []
            self.since_probe = 0
            self.probing = True
            k = min(2, room, self.config.draft_max)
        if k <= 0 or k < self.config.draft_min:
            return []
        for d in self.drafters:
            draft = d.propose(context, k)
            if len(draft) >= max(1, self.config.draft_min):
                self.last_drafter = d
                return draft
        return []

    def prefill(self, context: list[int]) -> None:
        """The prompt is evaluated: drafters with a cache of their own evaluate it now."""
        for d in self.drafters:
            if hasattr(d, "prefill"):
                d.prefill(context)

    def record(self, n_draft: int, n_accepted: int, seconds: float | None = None) -> None:
        """Account for one decode step that verified ``n_draft`` tokens, ``n_accepted`` taken, in
        ``seconds`` (drafting included); then choose the next draft length."""
        self.decodes += 1
        if n_draft == 0:
            if seconds is not None:
                self.t1 = seconds if self.t1 is None else 0.8 * self.t1 + 0.2 * seconds
            return
        self.verifies += 1
        self.drafted += n_draft
        self.accepted += n_accepted
        self.rejections += n_accepted < n_draft
        if seconds is not None and self.t1 is not None:
            per = max(0.0, seconds - self.t1) / n_draft
            self.c = per if self.c is None else 0.7 * self.c + 0.3 * per
        self.k = self._best_k(n_draft, n_accepted)
        if self.probing:
            self.probing = False
            backoff = self.k == 0 and isinstance(self.last_drafter, ModelDrafter)
            self.probe_every = min(self.PROBE_MAX, 2 * self.probe_every) if backoff else self.PROBE_EVERY
        if (self.k == 0 and self.c is not None and self.verifies >= self.MIN_VERIFIES
                and self.drafted >= 2 * self.verifies  # one-token drafts price their fixed costs per token
                and any(isinstance(d, ModelDrafter) for d in self.drafters)
                and self._best_k(n_draft, n_accepted, self.A_MAX) == 0):
            self.drafters = [d for d in self.drafters if not isinstance(d, ModelDrafter)]
            self.model_dropped = True
            self.c = None  # the costs of what is left are measured anew
            self.k = max(1, min(self.config.draft_max, START_DRAFT)) if self.drafters else 0

    def _best_k(self, n_draft: int, n_accepted: int, a: float | None = None) -> int:
        """The draft length with the best expected rate at acceptance ``a`` (default: the measured one)."""
        lo, hi = max(1, self.config.draft_min), self.config.draft_max
        if self.t1 is None or self.c is None:  # no costs yet: grow on success, shrink on a miss
            return min(hi, max(lo, 2 * n_draft if n_accepted == n_draft else n_accepted + 1))
        if a is None:
            a = min(self.A_MAX, self.accepted / max(1, self.accepted + self.rejections))
        best_k, best = 0, 1.0 / self.t1
        for k in range(lo, hi + 1):
            rate = (1 - a ** (k + 1)) / (1 - a) / (self.t1 + self.c * k)
            if rate > best * 1.02:
                best_k, best = k, rate
        return best_k

    def stats(self) -> dict[str, float]:
        """What the timings report: drafted and accepted tokens, acceptance rate, decode forwards."""
        return {"draft_tokens": self.drafted, "draft_accepted": self.accepted,
                "draft_acceptance": self.accepted / self.drafted if self.drafted else 0.0,
                "decode_forwards": self.decodes, "verify_forwards": self.verifies,
                "draft_batched_steps": self.batched, "draft_model_dropped": int(self.model_dropped)}
