"""Tokenizer speed: build, encode (cold and warm caches) and decode a ~35 KB document.

    python benchmarks/tokenize_speed.py MODEL.gguf [MODEL.gguf ...] [--text FILE] [--kb 35]

Without ``--text`` the document is the English and mixed-script texts of the tokenizer corpus
(tests/fixtures/tokenizer_corpus.json) repeated to the requested size. When llama-cpp-python is
importable the same document is also tokenized by llama.cpp, and the ids are compared.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from llmedge.gguf import GGUFFile
from llmedge.tokenizer import Tokenizer

CORPUS = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "tokenizer_corpus.json"


def _document(path: str | None, kb: int) -> str:
    if path:
        text = Path(path).read_text(encoding="utf-8")
    else:
        text = "\n\n".join(t for t in json.loads(CORPUS.read_text(encoding="utf-8"))["texts"] if t.strip())
    target = kb * 1024
    while len(text.encode("utf-8")) < target:
        text += "\n\n" + text
    return text.encode("utf-8")[:target].decode("utf-8", errors="ignore")


def _timed(fn, repeat: int = 1) -> tuple[float, object]:
    best, result = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - t0)
    return best, result


def bench(model: str, text: str) -> None:
    meta = GGUFFile(model).metadata
    t_build, tok = _timed(lambda: Tokenizer.from_metadata(meta))
    assert isinstance(tok, Tokenizer)
    t_cold, ids = _timed(lambda: tok.encode(text, special=True))
    assert isinstance(ids, list)
    t_warm, _ = _timed(lambda: tok.encode(text, special=True), repeat=3)
    t_dec, _ = _timed(lambda: tok.decode(ids), repeat=3)
    n = len(ids)
    print(f"{Path(model).name}: vocab {tok.n_vocab}, {n} tokens")
    print(f"  build       {t_build * 1e3:8.1f} ms")
    print(f"  encode cold {t_cold * 1e3:8.1f} ms ({n / t_cold:,.0f} tok/s)   warm {t_warm * 1e3:8.1f} ms")
    print(f"  decode      {t_dec * 1e3:8.1f} ms")
    try:
        from llama_cpp import Llama
    except ImportError:
        return
    llm = Llama(model_path=model, vocab_only=True, verbose=False)
    raw = text.encode("utf-8")
    t_ref, ref = _timed(lambda: llm.tokenize(raw, add_bos=False, special=True), repeat=3)
    same = "identical ids" if ref == ids else "IDS DIFFER"
    print(f"  llama.cpp   {t_ref * 1e3:8.1f} ms  (llmedge cold / llama.cpp = {t_cold / t_ref:.1f}x, {same})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="+")
    ap.add_argument("--text", help="a UTF-8 file to tokenize instead of the corpus")
    ap.add_argument("--kb", type=int, default=35, help="document size in KiB (default 35)")
    args = ap.parse_args()
    text = _document(args.text, args.kb)
    print(f"document: {len(text.encode('utf-8'))} bytes, {len(text)} characters")
    for model in args.models:
        bench(model, text)


if __name__ == "__main__":
    main()
