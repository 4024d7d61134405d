"""``llmedge quantize`` against llama.cpp's ``llama_model_quantize`` on a real model: same bytes? how fast?

    python benchmarks/quantize_vs_llamacpp.py MODEL [--mixes Q4_K_M,Q8_0,...] [--imatrix FILE]
        [--llama-python /work/lcpp-venv/bin/python]

MODEL (a path or a stored name) is first turned into an F16 GGUF by ``llmedge quantize F16
--allow-requantize`` (and by llama.cpp, to check that those two agree too); then every mix is
quantized from that F16 by both, and the sha256 and wall time of each side are printed. llama.cpp
runs in the interpreter given by ``--llama-python`` (llama-cpp-python installed there; it is never
a dependency of llmedge), through ``tests/fixtures/make_quantize_mix_fixtures.py``'s ctypes
bindings. Timings are wall clock on whatever else the machine is doing: compare them as ratios.
"""

from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ALL_MIXES = "Q4_K_M,Q8_0,Q4_0,Q4_1,Q5_0,Q5_1,Q2_K,Q3_K_S,Q3_K_M,Q3_K_L,Q4_K_S,Q5_K_S,Q5_K_M,Q6_K,IQ4_NL,IQ4_XS,F16,BF16,F32"

LLAMA_SIDE = r"""
import ctypes, sys, time, importlib.util
from pathlib import Path
spec = importlib.util.spec_from_file_location("mk", sys.argv[1])
mk = importlib.util.module_from_spec(spec); spec.loader.exec_module(mk)
lib, _ = mk.load_llama()
src, dst, mix, im = sys.argv[2:6]
p = lib.llama_model_quantize_default_params()
p.ftype, p.nthread, p.allow_requantize = mk.FTYPE[mix], 2, True
keep = []
if im:
    mk.apply_imatrix(p, Path(im), im, keep)
t = time.perf_counter()
rc = lib.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(p))
print(rc, time.perf_counter() - t)
"""


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            h.update(block)
    return h.hexdigest()


def llama(py: str, src: Path, dst: Path, mix: str, imatrix: str) -> tuple[int, float]:
    script = str(ROOT / "tests" / "fixtures" / "make_quantize_mix_fixtures.py")
    r = subprocess.run([py, "-c", LLAMA_SIDE, script, str(src), str(dst), mix, imatrix],
                       capture_output=True, text=True, check=True)
    rc, seconds = r.stdout.split()[-2:]
    return int(rc), float(seconds)


def llmedge(src: Path, dst: Path, mix: str, imatrix: str) -> tuple[int, float]:
    cmd = [sys.executable, "-m", "llmedge.cli.main", "quantize", str(src), str(dst), mix, "-q", "--allow-requantize"]
    t = time.perf_counter()
    r = subprocess.run(cmd + (["--imatrix", imatrix] if imatrix else []), capture_output=True, text=True)
    return r.returncode, time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--mixes", default=ALL_MIXES)
    ap.add_argument("--imatrix", default="")
    ap.add_argument("--llama-python", default="/work/lcpp-venv/bin/python")
    a = ap.parse_args()
    from llmedge.store import Store

    src = Store().resolve(a.model)
    with tempfile.TemporaryDirectory() as tmp:
        f16, f16_llama = Path(tmp) / "f16.gguf", Path(tmp) / "f16-llama.gguf"
        llmedge(src, f16, "F16", "")
        llama(a.llama_python, src, f16_llama, "F16", "")
        print(f"F16 from {src.name}: {'same' if sha256(f16) == sha256(f16_llama) else 'DIFFERENT'} bytes")
        f16_llama.unlink()
        print(f"{'mix':8} {'bytes':>9} {'llama.cpp s':>12} {'llmedge s':>10} {'ratio':>6}")
        for mix in a.mixes.split(","):
            out_l, out_e = Path(tmp) / "l.gguf", Path(tmp) / "e.gguf"
            rc_l, t_l = llama(a.llama_python, f16, out_l, mix, a.imatrix)
            rc_e, t_e = llmedge(f16, out_e, mix, a.imatrix)
            if rc_l or rc_e:
                same = "both refused" if rc_l and rc_e else f"rc {rc_l}/{rc_e}"
            else:
                same = "same" if sha256(out_l) == sha256(out_e) else "DIFFERENT"
            print(f"{mix:8} {same:>9} {t_l:12.1f} {t_e:10.1f} {t_e / t_l:6.2f}", flush=True)
            out_l.unlink(missing_ok=True)
            out_e.unlink(missing_ok=True)


if __name__ == "__main__":
    main()
