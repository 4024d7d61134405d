"""llmedge's native logits against llama.cpp's, token by token, and the first layer tensor that differs.

    .venv/bin/python benchmarks/logits_vs_llamacpp.py smollm2:135m tests/fixtures/texts/apache2_sections.txt \
        [-n 64] [--pos 0] [--ggml-ops glu,attn] [--llama-cpp /work/lcpp/lib/python3.11/site-packages]

Feeds the first ``-n`` tokens of the text one at a time to llama.cpp (llama-cpp-python's low-level API,
flash attention off, F16 cache; its ``cb_eval`` callback records each layer's named tensors at
position ``--pos``) and to llmedge's native backend (the fused stack, then the op-by-op path with every
op's output recorded). Prints the logit differences of both llmedge paths and, per layer at ``--pos``,
the tensors that differ from llama.cpp's (max |delta|). ``--ggml-ops`` swaps llmedge's swiglu
(``glu``) and/or attention (``attn``) in the op-by-op path for the loaded ggml's own ops, which
tells whether those ops account for the whole gap. The per-tensor table assumes plain llama layers
(no biases, Q/K norms or post-norms). llama-cpp-python is the oracle, never a dependency: its
directory is appended to ``sys.path`` (after llmedge's NumPy).
"""

from __future__ import annotations

import argparse
import ctypes as C
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
# per layer, the op-by-op path's outputs in order and the ggml tensor each equals: (name, occurrence)
LAYER_OPS = [("attn_norm", 0), ("Qcur", 0), ("Kcur", 0), ("Vcur", 0), ("Qcur", -1), ("Kcur", -1),
             ("kqv_out", 0), ("attn_out", 0), ("ffn_norm", 0), ("ffn_gate", 0), ("ffn_up", 0),
             ("ffn_swiglu", 0), ("ffn_out", 0)]  # fmt: skip
RECORDED = ("get_rows", "rms_norm", "matmul", "rope", "attention", "glu")


class GgmlTensor(C.Structure):
    """ggml.h's struct ggml_tensor (GGML_MAX_DIMS 4, GGML_MAX_OP_PARAMS 64, GGML_MAX_SRC 10, GGML_MAX_NAME 64)."""

    _fields_ = [("type", C.c_int), ("buffer", C.c_void_p), ("ne", C.c_int64 * 4), ("nb", C.c_size_t * 4),
                ("op", C.c_int), ("op_params", C.c_int32 * 16), ("flags", C.c_int32),
                ("src", C.c_void_p * 10), ("view_src", C.c_void_p), ("view_offs", C.c_size_t),
                ("data", C.c_void_p), ("name", C.c_char * 64), ("extra", C.c_void_p), ("padding", C.c_char * 8)]


def tensor_array(t: GgmlTensor) -> np.ndarray | None:
    """A float copy of an F32/F16 CPU tensor (strided as ggml lays it out), else None."""
    dt = {0: np.float32, 1: np.float16}.get(t.type)
    if dt is None or not t.data:
        return None
    ne, nb = list(t.ne), list(t.nb)
    buf = (C.c_char * (nb[3] * ne[3])).from_address(t.data)
    view = np.ndarray(tuple(reversed(ne)), dtype=dt, buffer=buf, strides=tuple(reversed(nb)))
    return view.astype(np.float32).reshape(-1)


def _quiet(_level: int, _text: bytes, _ud: Any) -> None:
    pass


_QUIET: Any = None


def llama_cpp_run(path: str, ids: list[int], pos: int) -> tuple[np.ndarray, dict[str, list[np.ndarray]]]:
    """llama.cpp's logits for ``ids`` fed one by one, and its named tensors (in graph order) at ``pos``."""
    import llama_cpp as L

    global _QUIET
    _QUIET = L.llama_log_callback(_quiet)
    seen: dict[str, list[np.ndarray]] = {}
    cur = [0]

    @L.ggml_backend_sched_eval_callback
    def cb(tp: int, ask: bool, _ud: Any) -> bool:
        if ask or cur[0] != pos:
            return True
        t = GgmlTensor.from_address(tp)
        a = tensor_array(t)
        if a is not None:
            seen.setdefault(t.name.decode(), []).append(a)
        return True

    L.llama_log_set(_QUIET, None)
    L.llama_backend_init()
    model = L.llama_model_load_from_file(path.encode(), L.llama_model_default_params())
    cp = L.llama_context_default_params()
    cp.n_ctx = cp.n_batch = cp.n_ubatch = 256 * ((len(ids) + 255) // 256)
    cp.flash_attn_type = 0  # LLAMA_FLASH_ATTN_TYPE_DISABLED
    cp.cb_eval = cb
    ctx = L.llama_init_from_model(model, cp)
    n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
    out = np.empty((len(ids), n_vocab), np.float32)
    try:
        for i, tok in enumerate(ids):
            cur[0] = i
            if L.llama_decode(ctx, L.llama_batch_get_one((L.llama_token * 1)(tok), 1)) != 0:
                raise SystemExit(f"llama_decode failed at position {i}")
            out[i] = np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, -1), shape=(n_vocab,))
    finally:
        L.llama_free(ctx)
        L.llama_model_free(model)
    return out, seen


