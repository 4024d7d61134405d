"""Every malformed-GGUF class of issue 20, by family: a builder of the file's bytes and the words the
one-line refusal must contain. The family test modules check the reader (or the model check) on each;
test_malformed_surfaces.py runs all of them through the CLI commands and the server."""

from __future__ import annotations

import struct
from collections.abc import Callable

from gguf_bytes import (
    ARRAY,
    F32,
    I32,
    Q8_0_TYPE,
    STRING,
    U8,
    U32,
    U64,
    RawGGUF,
    Tensor,
    gstr,
    minimal,
    tiny_model,
)

Case = tuple[Callable[[], bytes], str]


def _patch(data: bytes, at: int, raw: bytes) -> bytes:
    return data[:at] + raw + data[at + len(raw):]


def _with_kv(key: str | bytes, vtype: int, payload: bytes) -> bytes:
    g = minimal()
    g.kvs.append((key, vtype, payload))
    return g.build()


def _with_tensor(t: Tensor, *more: Tensor) -> bytes:
    g = minimal()
    g.tensors = [t, *more]
    return g.build()


def _nested(depth: int) -> bytes:
    payload = struct.pack("<IQ", U8, 1) + b"\x01"
    for _ in range(depth):
        payload = struct.pack("<IQ", ARRAY, 1) + payload
    return _with_kv("test.nested", ARRAY, payload)


HEADER: dict[str, Case] = {
    "bad magic": (lambda: b"GGUX" + minimal().build()[4:], "not a GGUF file"),
    "ggml magic (a pre-GGUF file)": (lambda: b"lmgg" + minimal().build()[4:], "not a GGUF file"),
    "version 0": (lambda: _patch(minimal().build(), 4, struct.pack("<I", 0)), "unsupported GGUF version 0"),
    "version 1": (lambda: _patch(minimal().build(), 4, struct.pack("<I", 1)), "GGUF v1 is obsolete"),
    "version 4": (lambda: _patch(minimal().build(), 4, struct.pack("<I", 4)), "unsupported GGUF version 4"),
    "version byte-swapped": (lambda: _patch(minimal().build(), 4, struct.pack(">I", 3)), "byte-swapped"),
    "tensor count huge": (lambda: _patch(minimal().build(), 8, struct.pack("<Q", 1 << 40)),
                          "tensor count 1099511627776 is impossible"),
    "tensor count negative": (lambda: _patch(minimal().build(), 8, struct.pack("<q", -1)),
                              "tensor count 18446744073709551615 is negative"),
    "metadata count huge": (lambda: _patch(minimal().build(), 16, struct.pack("<Q", 1 << 33)),
                            "metadata count 8589934592 is impossible"),
    "metadata count negative": (lambda: _patch(minimal().build(), 16, struct.pack("<q", -7)), "is negative"),
    "metadata count one too many": (lambda: _patch(minimal().build(), 16, struct.pack("<Q", 3)), "tensor"),
    "empty file": (lambda: b"", "empty file"),
    "only the magic": (lambda: b"GGUF", "truncated"),
}

METADATA: dict[str, Case] = {
    "key length -1": (lambda: _with_kv("test.marker", U8, b"\x01").replace(gstr("test.marker"),
                                                                           struct.pack("<q", -1) + b"test.marker"),
                      "negative length"),
    "empty key": (lambda: _with_kv(b"", U32, struct.pack("<I", 1)), "empty key"),
    "duplicate key": (lambda: _with_kv("general.name", STRING, gstr("again")), "duplicate metadata key"),
    "value type out of range": (lambda: _with_kv("test.x", 13, b"\x00" * 8), "unknown value type 13"),
    "value type huge": (lambda: _with_kv("test.x", 0xFFFFFFFF, b"\x00" * 8), "unknown value type 4294967295"),
    "array element type out of range": (lambda: _with_kv("test.a", ARRAY, struct.pack("<IQ", 99, 1) + b"\x00"),
                                        "unknown element type 99"),
    "array of arrays": (lambda: _nested(1), "nested arrays are not supported"),
    "deep nesting": (lambda: _nested(10_000), "nested arrays are not supported"),
    "string past the end": (lambda: _with_kv("test.s", STRING, gstr("abc", length=1 << 20)), "needs 1048576 bytes"),
    "string over 1 GiB": (lambda: _with_kv("test.s", STRING, gstr("abc", length=(1 << 30) + 1)),
                          "over the 1 GiB limit"),
    "string length negative": (lambda: _with_kv("test.s", STRING, gstr("abc", length=-2)), "negative length"),
    "array past the end": (lambda: _with_kv("test.a", ARRAY, struct.pack("<IQ", U32, 1 << 20)), "past the end"),
    "array over 1 GiB": (lambda: _with_kv("test.a", ARRAY, struct.pack("<IQ", U64, 1 << 28)), "over the 1 GiB limit"),
    "string array past the end": (lambda: _with_kv("test.a", ARRAY, struct.pack("<IQ", STRING, 1 << 16)),
                                  "past the end"),
    "string array element past the end": (
        lambda: _with_kv("test.a", ARRAY, struct.pack("<IQ", STRING, 2) + gstr("ok") + gstr("x", length=1 << 16)),
        "element 1 of 'test.a'"),
    "alignment not u32": (lambda: _with_kv("general.alignment", U64, struct.pack("<Q", 32)),
                          "general.alignment must be a uint32"),
    "alignment a string": (lambda: _with_kv("general.alignment", STRING, gstr("32")),
                           "general.alignment must be a uint32"),
    "alignment zero": (lambda: _with_kv("general.alignment", U32, struct.pack("<I", 0)), "power of two, got 0"),
    "alignment not a power of two": (lambda: _with_kv("general.alignment", U32, struct.pack("<I", 48)),
                                     "power of two, got 48"),
}

