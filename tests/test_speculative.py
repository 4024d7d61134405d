"""Speculative decoding: row-exact verify forwards, prompt lookup and draft-model speculation give
the plain greedy text token for token on both real models, the cache rolls rejected rows back in
place, and the sampling acceptance leaves the sampler's distribution unchanged."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from test_server_api import store_root  # noqa: F401  (fixture)

import llmedge
from llmedge.api import Model
from llmedge.kvcache import LayerCache
from llmedge.models.base import Batch
from llmedge.sampling import Sampler, SamplingOptions, softmax
from llmedge.speculative import NgramIndex, SpecConfig, Speculation

PARAGRAPH = ("The committee met on Tuesday to review the budget for the coming year. After a long discussion, "
             "the members agreed to increase funding for the public library, to repair the roads near the "
             "school, and to hire two new teachers.")
COPY_PROMPT = f"Repeat the following paragraph exactly, but write 'Monday' instead of 'Tuesday'.\n\n{PARAGRAPH}"
CODE = '''def total_price(items, tax_rate):
    total = 0
    for item in items:
        total += item["price"] * item["quantity"]
    return round(total * (1 + tax_rate), 2)
'''
CODE_PROMPT = f"Add a docstring to this Python function. Return the whole function.\n\n```python\n{CODE}```"


@pytest.fixture(scope="module")
def models(model_paths: dict[str, Path]) -> dict[str, Model]:
    return {name: Model(path, n_ctx=1024) for name, path in model_paths.items()}


def greedy(m: Model, prompt: str, n: int, **opts) -> tuple[list[int], dict]:
    m.engine.cache.clear()  # both runs evaluate the whole prompt (a reused prefix changes chunking)
    m.engine.prefix_cache.clear()
    ids = [c.token for c in m.generate(prompt, max_tokens=n, temperature=0, **opts)]
    return ids, dict(m.timings.extra)


@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_row_exact_verify_rows_equal_one_token_decodes_bit_for_bit(models: dict[str, Model], name: str) -> None:
    m = models[name]
    eng = m.engine
    ids = m.prompt_ids("Write a poem about the sea.")
    extra = m.tokenize(" The sea is blue and the sky is wide")[:6]
    alone = eng.new_cache()
    eng.forward(alone, ids)
    single = np.stack([eng.forward(alone, [t])[-1] for t in extra])
    c = eng.new_cache()
    eng.forward(c, ids)
    pos = np.arange(c.offset, c.offset + len(extra))
    rows = eng.model.forward(Batch(np.array(extra), pos, c, None, row_exact=True))
    assert np.array_equal(rows, single)


@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
@pytest.mark.parametrize("prompt", [COPY_PROMPT, CODE_PROMPT], ids=["rewrite", "code-edit"])
def test_lookup_gives_the_plain_greedy_tokens(models: dict[str, Model], name: str, prompt: str) -> None:
    m = models[name]
    plain, _ = greedy(m, prompt, 64)
    spec, extra = greedy(m, prompt, 64, lookup=3)
    assert spec == plain
    assert extra["draft_accepted"] > 0  # the drafts were verified, not skipped


def test_a_step_told_not_to_speculate_decodes_one_token_and_counts_it_batched(models: dict[str, Model]) -> None:
    """Engine.step(speculate=False), what the server passes while a request waits to join: a lone
    generation with lookup verifies no draft in that step (one token, counted in draft_batched_steps),
    drafts again in the next, and its text is the plain one."""
    from llmedge.sampling import Sampler, SamplingOptions
    from llmedge.speculative import SpecConfig

    m = models["smollm2"]
    plain, _ = greedy(m, COPY_PROMPT, 40)
    e = m.engine
    gen = e.begin(m.prompt_ids(COPY_PROMPT), Sampler(SamplingOptions(temperature=0)), 40, cache=e.new_cache(),
                  spec=SpecConfig(lookup=3))
    tokens, held = [], 0
    while not gen.decoding:  # the prompt's last step samples the first token
        tokens += [c.token for c in e.step([gen])[0]]
    while not gen.done:
        hold = len(tokens) <= 20
        chunks = e.step([gen], speculate=not hold)[0]
        tokens += [c.token for c in chunks]
        if hold:
            assert len(chunks) == 1  # one token: nothing drafted
            held += 1
    assert gen.timings.extra["draft_batched_steps"] == held
    assert gen.timings.extra["draft_accepted"] > 0  # it drafted once allowed
    assert tokens == plain


def test_lookup_through_context_shifts_gives_the_plain_tokens(model_paths: dict[str, Path]) -> None:
    probe = Model(model_paths["smollm2"], n_ctx=512)
    prompt = probe.prompt_ids(COPY_PROMPT)
    m = Model(model_paths["smollm2"], n_ctx=len(prompt) + 12)  # the context fills while the copy runs
    plain, e1 = greedy(m, prompt, 48)
    spec, e2 = greedy(m, prompt, 48, lookup=3)
    assert e1["context_shifts"] >= 1 and e2["context_shifts"] == e1["context_shifts"]
    assert spec == plain


def test_draft_model_gives_the_plain_greedy_tokens(models: dict[str, Model], model_paths: dict[str, Path]) -> None:
    target = models["smollm2"]
    draft = Model(model_paths["smollm2"], n_ctx=1024)
    plain, _ = greedy(target, CODE_PROMPT, 48)
    spec, extra = greedy(target, CODE_PROMPT, 48, draft_model=draft, draft_max=6)
    assert spec == plain
    assert extra["draft_tokens"] > 0 and extra["draft_accepted"] > 0


def test_a_model_drafting_for_itself_gives_the_plain_greedy_tokens(models: dict[str, Model]) -> None:
    """generate(..., draft_model=m) on m itself drafted in m's own sequence cache, the one being
    verified, and failed with an IndexError from the emptied logits."""
    m = models["smollm2"]
    plain, _ = greedy(m, CODE_PROMPT, 32)
    for _ in range(2):  # the draft cache made the first time serves again
        spec, extra = greedy(m, CODE_PROMPT, 32, draft_model=m, draft_max=4)
        assert spec == plain and extra["draft_accepted"] > 0


def test_a_draft_model_with_another_vocabulary_is_refused(models: dict[str, Model]) -> None:
    with pytest.raises(llmedge.LlmedgeError, match="vocabulary"):
        models["smollm2"].spec_config(draft_model=models["gemma3"])


def test_sampled_speculation_is_reproducible_with_a_seed(models: dict[str, Model]) -> None:
    m = models["smollm2"]
    runs = []
    for _ in range(2):
        m.engine.cache.clear()
        runs.append([c.token for c in m.generate(COPY_PROMPT, max_tokens=32, temperature=0.7, seed=5, lookup=3)])
    assert runs[0] == runs[1]


def test_verify_keeps_the_samplers_distribution() -> None:
    """Accept the draft with p(draft), else draw from p without it: every token keeps probability p."""
    logits = np.array([2.0, 1.5, 1.0, 0.2, -1.0, -3.0], dtype=np.float32)
    s = Sampler(SamplingOptions(temperature=0.9, top_k=0, top_p=1.0, min_p=0.0, seed=1))
    p = softmax(logits.astype(np.float64) / 0.9)
    n = 12000  # 4 standard deviations of a frequency near 0.5 is 0.018
    for draft in (0, 3):
        counts = np.bincount([s.verify(logits, (), draft) for _ in range(n)], minlength=len(p))
        assert np.abs(counts / n - p).max() < 0.02, (draft, counts / n, p)


def test_verify_at_temperature_zero_is_the_argmax() -> None:
    s = Sampler(SamplingOptions(temperature=0.0))
    logits = np.array([0.1, 3.0, 2.9], dtype=np.float32)
    assert s.verify(logits, (), 1) == 1 and s.verify(logits, (), 2) == 1


def test_ngram_index_proposes_what_followed_the_latest_occurrence() -> None:
    idx = NgramIndex(3)
    idx.sync([1, 2, 3, 4, 5, 9, 2, 3, 4, 7, 8, 2, 3])
    assert idx.propose(4) == [4, 7, 8, 2]  # "2 3" last occurred before "4 7 8 ..."
    idx.sync([1, 2, 3, 4, 5, 9, 2, 3, 4, 7, 8, 2, 3, 4, 5])
    assert idx.propose(2) == [9, 2]  # "3 4 5" occurred once, at the start
    idx.sync([6, 6])  # another sequence: indexed anew
    assert idx.propose(2) == []


def test_ring_rollback_rewinds_in_place() -> None:
    ring = LayerCache(8, 1, 4, 4, "f32", window=4, ring=True)
    rng = np.random.default_rng(0)
    for p in range(10):
        kv = rng.standard_normal((1, 1, 4)).astype(np.float32)
        ring.update_and_fetch(kv, kv, np.array([p]))
    before_pos, before_k = ring.pos.copy(), ring.k.arrays[0].copy()
    kv = rng.standard_normal((3, 1, 4)).astype(np.float32)
    ring.update_and_fetch(kv, kv, np.array([10, 11, 12]))
    ring.rollback(3)
    assert ring.offset == 10 and ring.head == ring.used  # the three rows' cells are free again
    cells = {int(p): i for i, p in enumerate(ring.pos) if p >= 0}
    old = {int(p): i for i, p in enumerate(before_pos) if p >= 0}
    for p in range(7, 10):  # the window of the next query (the rows may have moved the cells, in order)
        assert np.array_equal(ring.k.arrays[0][cells[p]], before_k[old[p]])
    assert [cells[p] for p in sorted(cells)] == sorted(cells.values())


def test_draft_length_turns_off_when_verify_rows_cost_more_than_they_save() -> None:
    s = Speculation(SpecConfig(lookup=3, draft_max=16), cache=None)  # type: ignore[arg-type]
    s.record(0, 0, 0.010)
    for _ in range(5):
        s.record(4, 1, 0.010 + 4 * 0.009)  # each draft token costs 0.9 of a step, few are accepted
    assert s.k == 0
    s2 = Speculation(SpecConfig(lookup=3, draft_max=16), cache=None)  # type: ignore[arg-type]
    s2.record(0, 0, 0.010)
    for _ in range(5):
        s2.record(8, 8, 0.010 + 8 * 0.001)  # cheap rows, all accepted: long drafts
    assert s2.k >= 8


def test_server_lookup_option_gives_the_plain_text_and_reports_drafts(store_root: Path) -> None:  # noqa: F811
    import httpx
    from test_server_api import MODEL, running_server

    def ask(base: str, options: dict) -> dict:
        body = {"model": MODEL, "prompt": COPY_PROMPT, "stream": False,
                "options": {"temperature": 0, "num_predict": 40, **options}}
        r = httpx.post(base + "/api/generate", json=body, timeout=120)
        assert r.status_code == 200, r.text
        return r.json()

    with running_server(parallel=1, max_queue=4) as base:
        plain = ask(base, {})
        with running_server(parallel=1, max_queue=4) as base2:  # fresh slots: the whole prompt evaluated
            spec = ask(base2, {"lookup": 3, "draft_max": 8})
            metrics = httpx.get(base2 + "/metrics").text
    assert spec["response"] == plain["response"]
    assert "draft_tokens" not in plain
    assert spec["draft_accepted"] > 0 and spec["draft_tokens"] >= spec["draft_accepted"]
    assert f"llmedge_draft_accepted_total {spec['draft_accepted']}" in metrics


@pytest.mark.parametrize(("ggml_type", "m", "k"), [(t, 72, 512) for t in ("Q4_0", "Q4_1", "Q8_0", "Q5_0", "Q4_K", "Q6_K",
                                                                         "F16", "BF16", "F32")]
                         + [("F32", 1024, 4096), ("F16", 1024, 4096)])
def test_row_exact_products_equal_one_row_products_on_every_tier(ggml_type: str, m: int, k: int) -> None:
    """lle_matmul_rows (shared weight blocks for Q4_0 / Q4_1 / Q8_0 / BF16, the one-row gemv per row for the
    others; F32/F16 rows over 128 KB blocks of a chunk's weight rows, several blocks per chunk at
    1024 x 4096) against lle_matmul of each row alone, bit for bit, on every kernel tier of this CPU."""
    from test_native_kernels import make_tensor, random_weight

    from llmedge.backends.native import NativeBackend, NativeWeight
    from llmedge.quant import GGMLQuantizationType as T

    be = NativeBackend(2)
    t = T[ggml_type]
    rng = np.random.default_rng(3)
    # m = 72: not a multiple of the 8-row repacking and of the rows kernel's 8-row groups
    w = NativeWeight(make_tensor(random_weight(t, m, k, rng), t, m, k))
    x = rng.standard_normal((11, k)).astype(np.float32)
    try:
        for isa in NativeBackend.available_isas():
            be.set_isa(isa)
            alone = np.concatenate([be.matmul(x[i : i + 1], w) for i in range(len(x))])
            assert np.array_equal(be.matmul_rows(x, w), alone), isa
    finally:
        be.set_isa(NativeBackend.available_isas()[-1])


@pytest.mark.parametrize("ggml_type", ["F32", "F16"])
def test_float_rows_kernels_equal_one_row_products_for_every_tail_and_row_count(ggml_type: str) -> None:
    """The F32/F16 rows kernels (each weight row against up to 4 activation rows on AVX-512, 2 on AVX2)
    against each row alone, bit for bit, on every tier: k with every kind of tail past the vector
    steps (k < 32, k % 64 == 8, 36 or 32, k % 32 != 0, odd), 2..11 rows (one or two 8-row calls,
    odd groups), 33 weight rows (a last chunk of one row); f16 activations converted once per call,
    and at k = 1600 for 8 rows (beyond the conversion buffer) per weight row."""
    from test_native_kernels import make_tensor, random_weight

    from llmedge.backends.native import NativeBackend, NativeWeight
    from llmedge.quant import GGMLQuantizationType as T

    be = NativeBackend(2)
    t = T[ggml_type]
    rng = np.random.default_rng(5)
    try:
        for k in (8, 44, 72, 100, 517, 584, 1056, 1600):
            w = NativeWeight(make_tensor(random_weight(t, 33, k, rng), t, 33, k))
            x = rng.standard_normal((11, k)).astype(np.float32)
            for isa in NativeBackend.available_isas():
                be.set_isa(isa)
                alone = np.concatenate([be.matmul(x[i : i + 1], w) for i in range(len(x))])
                for n in range(2, 12):
                    assert np.array_equal(be.matmul_rows(x[:n], w), alone[:n]), (isa, k, n)
    finally:
        be.set_isa(NativeBackend.available_isas()[-1])


@pytest.mark.parametrize("backend", ["numpy", "native"])
def test_a_backend_without_row_exact_batches_verifies_row_by_row(tmp_path: Path, backend: str) -> None:
    """The numpy reference has no row-exact multi-row path: its verify rows run one at a time and the
    tokens stay the plain ones; the native one verifies in one forward (a tiny Gemma 3: ring caches)."""
    import tiny_models as tm

    path = tm.write("gemma3", tmp_path / "gemma3.gguf")
    target = Model(path, backend=backend, n_ctx=128)
    draft = Model(path, backend=backend, n_ctx=128)
    assert target.model.row_exact_batches == (backend == "native")
    ids = tm.prompt_ids("gemma3", 12)
    plain, _ = greedy(target, ids, 16)
    spec, extra = greedy(target, ids, 16, draft_model=draft, draft_max=4)
    assert spec == plain
    assert extra["verify_forwards"] > 0 and extra["draft_accepted"] > 0


def test_a_draft_model_that_costs_more_than_it_saves_is_turned_off() -> None:
    class Always:
        def propose(self, context: list[int], k: int) -> list[int]:
            return [1] * k

    s = Speculation(SpecConfig(lookup=3, draft_max=8), cache=None)  # type: ignore[arg-type]
    s.drafters = [Always()]
    assert s.propose([0], 8)  # no costs known yet: a draft
    s.record(4, 4, 0.010 + 4 * 0.012)  # every draft token costs more than a plain step
    assert s.propose([0], 8) == []  # the one plain step that measures t1
    s.record(0, 0, 0.010)
    s.record(4, 4, 0.010 + 4 * 0.012)
    assert s.k == 0 and s.propose([0], 8) == []


def test_a_draft_model_that_cannot_pay_at_any_acceptance_is_dropped_and_lookup_goes_on() -> None:
    """A draft model whose tokens cost about a target step (the same model at a nearby precision)
    is dropped after a few measured drafts, even though every draft was accepted: its probes would
    keep its cache in step at a prefill's cost per token. Lookup, configured beside it, goes on with
    its own costs; a draft model that pays at high acceptance stays."""
    from llmedge.speculative import ModelDrafter

    class Model(ModelDrafter):
        def __init__(self) -> None:
            pass

        def propose(self, context: list[int], k: int) -> list[int]:
            return [1] * k

    def run(per_token: float) -> Speculation:
        s = Speculation(SpecConfig(lookup=3, draft_max=8), cache=None)  # type: ignore[arg-type]
        s.drafters = [Model(), *s.drafters]
        s.record(0, 0, 0.010)
        for _ in range(Speculation.MIN_VERIFIES):
            s.record(4, 4, 0.010 + 4 * per_token)
        return s

    s = run(0.0095)  # every draft token costs 95% of a plain step: no length pays even at 98%
    assert s.model_dropped and s.stats()["draft_model_dropped"] == 1
    assert [type(d).__name__ for d in s.drafters] == ["LookupDrafter"] and s.k > 0 and s.c is None
    kept = run(0.004)  # 40% of a step, all accepted: drafting pays
    assert not kept.model_dropped and kept.k > 0 and len(kept.drafters) == 2
    short = Speculation(SpecConfig(lookup=3, draft_max=8), cache=None)  # type: ignore[arg-type]
    short.drafters = [Model(), *short.drafters]
    short.record(0, 0, 0.010)
    for _ in range(2 * Speculation.MIN_VERIFIES):
        short.record(1, 1, 0.010 + 0.0095)  # one-token drafts: their cost is mostly fixed, not per token
    assert short.k == 0 and not short.model_dropped
    waits = []  # probes of the model drafter that leave k at 0 come ever less often
    for _ in range(4):
        steps = 1
        while not short.propose([0], 8):
            steps += 1
        waits.append(steps)
        short.record(1, 1, 0.010 + 0.0095)
    assert waits == [16, 32, 64, 128] and short.k == 0


def test_run_lookup_flag_without_a_value_uses_ngrams_of_three_and_reports_drafts(smollm2_path: Path) -> None:
    import os
    import subprocess
    import sys

    from llmedge.cli.main import optional_values

    assert optional_values(["run", "m", "--lookup", "--verbose"]) == ["run", "m", "--lookup=3", "--verbose"]
    assert optional_values(["run", "m", "--lookup", "2"]) == ["run", "m", "--lookup", "2"]
    assert optional_values(["run", "m", "--", "--lookup"]) == ["run", "m", "--", "--lookup"]
    r = subprocess.run([sys.executable, "-m", "llmedge.cli.main", "run", str(smollm2_path), COPY_PROMPT,
                        "--temperature", "0", "--num-predict", "24", "--lookup", "--verbose"],
                       capture_output=True, text=True, env=dict(os.environ), timeout=120, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("The committee met on")
    assert "draft tokens:" in r.stderr and "tokens per forward" in r.stderr


def test_server_speculation_is_read_once_into_the_config(monkeypatch: pytest.MonkeyPatch) -> None:
    """``llmedge serve --lookup/--draft-*`` (or LLMEDGE_LOOKUP, ...) become ServerConfig.speculation, which
    every generation task starts from; a malformed number is one clear error at start-up."""
    from llmedge.errors import LlmedgeError
    from llmedge.server.config import config_from_env
    from llmedge.server.generation import GenerationRequest, GenerationTask

    monkeypatch.setenv("LLMEDGE_LOOKUP", "4")
    monkeypatch.setenv("LLMEDGE_DRAFT_MODEL", "smollm2:135m")
    config = config_from_env()
    assert config.speculation == {"lookup": 4, "draft_model": "smollm2:135m"}
    req = GenerationRequest(model="m", key="m", path=Path("m.gguf"), kind="generate")
    assert GenerationTask(req, {}, config.speculation).speculation == config.speculation
    monkeypatch.setenv("LLMEDGE_DRAFT_MAX", "many")
    with pytest.raises(LlmedgeError, match="LLMEDGE_DRAFT_MAX must be a whole number"):
        config_from_env()
