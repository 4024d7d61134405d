"""The engine on the real models: context shift (exact without rounding, within the foundation's
tolerances on the default backend), long generation through a small context, ``shift=False``,
prefix reuse (active sequence and LRU), q8_0 cache perplexity, and state files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import llmedge
from conftest import skip_or_fail
from llmedge.api import Model
from llmedge.backends import native_status
from llmedge.backends.numpy_ref import NumpyBackend, gelu_tanh, silu
from llmedge.engine import PrefixCache
from llmedge.errors import LlmedgeError
from llmedge.kvcache import LayerState, SequenceState
from llmedge.models.base import Batch, Step
from llmedge.sampling import Sampler, SamplingOptions

TEXTS = Path(__file__).parent / "fixtures" / "texts"
FAST = "native" if native_status()[0] else "numpy"  # the default backend here; numpy is the slow fallback


def text_ids(m: Model, start: int, n: int) -> list[int]:
    text = (TEXTS / "gpl3_30k.txt").read_text(encoding="utf-8")
    ids = m.tokenize(text[start : start + 8 * n], add_bos=True)[: n + 1]
    assert len(ids) == n + 1
    return ids


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


class ExactBackend(NumpyBackend):
    """The reference without ggml's roundings (activation quantization, the F16 GELU table): RoPE's
    relative-position property then holds to float32 precision, which makes shifts exactly checkable."""

    def matmul(self, x: np.ndarray, w) -> np.ndarray:
        return x @ w.f32.T

    def glu(self, gate: np.ndarray, up: np.ndarray, kind) -> np.ndarray:
        return ((silu(gate) if kind == "silu" else gelu_tanh(gate)) * up).astype(np.float32)


class NoEndSampler(Sampler):
    """Never samples an end-of-generation token, so a generation runs for its whole budget."""

    def __init__(self, eog: frozenset[int], **options) -> None:
        super().__init__(SamplingOptions(**options))
        self.eog = np.array(sorted(eog), dtype=np.int64)

    def sample(self, logits: np.ndarray, history=()) -> int:
        logits = logits.copy()
        logits[self.eog] = -np.inf
        return super().sample(logits, history)


def shifted_and_reference(m: Model, ids: list[int], n: int, n_keep: int, n_discard: int, follow: list[int]
                          ) -> tuple[np.ndarray, np.ndarray]:
    """Logits of ``follow`` after shifting a cache of ``ids[:n]``, and the same from a cache built fresh:
    the kept tokens' cells as computed at positions that keep every distance the shifted cache has
    (the first ``n_keep`` tokens evaluated alone, ``n_discard`` positions later; the rest where they were)."""
    e, model = m.engine, m.engine.model
    shifted = e.new_cache()
    e.forward(shifted, ids[:n])
    whole = shifted.state()
    assert shifted.shift(n_keep, n_discard, model.backend)
    assert shifted.tokens == ids[:n_keep] + ids[n_keep + n_discard : n]
    got = model.forward(Batch(np.array(follow), np.arange(len(follow)) + n - n_discard, shifted))
    head, ref = e.new_cache(), e.new_cache()
    model.forward(Batch(np.array(ids[:n_keep]), np.arange(n_keep) + n_discard, head))
    for layer, a, sb in zip(ref.layers, head.layers, whole.layers):
        sa = a.state()
        tail = sb.pos >= n_keep + n_discard
        layer.load_state(LayerState(np.concatenate([sa.pos, sb.pos[tail]]),
                                    tuple(np.concatenate([x, y[tail]]) for x, y in zip(sa.k, sb.k)),
                                    tuple(np.concatenate([x, y[tail]]) for x, y in zip(sa.v, sb.v))))
    want = model.forward(Batch(np.array(follow), np.arange(len(follow)) + n, ref))
    return got, want


# -- context shift ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def exact_models(smollm2_path: Path, gemma3_path: Path) -> dict[str, Model]:
    out = {}
    for name, path in (("smollm2", smollm2_path), ("gemma3", gemma3_path)):
        m = Model(path, backend="numpy", n_ctx=96, kv_type="f32", n_batch=32)
        m.model = m.engine.model = type(m.model)(m.gguf, ExactBackend())
        if name == "gemma3":  # a 16-token window so that a short sequence exercises the sliding rings
            m.model.params.window = 16
            for spec in m.model.specs:
                spec.window = 16 if spec.window else None
        out[name] = m
    return out


@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_after_a_shift_logits_equal_a_fresh_evaluation_at_the_new_positions(exact_models, name: str) -> None:
    m = exact_models[name]
    ids = text_ids(m, 0, 64)
    if name == "gemma3":
        assert any(layer.ring for layer in m.engine.new_cache().layers)
    got, want = shifted_and_reference(m, ids, 56, 4, 26, ids[56:60])
    assert np.abs(log_softmax(got) - log_softmax(want)).max() <= 2e-3
    assert (got.argmax(axis=1) == want.argmax(axis=1)).all()


@pytest.fixture(scope="module")
def fast_models(smollm2_path: Path, gemma3_path: Path) -> dict[str, Model]:
    return {name: llmedge.load(str(path), backend=FAST, n_ctx=512)
            for name, path in (("smollm2", smollm2_path), ("gemma3", gemma3_path))}


@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_after_a_shift_logits_are_within_the_foundation_tolerances(fast_models, name: str) -> None:
    m = fast_models[name]
    ids = text_ids(m, 0, 144)
    got, want = shifted_and_reference(m, ids, 120, 10, 55, ids[120:144])
    mine, ref = log_softmax(got), log_softmax(want)
    top = ref.argmax(axis=1)
    ordered = np.sort(ref, axis=1)
    sure = ordered[:, -1] - ordered[:, -2] > 0.5
    assert not (sure & (mine.argmax(axis=1) != top)).any()
    diffs = np.abs(mine[np.arange(len(top)), top] - ref[np.arange(len(top)), top])
    assert np.median(diffs) <= 0.06 and diffs.max() <= 0.35, diffs


@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_logits_from_a_first_row_equal_those_rows_of_all_logits(fast_models, name: str) -> None:
    m = fast_models[name]
    # 79 ids: chunks of 16 leave no one-row chunk, which would be a one-row decode whose kernels sum in
    # ggml's one-row orders (as a one-row ubatch does in llama.cpp), not the prompt rows' orders
    ids = text_ids(m, 0, 78)
    whole = m.logits(ids)
    assert np.array_equal(m.logits(ids, first_row=37), whole[37:])
    n_batch = m.engine.n_batch
    try:  # chunks before, across and after the first row
        m.engine.n_batch = 16
        assert np.array_equal(m.logits(ids, first_row=37), whole[37:])
        assert np.array_equal(m.logits(ids, first_row=48), whole[48:])
    finally:
        m.engine.n_batch = n_batch
    with pytest.raises(LlmedgeError, match=f"first_row {len(ids)} is outside"):
        m.logits(ids, first_row=len(ids))


@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_generate_runs_2000_tokens_through_a_512_token_context(fast_models, name: str) -> None:
    m = fast_models[name]
    e = m.engine
    ids = m.prompt_ids("Write a very long story about a lighthouse keeper.")
    chunks = list(e.generate(ids, NoEndSampler(m.tokenizer.eog_ids, temperature=0.7, seed=1), max_tokens=2000))
    assert len(chunks) == 2000 and chunks[-1].done_reason == "length"
    assert m.timings.eval_count == 2000 and m.timings.extra["context_shifts"] >= 6
    assert e.cache.offset <= e.n_ctx
    assert e.cache.tokens[: e.default_keep(ids)] == ids[: e.default_keep(ids)]  # BOS kept through every shift


def test_without_shift_a_full_context_stops_with_reason_length(smollm2_path: Path) -> None:
    m = llmedge.load(str(smollm2_path), backend=FAST, n_ctx=48)
    ids = m.prompt_ids("Count from one to one hundred.")
    chunks = list(m.engine.generate(ids, NoEndSampler(m.tokenizer.eog_ids, temperature=0), max_tokens=500,
                                    shift=False))
    assert chunks[-1].done_reason == "length" and m.timings.done_reason == "length"
    assert len(chunks) == 48 - len(ids) + 1  # one token per free cell, and the one sampled from the last
    assert m.timings.extra["context_shifts"] == 0
    with pytest.raises(LlmedgeError, match="more than the context"):
        list(m.generate(list(range(100, 160)), max_tokens=1, shift=False))
    chunks = list(m.generate([m.tokenizer.bos_id] + list(range(100, 160)), max_tokens=2, temperature=0))
    assert len(chunks) >= 1 and m.engine.cache.tokens[0] == m.tokenizer.bos_id  # truncated, BOS kept


def test_a_ring_that_cannot_shift_in_place_is_evaluated_again(gemma3_path: Path) -> None:
    m = Model(gemma3_path, backend=FAST, n_ctx=96, n_batch=8)
    m.model.params.window = 16  # rings of 16 + 8 cells
    for spec in m.model.specs:
        spec.window = 16 if spec.window else None
    e = m.engine
    e.cache = e.new_cache()
    ids = text_ids(m, 300, 40)
    e.forward(e.cache, ids[:36])  # the rings hold positions 12..35
    n0 = e.n_evaluated
    e.shift_context(12)  # drops 12: the window of position 24 reaches back to 9, which the rings lost
    assert e.cache.tokens == ids[:12] + ids[24:36]
    assert e.n_evaluated - n0 == 24
    fresh = e.new_cache()
    want = e.forward(fresh, e.cache.tokens + [ids[36]])
    got = e.forward(e.cache, [ids[36]])
    assert np.abs(got - want).max() < 1e-3


def test_a_chat_keeps_its_system_prompt_through_shifts(smollm2_path: Path) -> None:
    m = llmedge.load(str(smollm2_path), backend=FAST, n_ctx=96)
    messages = [{"role": "system", "content": "Always answer like a pirate, matey."},
                {"role": "user", "content": "Tell me about ships."}]
    ids = m.template.encode(messages)
    n_keep = m.system_keep(messages)
    assert 8 < n_keep < len(ids) and "pirate" in m.detokenize(ids[:n_keep])
    seen = {}
    generate = m.engine.generate
    m.engine.generate = lambda *a, **kw: seen.update(kw) or generate(*a, **kw)
    list(m.chat(messages, max_tokens=1))
    assert seen["n_keep"] == n_keep  # chat() passes the system prompt's length as num_keep
    sampler = NoEndSampler(m.tokenizer.eog_ids, temperature=0.7, seed=3)
    list(generate(ids, sampler, max_tokens=150, n_keep=n_keep))
    assert m.timings.extra["context_shifts"] >= 2
    assert m.engine.cache.tokens[:n_keep] == ids[:n_keep]


# -- prefix reuse -----------------------------------------------------------------------------------
def _answer(m: Model, messages: list[dict], n: int = 12) -> str:
    return "".join(c.text for c in m.chat(messages, max_tokens=n, temperature=0))


def test_second_chat_turn_evaluates_only_the_new_suffix(smollm2_path: Path) -> None:
    m = llmedge.load(str(smollm2_path), backend=FAST, n_ctx=512)
    messages = [{"role": "system", "content": "You are a terse assistant. " * 8},
                {"role": "user", "content": "Name three colours."}]
    first = m.template.encode(messages)
    messages.append({"role": "assistant", "content": _answer(m, messages)})
    assert m.timings.prompt_eval_count == len(first)
    held = list(m.engine.cache.tokens)
    messages.append({"role": "user", "content": "And three animals?"})
    second = m.template.encode(messages)
    _answer(m, messages, 4)
    common = next((i for i, (a, b) in enumerate(zip(held, second)) if a != b), len(held))
    assert common >= len(first)
    assert m.timings.prompt_eval_count == len(second) - common
    assert m.timings.extra["prompt_cached"] == common


def test_chat_continues_a_last_assistant_message(fast_models) -> None:
    """Assistant prefill: chat and apply_chat_template leave the assistant's last words open, as the
    server's chat routes do, and the reply is their continuation."""
    m = fast_models["smollm2"]
    words = "The capital of France is"
    msgs = [{"role": "user", "content": "What is the capital of France?"}, {"role": "assistant", "content": words}]
    prompt = m.apply_chat_template(msgs)
    assert prompt == m.apply_chat_template(msgs[:1]) + words
    assert m.apply_chat_template(msgs, add_generation_prompt=False) == m.template.render(msgs, False)
    reply = "".join(c.text for c in m.chat(msgs, temperature=0, max_tokens=6))
    assert reply == "".join(c.text for c in m.generate(prompt, raw=True, temperature=0, max_tokens=6))
    assert "Paris" in reply