TENSORS: dict[str, Case] = {
    "tensor name of 64 bytes": (lambda: _with_tensor(Tensor("n" * 64, (4,))), "longer than 63 bytes"),
    "tensor name of 1 MiB": (lambda: _with_tensor(Tensor("n" * (1 << 20), (4,))), "longer than 63 bytes"),
    "duplicate tensor name": (lambda: _with_tensor(Tensor("a", (4,)), Tensor("a", (4,))), "duplicate tensor name 'a'"),
    "rank 5": (lambda: _with_tensor(Tensor("a", (1, 1, 1, 1, 1))), "rank 5"),
    "rank 0": (lambda: _with_tensor(Tensor("a", (), data=b"\x00" * 4)), "rank 0"),
    "rank huge": (lambda: _with_tensor(Tensor("a", (4,), n_dims=0xFFFFFFFF)), "rank 4294967295"),
    "negative dimension": (lambda: _with_tensor(Tensor("a", (4, -1), data=b"\x00" * 16)), "negative dimension"),
    "element count overflow": (lambda: _with_tensor(Tensor("a", (1 << 32, 1 << 32), data=b"")),
                               "overflow int64 elements"),
    "type out of range": (lambda: _with_tensor(Tensor("a", (4,), ggml_type=1000, data=b"\x00" * 16)),
                          "unknown GGML type 1000"),
    "removed type Q4_2": (lambda: _with_tensor(Tensor("a", (32,), ggml_type=4, data=b"\x00" * 20)),
                          "unknown GGML type 4"),
    "removed type Q4_0_4_4": (lambda: _with_tensor(Tensor("a", (32,), ggml_type=31, data=b"\x00" * 20)),
                              "unknown GGML type 31"),
    "row not a multiple of the block size": (
        lambda: _with_tensor(Tensor("a", (33, 2), ggml_type=Q8_0_TYPE, data=b"\x00" * 68)),
        "not a multiple of the Q8_0 block size 32"),
    "byte size overflow": (lambda: _with_tensor(Tensor("a", (1 << 31, 1 << 31), data=b"")), "overflows int64"),
    "offset not the running sum": (lambda: _with_tensor(Tensor("a", (8,)), Tensor("b", (8,), offset=64)),
                                   "not the end of the previous tensor"),
    "offset misaligned": (lambda: _with_tensor(Tensor("a", (8,)), Tensor("b", (8,), offset=33)), "not aligned"),
    "tensors overlapping": (lambda: _with_tensor(Tensor("a", (16,)), Tensor("b", (8,), offset=0)),
                            "not the end of the previous tensor"),
    "padded size overflow": (lambda: _with_tensor(Tensor("a", (8,)), Tensor("b", (8,), offset=(1 << 64) - 32)),
                             "data offset 18446744073709551584"),
    "tensor end past the end of the file": (lambda: minimal().build()[:-40], "runs past the end"),
    "huge tensor past the end": (lambda: _with_tensor(Tensor("a", (1 << 20, 1 << 20), data=b"\x00" * 64)),
                                 "runs past the end"),
}


def _model(**kw: object) -> Callable[[], bytes]:
    return lambda: tiny_model(**kw).build()  # type: ignore[arg-type]


def _model_kv(key: str, vtype: int, v: object) -> Callable[[], bytes]:
    def build() -> bytes:
        g = tiny_model()
        g.kvs = [kv for kv in g.kvs if kv[0] != key]
        return g.kv(key, vtype, v).build()

    return build


MODEL: dict[str, Case] = {
    "block_count over 512": (_model(block_count=513), "block_count = 513 is out of range"),
    "block_count zero": (_model(block_count=0), "block_count = 0 is out of range"),
    "head count zero": (_model_kv("llama.attention.head_count", U32, 0), "head_count = 0 is out of range"),
    "kv heads not dividing heads": (_model_kv("llama.attention.head_count_kv", U32, 3), "head_count_kv = 3 is out of range"),
    "bos id past the vocabulary": (_model(bos_id=10_000), "bos_token_id' = 10000 is not a token id"),
    "eos id negative": (_model_kv("tokenizer.ggml.eos_token_id", I32, -1), "eos_token_id' = -1 is not a token id"),
    "byte token <0x-1>": (_model(byte_token="<0x-1>"), "not of the form <0xNN>"),
    "byte token <0x41 >": (_model(byte_token="<0x4>"), "not of the form <0xNN>"),
    "vocabulary smaller than the embedding matrix": (_model(embd_rows=400), "has 400 rows but the vocabulary has"),
    "vocabulary larger than the embedding matrix": (_model(embd_rows=100), "has 100 rows but the vocabulary has"),
    "layer tensor of the wrong shape": (
        lambda: _bend(_narrow_q), "blk.0.attn_q.weight' has shape [16, 8], expected [16, 16]"),
    "embedding length huge": (_model_kv("llama.embedding_length", U32, 1 << 30), "embedding_length"),
    "scores shorter than the vocabulary": (_model_kv("tokenizer.ggml.scores", ARRAY, (F32, [0.0] * 5)), "scores"),
}


def _narrow_q(g: RawGGUF) -> None:
    q = next(t for t in g.tensors if t.name == "blk.0.attn_q.weight")
    q.dims, q.data = (16, 8), bytes(16 * 8 * 4)


def _bend(change: Callable[[RawGGUF], None]) -> bytes:
    g = tiny_model()
    change(g)
    return g.build()


FAMILIES = {"header": HEADER, "metadata": METADATA, "tensors": TENSORS, "model": MODEL}
ALL: dict[str, Case] = {k: v for fam in FAMILIES.values() for k, v in fam.items()}