def ggml_ops(names: set[str]) -> dict[str, Any]:
    """Replacements for NativeBackend.glu / .attention that run the loaded ggml's own ops."""
    sys.path.insert(0, str(ROOT / "tests" / "fixtures"))
    import make_native_ggml_fixtures as G

    base, cpu = G._load_ggml()

    def glu(gate: np.ndarray, up: np.ndarray, kind: str, out: Any = None) -> np.ndarray:
        g = G.Graph(base, cpu)
        fn = base.ggml_swiglu_split if kind == "silu" else base.ggml_geglu_split
        try:
            return g.compute(fn(g.ctx, g.tensor(np.ascontiguousarray(gate, np.float32)),
                                g.tensor(np.ascontiguousarray(up, np.float32))), gate.shape)
        finally:
            g.close()

    def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, q_pos: np.ndarray, k_pos: np.ndarray,
                  scale: float, window: Any = None, softcap: Any = None, out: Any = None) -> np.ndarray:
        if window or softcap or k.dtype != np.float16:
            raise SystemExit("--ggml-ops attn: only plain attention over an F16 cache")
        g = G.Graph(base, cpu)
        try:
            return G.attention(g, np.ascontiguousarray(q, np.float32), np.ascontiguousarray(k),
                               np.ascontiguousarray(v), q_pos, k_pos, scale, n_cells=256 * ((k.shape[0] + 255) // 256))
        finally:
            g.close()

    return {n: f for n, f in (("glu", glu), ("attn", attention)) if n in names}


def llmedge_run(dec: Any, ids: list[int], pos: int, fused: bool, swap: dict[str, Any]) -> tuple[np.ndarray, list]:
    """llmedge's logits for ``ids`` fed one by one; without ``fused``, also each op's output at ``pos``
    (the backend's methods are shadowed on the instance for the run)."""
    from llmedge.models.base import Batch

    be = dec.backend
    rec: list = []
    if not fused:
        be.decoder_layers = None
        if "glu" in swap:
            be.glu = swap["glu"]
        if "attn" in swap:
            be.attention = swap["attn"]
        for name in RECORDED:
            def wrapped(*a: Any, _f: Any = getattr(be, name), **k: Any) -> Any:
                r = _f(*a, **k)
                if cur[0] == pos:
                    rec.append(np.array(r, np.float32).reshape(-1))
                return r
            setattr(be, name, wrapped)
    cur = [0]
    cache = dec.make_cache(len(ids), "f16", 1)
    out = []
    try:
        for i, t in enumerate(ids):
            cur[0] = i
            out.append(dec.forward(Batch(np.array([t]), np.array([i]), cache, None, True))[0])
    finally:
        for name in ("decoder_layers", *RECORDED, "attention", "glu"):
            be.__dict__.pop(name, None)
    return np.array(out, np.float32), rec


def stats(name: str, ours: np.ndarray, ref: np.ndarray) -> None:
    d = np.abs(ours - ref)
    rows = d.max(axis=1)
    print(f"{name:34} mean |delta| {d.mean():.4g}  pos0 max {rows[0]:.4g}  rows equal {int((rows == 0).sum())}/{len(rows)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("text")
    ap.add_argument("-n", type=int, default=64, help="tokens of the text (default 64)")
    ap.add_argument("--pos", type=int, default=0, help="position whose layer tensors are compared")
    ap.add_argument("--ggml-ops", default="", help="comma list of glu, attn: ggml's own ops in the op-by-op path")
    ap.add_argument("--llama-cpp", default="/work/lcpp/lib/python3.11/site-packages",
                    help="directory holding llama-cpp-python (appended to sys.path)")
    a = ap.parse_args()
    swap_names = {s for s in a.ggml_ops.split(",") if s}
    if swap_names - {"glu", "attn"}:
        ap.error(f"--ggml-ops: unknown op(s) {', '.join(sorted(swap_names - {'glu', 'attn'}))}")
    sys.path.append(a.llama_cpp)
    import llmedge
    from llmedge.store import Store

    path = str(Store().resolve(a.model)) if not Path(a.model).exists() else a.model
    m = llmedge.load(path, backend="native", n_ctx=max(a.n, 16))
    ids = m.tokenize(Path(a.text).read_text(encoding="utf-8"))[: a.n]
    if not 0 <= a.pos < len(ids):
        ap.error(f"--pos {a.pos} is outside the {len(ids)} tokens evaluated")
    ref, seen = llama_cpp_run(path, ids, a.pos)
    fused, _ = llmedge_run(m.model, ids, a.pos, True, {})
    ops, rec = llmedge_run(m.model, ids, a.pos, False, ggml_ops(swap_names) if swap_names else {})
    print(f"{len(ids)} tokens fed one by one: llama.cpp against llmedge's native backend")
    stats("fused stack", fused, ref)
    stats(f"op by op{' with ggml ' + a.ggml_ops if swap_names else ''}", ops, ref)
    print(f"layer tensors at position {a.pos} that differ from llama.cpp's (max |delta|):")
    n_layer = (len(rec) - 1) // len(LAYER_OPS)
    for il in range(n_layer):
        got = rec[1 + il * len(LAYER_OPS) : 1 + (il + 1) * len(LAYER_OPS)]
        diffs = []
        for (name, occ), ours in zip(LAYER_OPS, got):
            theirs = [t for t in seen.get(f"{name}-{il}", []) if t.size == ours.size]
            if theirs:
                dmax = float(np.abs(ours - theirs[occ]).max())
                if dmax:
                    diffs.append(f"{name}{'(rope)' if occ else ''} {dmax:.2g}")
        print(f"  layer {il:2}: {', '.join(diffs) or 'all equal'}")


if __name__ == "__main__":
    sys.exit(main())
