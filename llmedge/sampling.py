"""Token sampling: a chain of small pure steps over logits and one seeded generator per request.

The order follows llama.cpp's default chain: penalties, top-k, typical, top-p, min-p, temperature,
then a draw. A temperature of 0 is greedy: the argmax of the raw logits, nothing else.
Each step takes and returns ``(ids, logits)`` restricted to the surviving candidates.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from llmedge.errors import LlmedgeError

Candidates = tuple[np.ndarray, np.ndarray]  # (token ids, float64 logits), same length


class OptionError(LlmedgeError, ValueError):
    """An argument or option of the wrong type or outside its range; the message names it and the range."""


def _shown(value: Any) -> str:
    return repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."


def check_int(name: str, value: Any, low: int, what: str = "", none_ok: bool = False) -> int | None:
    """``value`` as an int when it is an integer >= ``low`` (None too with ``none_ok``); else OptionError
    naming ``name``, the range and what the range means (``what``)."""
    if value is None and none_ok:
        return None
    if isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= low:
        return int(value)
    none = " or None" if none_ok else ""
    raise OptionError(f"{name} must be an integer >= {low}{none}{f' ({what})' if what else ''}, not {_shown(value)}")


def check_real(name: str, value: Any, low: float, high: float | None = None, low_open: bool = False,
               what: str = "") -> float:
    """``value`` as a float when it is a finite number in the range (``low`` excluded with ``low_open``);
    else OptionError naming ``name`` and the range."""
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        v = float(value)
        if math.isfinite(v) and (v > low if low_open else v >= low) and (high is None or v <= high):
            return v
    if high is not None:
        span = f" in {'(' if low_open else '['}{low:g}, {high:g}]"
    elif low == -math.inf:
        span = ""
    else:
        span = f" {'>' if low_open else '>='} {low:g}"
    raise OptionError(f"{name} must be a finite number{span}{f' ({what})' if what else ''}, not {_shown(value)}")


@dataclass
class SamplingOptions:
    """The options a request may set, with Ollama's names and llama.cpp's defaults.

    Ranges (checked on construction, OptionError otherwise): temperature >= 0 (0: greedy); top_k an
    integer >= -1 (0 or -1: no limit); top_p, min_p and typical_p in [0, 1] (top_p and typical_p 1,
    min_p 0: off); repeat_penalty >= 0 (1: off; 0 is stored as 1, see below); repeat_last_n an integer >= -1 (0: no penalties, -1:
    the whole history); presence_penalty and frequency_penalty finite; seed an integer or None
    (None or negative: a random seed, stored as None).

    A repeat_penalty of 0 means no penalty, as Ollama's own runner reads it (x/mlxrunner/sample:
    ``RepeatPenalty <= 0`` becomes 1): llama.cpp would divide the logits of every recent token by 0
    and repeat them for ever, and the server's limits accept 0 as Ollama's API does.
    """

    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    typical_p: float = 1.0
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None

    def __post_init__(self) -> None:
        self.temperature = check_real("temperature", self.temperature, 0.0, what="0 is greedy")
        self.top_k = check_int("top_k", self.top_k, -1, "0 or -1: no limit")
        for name in ("top_p", "min_p", "typical_p"):
            setattr(self, name, check_real(name, getattr(self, name), 0.0, 1.0))
        self.repeat_penalty = check_real("repeat_penalty", self.repeat_penalty, 0.0,
                                         what="0 or 1: no penalty") or 1.0
        self.repeat_last_n = check_int("repeat_last_n", self.repeat_last_n, -1, "-1: the whole history")
        for name in ("presence_penalty", "frequency_penalty"):
            setattr(self, name, check_real(name, getattr(self, name), -math.inf))
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, numbers.Integral)):
            raise OptionError(f"seed must be an integer or None (negative: random), not {_shown(self.seed)}")
        self.seed = None if self.seed is None or self.seed < 0 else int(self.seed)


def apply_penalties(logits: np.ndarray, history: Sequence[int], repeat: float, presence: float,
                    frequency: float) -> np.ndarray:
    """llama.cpp's penalties over the full vocabulary: divide positive logits by ``repeat`` (multiply
    negative ones), then subtract ``presence`` once and ``frequency`` per occurrence in ``history``."""
    if len(history) == 0 or (repeat == 1.0 and presence == 0.0 and frequency == 0.0):
        return logits
    seen, counts = np.unique(np.asarray(history, dtype=np.int64), return_counts=True)
    ok = (seen >= 0) & (seen < len(logits))
    seen, counts = seen[ok], counts[ok]
    out = logits.copy()
    v = out[seen]
    out[seen] = np.where(v > 0, v / repeat, v * repeat) - counts * frequency - presence
    return out


def top_k(c: Candidates, k: int) -> Candidates:
    ids, logits = c
    if k <= 0 or k >= len(ids):
        return c
    keep = np.argpartition(-logits, k - 1)[:k]
    return ids[keep], logits[keep]


def _sorted_probs(c: Candidates) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    ids, logits = c
    order = np.argsort(-logits, kind="stable")
    ids, logits = ids[order], logits[order]
    p = np.exp(logits - logits[0])
    return ids, logits, p / p.sum()


def top_p(c: Candidates, p: float) -> Candidates:
    if p >= 1.0:
        return c
    ids, logits, probs = _sorted_probs(c)
    n = int(np.searchsorted(np.cumsum(probs), p) + 1)
    return ids[:n], logits[:n]


def min_p(c: Candidates, p: float) -> Candidates:
    if p <= 0.0:
        return c
    ids, logits = c
    keep = logits >= logits.max() + np.log(p)
    return ids[keep], logits[keep]


def typical(c: Candidates, p: float) -> Candidates:
    """Locally typical sampling: keep tokens whose surprise is closest to the entropy, mass ``p``."""
    if p >= 1.0:
        return c
    ids, logits, probs = _sorted_probs(c)
    logp = np.log(np.maximum(probs, 1e-300))
    entropy = -np.sum(probs * logp)
    order = np.argsort(np.abs(-logp - entropy), kind="stable")
    n = int(np.searchsorted(np.cumsum(probs[order]), p) + 1)
    keep = order[:n]
    return ids[keep], logits[keep]


def softmax(logits: np.ndarray) -> np.ndarray:
    e = np.exp(logits - logits.max())
    return e / e.sum()


class Sampler:
    """One request's sampler: the option chain plus its own seeded random generator."""

    def __init__(self, options: SamplingOptions | None = None) -> None:
        self.options = o = options or SamplingOptions()
        self.rng = np.random.default_rng(o.seed)

    @property
    def greedy(self) -> bool:
        return self.options.temperature <= 0.0

    @property
    def speculative(self) -> bool:
        """Whether drafted tokens may be verified with this sampler (:meth:`verify`): its state must be
        only the history; a grammar matcher's or a log-prob recorder's (subclasses) is not."""
        return getattr(self, "matcher", None) is None and not getattr(self, "logprobs", False)

    def _penalized(self, logits: np.ndarray, history: Sequence[int]) -> np.ndarray:
        o = self.options
        # repeat_last_n: 0 disables the penalties' window, -1 means the whole history (llama.cpp)
        n = len(history) if o.repeat_last_n < 0 else o.repeat_last_n
        recent = history[max(0, len(history) - n):] if n else ()
        return apply_penalties(logits.astype(np.float64), recent, o.repeat_penalty, o.presence_penalty,
                               o.frequency_penalty)

    def distribution(self, logits: np.ndarray, history: Sequence[int] = ()) -> tuple[np.ndarray, np.ndarray]:
        """The candidates a draw picks from and their probabilities, after the whole chain (not for
        greedy sampling, whose pick is the argmax)."""
        o = self.options
        c: Candidates = (np.arange(len(logits)), self._penalized(logits, history))
        c = top_k(c, o.top_k)
        c = typical(c, o.typical_p)
        c = top_p(c, o.top_p)
        c = min_p(c, o.min_p)
        ids, lg = c
        return ids, softmax(lg / o.temperature)

    @property
    def penalized(self) -> bool:
        """Whether any penalty (repeat, presence, frequency) changes the logits."""
        o = self.options
        return o.repeat_penalty != 1.0 or o.presence_penalty != 0.0 or o.frequency_penalty != 0.0

    def sample(self, logits: np.ndarray, history: Sequence[int] = ()) -> int:
        if self.greedy:
            # without penalties, the argmax of the logits themselves: widening to float64 is exact and
            # keeps their order, and a vocabulary-sized copy per token is a server step's cost per stream
            return int(np.argmax(self._penalized(logits, history) if self.penalized else logits))
        ids, probs = self.distribution(logits, history)
        return int(ids[self.rng.choice(len(ids), p=probs)])

    def verify(self, logits: np.ndarray, history: Sequence[int], draft: int) -> int:
        """Speculative sampling's acceptance of a deterministic ``draft`` token: the token to take at
        this position, ``draft`` itself when accepted. Greedy: the argmax (accepted when it is the
        draft). Else the draft is accepted with its probability p(draft), and otherwise a token is
        drawn from p with the draft removed (renormalized): every token's probability stays p's."""
        if self.greedy:
            return self.sample(logits, history)
        ids, probs = self.distribution(logits, history)
        hit = np.flatnonzero(ids == draft)
        p_draft = float(probs[hit[0]]) if len(hit) else 0.0
        if p_draft > 0.0 and self.rng.random() < p_draft:
            return int(draft)
        if len(hit):
            probs = probs.copy()
            probs[hit[0]] = 0.0
            total = probs.sum()
            if total <= 0.0:  # p put everything on the draft (a rounding corner): it is the draw
                return int(draft)
            probs /= total
        return int(ids[self.rng.choice(len(ids), p=probs)])