def test_embed_leaves_the_conversation_and_refuses_bad_input(fast_models) -> None:
    import numpy as np

    from llmedge.sampling import OptionError

    m = fast_models["smollm2"]
    held = list(m.engine.cache.tokens)
    one, many = m.embed("a cat"), m.embed(["a cat", "a dog"])
    assert len(one) == 576 and abs(float(np.linalg.norm(one)) - 1) < 1e-6 and many[0] == one
    assert list(m.engine.cache.tokens) == held
    long = "word " * 600  # more than the 512-token context
    assert len(m.embed(long)) == 576
    for bad, words in ((lambda: m.embed(long, truncate=False), "input has 601 tokens, more than the context of 512"),
                       (lambda: m.embed(["x", long], truncate=False), r"input\[1\] has"),
                       (lambda: m.embed(5), "input must be a str or a list of str"),
                       (lambda: m.embed(["x", 3]), "input must be"),
                       (lambda: m.embed("x", dimensions=0), "dimensions must be an integer >= 1"),
                       (lambda: m.embed("x", truncate="no"), "truncate must be True or False")):
        with pytest.raises(OptionError, match=words):
            bad()


def test_an_endless_text_stops_at_ten_contexts(smollm2_path: Path) -> None:
    """max_tokens -1 (or more than ten contexts) with the context shifting: Ollama's limit of 10 * n_ctx
    tokens, not a generation that never ends (greedy 'a a a' never ends its text)."""
    m = llmedge.load(str(smollm2_path), backend=FAST, n_ctx=16)
    for max_tokens in (-1, 10**6):
        out = list(m.generate("a a a a a a a a", raw=True, temperature=0, max_tokens=max_tokens))
        assert m.timings.eval_count == 160 and m.timings.done_reason == "length", (max_tokens, len(out))
    list(m.generate("a a a a a a a a", raw=True, temperature=0, max_tokens=100))
    assert m.timings.eval_count == 100


def test_an_earlier_conversation_comes_back_from_the_prefix_lru(smollm2_path: Path) -> None:
    a = [{"role": "system", "content": "You answer in French. " * 10}, {"role": "user", "content": "Bonjour?"}]
    b = [{"role": "user", "content": "Something else entirely, please."}]
    runs = []
    for detour in (False, True):
        m = llmedge.load(str(smollm2_path), backend=FAST, n_ctx=512)
        a1 = a + [{"role": "assistant", "content": _answer(m, a)}]
        if detour:
            _answer(m, b)
            assert m.cache_info()["prefix_cache_entries"] == 1
        follow = a1 + [{"role": "user", "content": "Merci!"}]
        text = _answer(m, follow, 8)
        runs.append((text, m.timings.prompt_eval_count))
    assert runs[0] == runs[1]  # the same cells came back: the same tokens, the same suffix evaluated
    assert runs[1][1] < 20


def test_prefix_lru_stays_within_its_budget() -> None:
    def state(tokens: list[int], nbytes: int) -> SequenceState:
        cells = np.zeros((nbytes // 2,), dtype=np.int8)
        return SequenceState(tokens, "f16", [LayerState(np.zeros(0, np.int32), (cells,), (cells,))])

    lru = PrefixCache(budget_bytes=10_000, max_entries=3)
    assert lru.add(state([1, 2, 3], 4000)) and lru.add(state([4, 5], 4000))
    assert lru.add(state([6, 7, 8], 4000))  # evicts [1, 2, 3], the least recently used
    assert lru.nbytes <= 10_000 and lru.best([1, 2, 3, 9]) == (None, 0)
    key, n = lru.best([6, 7, 9])
    assert n == 2 and lru.pop(key).tokens == [6, 7, 8]
    assert not lru.add(state([9], 20_000))  # larger than the whole budget
    assert lru.add(state([4, 5, 6], 100)) and len(lru) == 1  # [4, 5] is a prefix of it: replaced
    assert lru.add(state([7, 8], 100)) and list(lru.entries.values())[0].tokens == [4, 5, 6]
    assert lru.touch([4, 5, 6])  # now the most recently used
    assert [st.tokens for st in lru.entries.values()] == [[7, 8], [4, 5, 6]]
    assert not lru.touch([4, 5]) and not lru.touch([4, 5, 6, 7]) and not lru.touch([5])
    assert [st.tokens for st in lru.entries.values()] == [[7, 8], [4, 5, 6]]


def test_a_repeated_request_snapshots_its_sequence_once(smollm2_path: Path) -> None:
    """A slot trimmed back to the same prompt after the same answer (a repeated or regenerated request)
    finds that sequence already in the prefix LRU: no second copy of its cells. From the second request
    on, each evaluates the prompt's last token alone after the cached cells, so they answer alike (the
    first evaluated the whole prompt as one chunk: on some tiers that parts at a near-tie)."""
    m = llmedge.load(str(smollm2_path), backend=FAST, n_ctx=256)
    e = m.engine
    pool = e.slot_pool(1)
    ids = m.prompt_ids("Count to twenty.")
    copies, outs = [], []
    for _ in range(4):
        slot = pool.acquire(ids)
        cache = pool.cache(slot)
        state = cache.state
        copies.append(0)
        cache.state = lambda state=state: copies.__setitem__(-1, copies[-1] + 1) or state()  # type: ignore[method-assign]
        g = e.begin(ids, NoEndSampler(m.tokenizer.eog_ids, temperature=0), 24, cache=cache)
        del cache.state
        outs.append([])
        while not g.done:
            (chunks,) = e.step([g])
            outs[-1].extend(c.token for c in chunks)
        pool.release(slot)
    assert len(outs[0]) == 24 and outs[1] == outs[2] == outs[3]
    # the second request stashes the first's sequence; the third its own only if it answered otherwise
    differs = int(outs[1] != outs[0])
    assert copies == [0, 1, differs, 0] and len(e.prefix_cache) == 1 + differs


# -- q8_0 -------------------------------------------------------------------------------------------
def test_q8_0_cache_perplexity_is_within_one_percent_of_f16(smollm2_path: Path) -> None:
    from llmedge.perplexity import perplexity

    text = (TEXTS / "gpl3_30k.txt").read_text(encoding="utf-8")[:4000]  # a slice: see the report for 30 KB
    ppl = {}
    for kv_type in ("f16", "q8_0"):
        m = llmedge.load(str(smollm2_path), backend=FAST, n_ctx=256, kv_type=kv_type)
        ppl[kv_type] = (perplexity(m, text, 256).ppl, m.cache_bytes)
    assert ppl["q8_0"][0] <= ppl["f16"][0] * 1.01, ppl
    assert 0.5 < ppl["q8_0"][1] / ppl["f16"][1] < 0.56


# -- state files ------------------------------------------------------------------------------------
def test_saved_state_reloads_and_continues_with_identical_greedy_tokens(fast_models, smollm2_path, tmp_path):
    m = fast_models["smollm2"]
    ids = m.prompt_ids("Describe the sea in two sentences.")
    first = [c.token for c in m.generate(ids, max_tokens=10, temperature=0)]
    path = tmp_path / "seq.llmstate"
    size = m.save_state(path, extra={"note": "hello"})
    assert size == path.stat().st_size and m.engine.cache.tokens == ids + first[:-1]
    resume = ids + first
    want = [c.token for c in m.generate(resume, max_tokens=10, temperature=0)]
    other = llmedge.load(str(smollm2_path), backend=FAST, n_ctx=512)
    assert other.load_state(path) == {"note": "hello"}
    got = [c.token for c in other.generate(resume, max_tokens=10, temperature=0)]
    assert got == want and other.timings.prompt_eval_count == 1


def test_states_from_other_models_truncated_or_corrupted_are_refused(fast_models, tmp_path) -> None:
    m, g = fast_models["smollm2"], fast_models["gemma3"]
    list(m.generate("Hello there.", max_tokens=3, temperature=0))
    good = tmp_path / "good.llmstate"
    m.save_state(good)
    list(g.generate("Something for gemma.", max_tokens=3, temperature=0))
    raw = good.read_bytes()
    cut, bad = tmp_path / "cut.llmstate", tmp_path / "bad.llmstate"
    cut.write_bytes(raw[: len(raw) // 2])
    flipped = bytearray(raw)
    flipped[len(raw) // 2] ^= 0x40
    bad.write_bytes(bytes(flipped))
    junk = tmp_path / "junk.llmstate"
    junk.write_bytes(b"not a state at all")
    cases = [(g, good, "another model"), (m, cut, "truncated"), (m, bad, "corrupted"), (m, junk, "not an llmedge")]
    for model, path, what in cases:
        before = model.engine.cache.state()
        with pytest.raises(LlmedgeError, match=what) as err:
            model.load_state(path)
        assert "\n" not in str(err.value)
        after = model.engine.cache.state()
        assert after.tokens == before.tokens
        assert all(np.array_equal(x.pos, y.pos) and np.array_equal(x.k[0], y.k[0])
                   for x, y in zip(before.layers, after.layers))


def test_saving_a_state_into_a_missing_folder_names_the_users_path(tmp_path) -> None:
    """It raised a bare FileNotFoundError naming mkstemp's temporary file."""
    from llmedge.state import read_state, write_state

    z = np.zeros((2, 4), dtype=np.float16)
    st = SequenceState([1, 2], "f16", [LayerState(np.array([0, 1], dtype=np.int32), (z,), (z,))])
    path = tmp_path / "missing" / "seq.llmstate"
    with pytest.raises(LlmedgeError) as err:
        write_state(path, st, "sha256:" + "0" * 64, "llama")
    assert str(err.value) == f"cannot write state file {path}: no such folder {path.parent}"
    assert not (tmp_path / "missing").exists()
    inside_a_file = tmp_path / "file.txt"
    inside_a_file.write_text("x")
    with pytest.raises(LlmedgeError, match="no such folder"):
        write_state(inside_a_file / "seq.llmstate", st, "sha256:" + "0" * 64, "llama")
    ok = tmp_path / "seq.llmstate"  # an existing folder still works
    assert write_state(ok, st, "sha256:" + "0" * 64, "llama") == ok.stat().st_size
    assert read_state(ok, None)[0].tokens == [1, 2]


# -- several sequences (continuous batching) --------------------------------------------------------
def _alone(m: Model, ids: list[int], sampler: Sampler, n: int) -> tuple[list[int], dict]:
    m.engine.cache.clear()
    m.engine.prefix_cache.clear()
    tokens = [c.token for c in m.engine.generate(ids, sampler, max_tokens=n)]
    t = m.timings
    return tokens, {"prompt": t.prompt_eval_count, "eval": t.eval_count, "shifts": t.extra["context_shifts"],
                    "reason": t.done_reason}


@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_batched_steps_give_every_sequence_the_tokens_it_gets_alone(smollm2_path, gemma3_path, name) -> None:
    """Sequences joining at different steps, prompts longer than a chunk, greedy and seeded sampling, and
    context shifts in a small context: each sequence's tokens and counts are those of its run alone."""
    m = Model(smollm2_path if name == "smollm2" else gemma3_path, backend=FAST, n_ctx=64, n_batch=16)
    e = m.engine
    prompts = [m.prompt_ids("Tell me a long story about a dragon and a knight."), m.prompt_ids("Hi"),
               m.tokenize("Count from 1 to 1000: 1, 2, 3, 4,", add_bos=True)]
    options = [{"temperature": 0}, {"temperature": 0.9, "seed": 7}, {"temperature": 0}]
    n = 70 if name == "smollm2" else 24
    alone = [_alone(m, ids, NoEndSampler(m.tokenizer.eog_ids, **o), n) for ids, o in zip(prompts, options)]
    e.cache.clear()
    e.prefix_cache.clear()
    pool = e.slot_pool(3)
    gens, outs = [], [[], [], []]
    for step in range(400):
        if step in (0, 3, 5):  # the second and third join while the first decodes
            i = len(gens)
            slot = pool.acquire(prompts[i])
            gens.append(e.begin(prompts[i], NoEndSampler(m.tokenizer.eog_ids, **options[i]), n,
                                cache=pool.cache(slot)))
        for out, chunks in zip(outs, e.step(gens)):
            out.extend(c.token for c in chunks)
        if len(gens) == 3 and all(g.done for g in gens):
            break
    assert pool.n_busy == 3 and len({id(pool.cache(i)) for i in range(3)}) == 3
    for g, out, (want, counts) in zip(gens, outs, alone):
        t = g.timings
        assert out == want
        assert {"prompt": t.prompt_eval_count, "eval": t.eval_count, "shifts": t.extra["context_shifts"],
                "reason": t.done_reason} == counts
    if name == "smollm2":
        assert alone[0][1]["shifts"] >= 1  # the first sequence shifted its context while batched


@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_several_decoding_sequences_get_the_logits_they_get_alone_bitwise(fast_models, name) -> None:
    """A step of four decoding sequences runs their rows row-exact (each as a one-row decode: gemma3's
    Q4_K would otherwise take llama.cpp's 4-row repacked order), so each sequence's logits are bit for
    bit those of its row evaluated alone in the same cache."""
    if FAST != "native":
        skip_or_fail("the row-exact multi-sequence decode is the native stack's")
    m = fast_models[name]
    e = m.engine
    pool = e.slot_pool(4)
    prompts = [m.prompt_ids(p) for p in ("Hi", "Tell me a story.", "What is 2 + 2?", "Name three colours.")]
    gens = []
    for ids in prompts:
        slot = pool.acquire(ids)
        gens.append(e.begin(ids, Sampler(SamplingOptions(temperature=0)), 8, cache=pool.cache(slot)))
    while not all(g.decoding for g in gens):
        e.step(gens)
    seen = []
    real = e.model.forward_many
    e.model.forward_many = lambda batches: seen.append((batches, real(batches))) or seen[-1][1]
    try:
        e.step(gens)
    finally:
        del e.model.forward_many
    (batches, logits), = seen
    assert len(batches) == 4 and all(b.row_exact for b in batches)
    for b, lg in zip(batches, logits):
        b.cache.rollback(len(b.tokens))
        alone = e.model.forward(Batch(b.tokens, b.positions, b.cache, b.output_rows))
        assert np.array_equal(alone, lg)
    for i in range(4):
        pool.release(i)


def test_one_token_prompt_chunks_join_the_decode_rows_and_keep_their_tokens(fast_models) -> None:
    """Prompts whose cached prefix leaves one token to evaluate (a server's repeated requests) take one
    step together, their rows batched as decode rows (row-exact), not one forward each; every sequence's
    tokens are those it gets alone from the same cached prefix."""
    m = fast_models["smollm2"]
    e = m.engine
    pool = e.slot_pool(4)
    prompts = [m.prompt_ids(p) for p in ("Hi", "Tell me a story.", "What is 2 + 2?", "Name three colours.")]

    def run(ids_list: list[list[int]], watch: bool = False) -> tuple[list[list[int]], list[str]]:
        slots = [pool.acquire(ids) for ids in ids_list]
        gens = [e.begin(ids, NoEndSampler(m.tokenizer.eog_ids, temperature=0), 12, cache=pool.cache(s))
                for ids, s in zip(ids_list, slots)]
        calls: list[str] = []
        if watch:
            assert [len(g.todo) for g in gens] == [1, 1, 1, 1]  # every prompt but its last token is cached
            forward, forward_many = e.model.forward, e.model.forward_many
            e.model.forward = lambda b: calls.append("forward") or forward(b)  # forward_many's own call too
            e.model.forward_many = lambda bs: calls.append(f"forward_many {len(bs)} "
                                                           f"{all(b.row_exact for b in bs)}") or forward_many(bs)
        outs: list[list[int]] = [[] for _ in gens]
        try:
            for out, chunks in zip(outs, e.step(gens)):
                out.extend(c.token for c in chunks)
        finally:
            if watch:
                del e.model.forward, e.model.forward_many
        while not all(g.done for g in gens):
            for out, chunks in zip(outs, e.step(gens)):
                out.extend(c.token for c in chunks)
        for s in slots:
            pool.release(s)
        return outs, calls

    for ids in prompts:  # each slot's cache: its prompt, evaluated as a chunk, and an answer
        run([ids])
    alone = [run([ids])[0][0] for ids in prompts]  # the cached prefix reused, the last token evaluated alone
    together, calls = run(prompts, watch=True)
    assert calls == [f"forward_many 4 {FAST == 'native'}", "forward"], calls  # row-exact where the stack has it
    assert together == alone and all(len(t) == 12 for t in alone)
    for i in range(4):
        assert pool.n_busy == 0 and pool.cache(i).tokens[: len(prompts[i])] == prompts[i]


def test_forward_parallel_gives_each_sequence_its_logits_alone_and_refuses_bad_input(fast_models) -> None:
    """Engine.forward_parallel (llmedge bench -np): one token of each of three sequences in one forward
    equals each decoded alone in a cache of the same prompt, bit for bit on the native stack; the caches
    and the engine's count advance by one each; a bad call changes nothing."""
    m = fast_models["smollm2"]
    e = m.engine
    prompts = [m.prompt_ids(p) for p in ("Hi", "Tell me a story.", "What is 2 + 2?")]
    together, alone = [m.model.make_cache(64) for _ in prompts], [m.model.make_cache(64) for _ in prompts]
    for a, b, ids in zip(together, alone, prompts):
        e.forward(a, ids)
        e.forward(b, ids)
    n0 = e.n_evaluated
    logits = e.forward_parallel(together, [11, 22, 33])
    assert logits.shape == (3, m.params.n_vocab) and e.n_evaluated == n0 + 3
    solo = np.concatenate([e.forward(c, [t]) for c, t in zip(alone, [11, 22, 33])])
    assert np.array_equal(logits, solo) if FAST == "native" else np.allclose(logits, solo, atol=1e-3)
    assert [c.tokens[-1] for c in together] == [11, 22, 33] and [c.offset for c in together] == \
        [len(ids) + 1 for ids in prompts]
    for caches, ids, message in ((together, [1, 2], "3 sequences"), (together[:1] * 2, [1, 2], "twice"),
                                 (together, [1, 2, m.params.n_vocab], "out of range")):
        with pytest.raises(LlmedgeError, match=message):
            e.forward_parallel(caches, ids)
    assert [c.offset for c in together] == [len(ids) + 1 for ids in prompts]


def test_a_failing_sampler_ends_only_its_own_sequence(fast_models) -> None:
    m = fast_models["smollm2"]
    e = m.engine

    class Failing(Sampler):
        def sample(self, logits: np.ndarray, history=()) -> int:
            if len(history) > self.limit:
                raise LlmedgeError("no way on")
            return super().sample(logits, history)

    bad = Failing(SamplingOptions(temperature=0))
    ids = m.prompt_ids("Say something.")
    bad.limit = len(ids) + 2
    pool = e.slot_pool(2)
    caches = [pool.cache(pool.acquire(ids)), pool.cache(pool.acquire(ids))]
    gens = [e.begin(ids, bad, 10, cache=caches[0]),
            e.begin(ids, NoEndSampler(m.tokenizer.eog_ids, temperature=0), 10, cache=caches[1])]
    counts = [0, 0]
    while not all(g.done for g in gens):
        for i, chunks in enumerate(e.step(gens)):
            counts[i] += len(chunks)
    assert isinstance(gens[0].error, LlmedgeError) and counts[0] == 3
    assert gens[1].error is None and counts[1] == 10 and gens[1].timings.done_reason == "length"
    with pytest.raises(LlmedgeError, match="no way on"):
        bad.limit = len(ids)
        list(e.generate(ids, bad, 10))


def test_slot_pool_picks_the_free_slot_sharing_the_longest_prefix() -> None:
    from types import SimpleNamespace

    from llmedge.engine import SlotPool

    made = []

    def new_cache() -> SimpleNamespace:
        made.append(SimpleNamespace(tokens=[]))
        return made[-1]

    pool = SlotPool(SimpleNamespace(cache=SimpleNamespace(tokens=[]), new_cache=new_cache), 3)
    assert not made  # caches come on first use
    a = pool.acquire([1, 2, 3])
    pool.cache(a).tokens[:] = [1, 2, 3, 4]
    b = pool.acquire([7, 8])
    pool.cache(b).tokens[:] = [7, 8, 9]
    assert a != b and pool.n_busy == 2 and len(made) == (1 if 0 in (a, b) else 2)
    pool.release(a)
    pool.release(b)
    assert pool.acquire([7, 8, 10]) == b  # the longest common prefix wins
    c = pool.acquire([5])  # no prefix anywhere: the never used slot before a's content
    assert c not in (a, b)
    assert pool.acquire([1, 2]) == a
    assert pool.acquire([1]) is None and pool.n_busy == 3


# -- argument validation at the API boundary ---------------------------------------------------------
BAD_SAMPLING = [
    ("temperature", "hot", "temperature must be a finite number >= 0 (0 is greedy), not 'hot'"),
    ("temperature", float("nan"), "temperature must be a finite number >= 0"),
    ("temperature", -0.5, "temperature must be a finite number >= 0"),
    ("top_p", 2, "top_p must be a finite number in [0, 1], not 2"),
    ("min_p", -1, "min_p must be a finite number in [0, 1], not -1"),
    ("typical_p", 1.5, "typical_p must be a finite number in [0, 1]"),
    ("top_k", -5, "top_k must be an integer >= -1 (0 or -1: no limit), not -5"),
    ("top_k", "40", "top_k must be an integer >= -1"),
    ("repeat_penalty", -0.5, "repeat_penalty must be a finite number >= 0 (0 or 1: no penalty), not -0.5"),
    ("repeat_penalty", float("inf"), "repeat_penalty must be a finite number >= 0"),
    ("repeat_last_n", -2, "repeat_last_n must be an integer >= -1"),
    ("presence_penalty", float("nan"), "presence_penalty must be a finite number, not nan"),
    ("seed", "abc", "seed must be an integer or None (negative: random), not 'abc'"),
    ("seed", 1.5, "seed must be an integer or None"),
]


@pytest.mark.parametrize(("name", "value", "message"), BAD_SAMPLING)
def test_bad_sampling_options_are_one_clear_value_error(name: str, value: object, message: str) -> None:
    """They were accepted (top_p=2, top_k=-5, NaN, negative temperature) or failed deep inside the
    sampler with a raw TypeError/ValueError."""
    with pytest.raises(ValueError) as err:
        SamplingOptions(**{name: value})
    assert str(err.value).startswith(message) and isinstance(err.value, LlmedgeError)


def test_valid_sampling_options_keep_their_meaning() -> None:
    """What the CLI, chat, Modelfiles and the server pass stays accepted: 0 and -1 for top_k and
    repeat_last_n, the bounds of the probabilities, negative presence/frequency penalties, numpy
    numbers; a negative seed means a random one (it raised in numpy's default_rng)."""
    o = SamplingOptions(temperature=0, top_k=0, top_p=1, min_p=0, typical_p=0.0, repeat_penalty=1.1,
                        repeat_last_n=-1, presence_penalty=-1.5, frequency_penalty=2, seed=np.int64(7))
    assert (o.temperature, o.top_k, o.top_p, o.seed) == (0.0, 0, 1.0, 7) and Sampler(o).greedy
    assert SamplingOptions(top_k=-1, repeat_last_n=0, seed=0).seed == 0
    o = SamplingOptions(seed=-1)
    assert o.seed is None
    logits = np.linspace(0.0, 1.0, 50).astype(np.float32)
    draws = {Sampler(SamplingOptions(seed=-1, temperature=5.0, top_k=0, min_p=0.0)).sample(logits) for _ in range(20)}
    assert len(draws) > 1  # random, not one fixed seed
    seeded = [Sampler(SamplingOptions(seed=3)).sample(logits) for _ in range(3)]
    assert len(set(seeded)) == 1
    assert SamplingOptions() == SamplingOptions(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, seed=None)


def test_repeat_penalty_zero_is_no_penalty() -> None:
    """The server's limits (as Ollama's API) accept repeat_penalty 0, which SamplingOptions refused
    (a 400 for a value the limits allow); 0 now means no penalty, as Ollama's own runner reads it,
    rather than llama.cpp's division by 0 that makes every recent token certain."""
    history = [3, 7, 7]
    logits = np.linspace(-2.0, 2.0, 10).astype(np.float32)
    zero = Sampler(SamplingOptions(temperature=0, repeat_penalty=0))
    assert zero.options.repeat_penalty == 1.0 and not zero.penalized
    assert np.array_equal(zero._penalized(logits, history), logits.astype(np.float64))
    assert zero.sample(logits, history) == 9
    strong = Sampler(SamplingOptions(temperature=0, repeat_penalty=1e3))
    assert strong.sample(logits, [9]) == 8  # a penalty still penalizes


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Model:
    import tiny_gguf

    path = tiny_gguf.write_tiny_llama(tmp_path_factory.mktemp("api") / "tiny.gguf", seed=1)
    return Model(path, backend="numpy", n_ctx=64)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"n_ctx": "abc"}, "n_ctx must be an integer >= 0"),
    ({"n_ctx": -5}, "n_ctx must be an integer >= 0"),
    ({"n_ctx": 4096.0}, "n_ctx must be an integer >= 0"),
    ({"n_threads": -2}, "n_threads must be a positive integer, or None, 0 or -1 for the backend's default, not -2"),
    ({"n_threads": "4"}, "n_threads must be a positive integer, or None, 0 or -1"),
    ({"n_threads": 2.0}, "n_threads must be a positive integer"),
])
def test_bad_load_arguments_are_one_clear_value_error(tiny_model: Model, kwargs: dict, message: str) -> None:
    """n_ctx=-5 silently became the training context; "abc" and n_threads=-1 failed deep inside. The
    check comes first: load() neither resolves nor pulls the name."""
    for make in (lambda: llmedge.load("no-such-model-anywhere:1b", pull=False, **kwargs),
                 lambda: Model(tiny_model.path, backend="numpy", **kwargs)):
        with pytest.raises(ValueError) as err:
            make()
        assert str(err.value).startswith(message) and str(err.value).endswith(f"not {next(iter(kwargs.values()))!r}")


def test_n_threads_minus_one_or_none_is_the_backends_default(tiny_model: Model) -> None:
    """llama-cpp-python's callers pass n_threads=-1 for "the default"; it was refused. -1, 0 and None
    now all load with the backend's own thread count; a positive count is kept."""
    default = Model(tiny_model.path, backend="numpy", n_ctx=64).backend.n_threads
    for n in (-1, 0, None, np.int64(-1)):
        assert Model(tiny_model.path, backend="numpy", n_ctx=64, n_threads=n).backend.n_threads == default
    assert Model(tiny_model.path, backend="numpy", n_ctx=64, n_threads=np.int64(3)).backend.n_threads == 3


def test_bad_generation_and_speculation_options_are_refused_before_generating(tiny_model: Model) -> None:
    m = tiny_model
    for options, message in (({"temperature": "hot"}, "temperature must be"), ({"seed": "abc"}, "seed must be"),
                             ({"top_p": 2}, "top_p must be"), ({"lookup": "x"}, "lookup must be an integer >= 0"),
                             ({"lookup": -2}, "lookup must be an integer >= 0"),
                             ({"lookup": 2, "draft_max": "many"}, "draft_max must be an integer >= 0"),
                             ({"lookup": 2, "draft_p_min": 2.0}, "draft_p_min must be a finite number in [0, 1]")):
        with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
            m.generate("hi", max_tokens=2, **options)
    assert m.spec_config(lookup=False) is None and m.spec_config(lookup=0) is None
    assert m.spec_config(lookup=True).lookup == 3 and m.spec_config(lookup=np.int64(2)).lookup == 2
    assert m.n_ctx == 64 and Model(m.path, backend="numpy", n_ctx=0).n_ctx == m.params.n_ctx_train
    got = [c.token for c in m.generate("hi", max_tokens=3, temperature=0, seed=-1, top_k=-1)]
    assert len(got) >= 1


def test_generations_interleaved_or_in_threads_each_get_their_tokens_alone(tiny_model: Model) -> None:
    """Two unfinished generate() streams of one model (iterators consumed in turn, or two threads)
    shared its one sequence cache: each evaluated its tokens into the other's context and both came
    out garbled, silently. Now the second streams in a cache of its own and the steps take turns."""
    import threading

    m = tiny_model
    prompts = ["hi the sky", "a blue sky is the"]
    options = {"max_tokens": 20, "temperature": 0, "seed": 1}
    alone = [[c.token for c in m.generate(p, **options)] for p in prompts]
    assert alone[0] != alone[1] and min(map(len, alone)) == 20
    streams = [m.generate(p, **options) for p in prompts]
    both = [[a.token, b.token] for a, b in zip(*streams)]
    assert [list(t) for t in zip(*both)] == alone
    streams = [m.generate(p, **options) for p in prompts]
    next(streams[0])  # the first one holds the active sequence, unfinished, while others run and end
    for _ in range(2):
        assert [c.token for c in m.generate(prompts[1], **options)] == alone[1]
    assert [alone[0][0]] + [c.token for c in streams[0]] == alone[0]

    got: dict[int, list[int]] = {}
    turn = threading.Barrier(2, timeout=60)

    def run(i: int) -> None:
        got[i] = []
        for c in m.generate(prompts[i], **options):
            got[i].append(c.token)
            turn.wait()  # one token each in turn: the two streams' steps interleave

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [got[0], got[1]] == alone
    assert len(m.engine._spare) == 1 and not m.engine._streaming  # one spare cache, reused, all released


@pytest.mark.parametrize(("call", "message"), [
    (lambda m: m.detokenize("abc"), "ids must be a sequence of integer token ids, not 'abc'"),
    (lambda m: m.detokenize(None), "ids must be a sequence of integer token ids, not None"),
    (lambda m: m.detokenize([5, 1.5]), "ids must be a sequence of integer token ids, not one holding 1.5"),
    (lambda m: m.logits("hello"), "ids must be a sequence of integer token ids, not 'hello'"),
    (lambda m: m.logits([1, 5], first_row=-1), "first_row must be an integer >= 0"),
    (lambda m: m.generate(None), "prompt must be a str or a sequence of integer token ids, not None"),
    (lambda m: m.generate(5), "prompt must be a str or a sequence of integer token ids, not 5"),
    (lambda m: m.generate(["a"]), "prompt must be a str or a sequence of integer token ids, not one holding 'a'"),
    (lambda m: m.generate("hi", max_tokens="3"), "max_tokens must be an integer (negative: no limit), not '3'"),
    (lambda m: m.generate("hi", max_tokens=2.5), "max_tokens must be an integer"),
    (lambda m: m.generate("hi", num_predict="3"), "num_predict must be an integer"),
    (lambda m: m.generate("hi", stop=5), "stop must be a string or a sequence of strings, not 5"),
    (lambda m: m.generate("hi", stop=["a", 5]), "stop must be a string or a sequence of strings"),
    (lambda m: m.generate("hi", num_keep="x"), "num_keep must be an integer >= -1 or None"),
    (lambda m: m.chat([{"role": "user", "content": "hi"}], n_keep=1.5), "n_keep must be an integer >= -1 or None"),
    (lambda m: m.generate("hi", num_ctx=128), "unknown generation option(s): num_ctx (num_ctx is set at load: "
                                              "llmedge.load(..., n_ctx=))"),
    (lambda m: llmedge.load(None), "model must be a model name or a path to a .gguf file, not None"),
    (lambda m: llmedge.load(123, pull=False), "model must be a model name or a path to a .gguf file, not 123"),
    (lambda m: Model(m.path, backend="numpy", n_batch="x"), "n_batch must be an integer >= 1"),
    (lambda m: m.generate("hi", draft_model=5), "draft_model must be a Model, a model name or a path to a .gguf "
                                                 "file, not 5"),
    (lambda m: m.chat([{"content": "hi"}]), "messages[0] must be a dict with a 'role' string and its 'content', "
                                             "not {'content': 'hi'}"),
    (lambda m: m.chat([{"role": "user", "content": "a"}, "b"]), "messages[1] must be a dict with a 'role' string"),
    (lambda m: m.apply_chat_template([{"role": 5, "content": "x"}]), "messages[0] must be a dict with a 'role'"),
    (lambda m: m.prefill("hi"), "ids must be a sequence of integer token ids, not 'hi'"),
    (lambda m: m.save_state(None), "path must be a file path (str or os.PathLike), not None"),
    (lambda m: m.load_state(None), "path must be a file path (str or os.PathLike), not None"),
    (lambda m: m.save_state("unused.state", extra=[1, 2]), "extra must be a dict (saved as JSON) or None, not [1, 2]"),
    (lambda m: Model(m.path, backend="numpy", n_ctx=4), "n_ctx 4 is too small: a context needs at least 8 tokens"),
])
def test_bad_api_arguments_are_one_clear_value_error_naming_the_argument(tiny_model: Model, call, message: str
                                                                          ) -> None:
    """Each failed deep inside (TypeError: 'NoneType' object is not iterable, '>=' not supported between
    'str' and 'int', invalid literal for int()), or was taken silently: a float id decoded as "", a
    max_tokens of 2.5 gave 3 tokens, and load(None) asked a registry for a model named 'None'."""
    with pytest.raises(ValueError) as err:
        call(tiny_model)
    assert str(err.value).startswith(message) and isinstance(err.value, LlmedgeError)


def test_api_arguments_keep_their_accepted_forms(tiny_model: Model) -> None:
    m = tiny_model
    ids = m.tokenize("hi the sky")
    assert m.detokenize(np.array(ids)) == m.detokenize(tuple(ids)) == m.detokenize(ids)
    assert np.array_equal(m.logits(np.array(ids)), m.logits(ids))
    greedy = {"temperature": 0, "max_tokens": 4}
    want = [c.token for c in m.generate("hi", **greedy)]
    for stop in (None, (), "", ["zzz"], ("zzz",)):
        assert [c.token for c in m.generate("hi", stop=stop, **greedy)] == want
    assert [c.token for c in m.generate("hi", temperature=0, num_predict=np.int64(4), num_keep=None)] == want
    assert [c.token for c in m.generate(m.prompt_ids("hi"), **greedy)] == want


def test_the_public_api_is_listed_and_documented() -> None:
    """dir(llmedge) lacked load and Model (loaded lazily), and help() showed no word on tokenize,
    detokenize, chat, apply_chat_template or kv_type."""
    import inspect

    assert set(llmedge.__all__) <= set(dir(llmedge))
    undocumented = [name for name, member in inspect.getmembers(Model)
                    if not name.startswith("_") and not inspect.getdoc(member)]
    assert undocumented == []
    assert "n_ctx" in inspect.getdoc(llmedge.load) and "kv_type" in inspect.getdoc(llmedge.load)


@pytest.mark.parametrize("fail_at", [1, 4])
def test_generating_after_a_forward_interrupted_past_its_cells_gives_the_same_tokens(tiny_model: Model,
                                                                                    fail_at: int) -> None:
    """A Ctrl-C (or any exception) that ended a forward after it wrote its K/V cells, before the engine
    recorded its tokens, left those cells behind: the next generate wrote the same positions again beside
    them and every later token read a duplicated key (greedy text changed after an interrupted prompt)."""
    m = tiny_model
    options = {"max_tokens": 12, "temperature": 0}
    prompt = "a blue sky is the"
    want = [c.token for c in m.generate(prompt, **options)]
    real, calls = m.model.forward, [0]

    def interrupted(*args, **kwargs):
        out = real(*args, **kwargs)
        calls[0] += 1
        if calls[0] == fail_at:
            raise KeyboardInterrupt
        return out

    m.model.forward = interrupted
    try:
        with pytest.raises(KeyboardInterrupt):
            list(m.generate(prompt, **options))
        with pytest.raises(KeyboardInterrupt):  # the same through prefill (Engine.forward)
            calls[0] = fail_at - 1
            m.prefill(m.prompt_ids("hi the sky"))
    finally:
        m.model.forward = real
    assert [c.token for c in m.generate(prompt, **options)] == want
    layers = m.engine.cache.layers
    assert all(layer.used == len(m.engine.cache.tokens) for layer in layers)


def test_step_output_rows_of_decode_rows_are_every_row() -> None:
    """One row per batch, each its batch's output row (decode rows): None (every row, no gather);
    any prompt chunk among them, or a batch without its row, keeps the explicit rows."""
    def batch(n: int, rows: list[int] | None) -> Batch:
        return Batch(np.arange(n), np.arange(n), None, None if rows is None else np.array(rows))  # type: ignore[arg-type]

    assert Step([batch(1, [0])]).output_rows() is None
    assert Step([batch(1, [0]), batch(1, [-1]), batch(1, None)]).output_rows() is None
    assert Step([batch(1, [0]), batch(1, [0])]).split(np.zeros((2, 3)))[1].shape == (1, 3)
    assert np.array_equal(Step([batch(1, [0]), batch(3, [2])]).output_rows(), [0, 3])
    assert np.array_equal(Step([batch(1, []), batch(1, [0])]).output_rows(), [1])
    assert np.array_equal(Step([batch(4, [3])]).output_rows(), [3])
