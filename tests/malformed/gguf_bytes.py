"""Raw GGUF bytes for the malformed-file tests: a writer that can say anything the format can encode
(and things it cannot: wrong counts, bad lengths, odd offsets), plus a tiny valid llama model whose
metadata the model-level cases bend. Nothing here uses llmedge, so a reader bug cannot hide itself."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
F32_TYPE, F16_TYPE, Q8_0_TYPE = 0, 1, 8
_FMT = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f", BOOL: "<?", U64: "<Q",
        I64: "<q", F64: "<d"}


def gstr(s: str | bytes, length: int | None = None) -> bytes:
    """A GGUF string: u64 length (``length`` overrides the true one) and the bytes."""
    raw = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(raw) if length is None else length % (1 << 64)) + raw


def value(vtype: int, v: object) -> bytes:
    """The encoded payload of a metadata value of ``vtype`` (arrays: ``(etype, items)``)."""
    if vtype == STRING:
        return gstr(v)  # type: ignore[arg-type]
    if vtype == ARRAY:
        etype, items = v  # type: ignore[misc]
        return struct.pack("<IQ", etype, len(items)) + b"".join(value(etype, x) for x in items)
    return struct.pack(_FMT[vtype], v)


@dataclass
class Tensor:
    name: str | bytes
    dims: tuple[int, ...]
    ggml_type: int = F32_TYPE
    data: bytes | None = None  # None: zeros of the right size
    offset: int | None = None  # None: the padded running sum
    n_dims: int | None = None  # None: len(dims)

    def n_bytes(self) -> int:
        n = 1
        for d in self.dims:
            n *= d
        if self.ggml_type == Q8_0_TYPE:
            return n // 32 * 34
        return n * (2 if self.ggml_type == F16_TYPE else 4)


@dataclass
class RawGGUF:
    """A GGUF file as parts; ``build()`` joins them. Every field can be bent to make a malformed file."""

    kvs: list[tuple[str | bytes, int, bytes]] = field(default_factory=list)  # (key, type, encoded payload)
    tensors: list[Tensor] = field(default_factory=list)
    magic: bytes = b"GGUF"
    version: int = 3
    n_kv: int | None = None
    n_tensors: int | None = None
    alignment: int = 32  # used for padding; set general.alignment in kvs to announce another

    def kv(self, key: str | bytes, vtype: int, v: object) -> RawGGUF:
        self.kvs.append((key, vtype, value(vtype, v)))
        return self

    def build(self) -> bytes:
        out = bytearray(self.magic + struct.pack("<I", self.version))
        out += struct.pack("<Q", (len(self.tensors) if self.n_tensors is None else self.n_tensors) % (1 << 64))
        out += struct.pack("<Q", (len(self.kvs) if self.n_kv is None else self.n_kv) % (1 << 64))
        for key, vtype, payload in self.kvs:
            out += gstr(key) + struct.pack("<I", vtype) + payload
        datas, running = [], 0
        for t in self.tensors:
            data = t.data if t.data is not None else bytes(max(0, min(t.n_bytes(), 1 << 24)))
            offset = running if t.offset is None else t.offset
            out += gstr(t.name) + struct.pack("<I", len(t.dims) if t.n_dims is None else t.n_dims)
            out += b"".join(struct.pack("<Q", d % (1 << 64)) for d in t.dims)
            out += struct.pack("<IQ", t.ggml_type, offset % (1 << 64))
            datas.append(data)
            running += -(-len(data) // self.alignment) * self.alignment
        out += bytes(-len(out) % self.alignment)
        for data in datas:
            out += data + bytes(-len(data) % self.alignment)
        return bytes(out)

    def write(self, path: Path) -> Path:
        path.write_bytes(self.build())
        return path


def minimal() -> RawGGUF:
    """A valid file: two string keys and one small F32 tensor."""
    g = RawGGUF().kv("general.architecture", STRING, "llama").kv("general.name", STRING, "m")
    g.tensors.append(Tensor("t.weight", (8, 2)))
    return g


# -- a tiny valid llama model (SentencePiece vocabulary with byte tokens) ----------------------------

N_EMBD, N_HEAD, N_FF, N_LAYER = 16, 2, 32, 1
SPECIAL = ["<unk>", "<s>", "</s>"]
WORDS = ["▁", "▁a", "▁b", "▁the", "▁hello", "h", "e", "l", "o", "a", "b", "t"]


def tiny_vocab(byte_token: str | None = None) -> tuple[list[str], list[float], list[int]]:
    """Tokens, scores and token types; ``byte_token`` replaces the text of the byte token for 0x41."""
    tokens = SPECIAL + [f"<0x{b:02X}>" for b in range(256)] + WORDS
    if byte_token is not None:
        tokens[len(SPECIAL) + 0x41] = byte_token
    types = [2, 3, 3] + [6] * 256 + [1] * len(WORDS)
    scores = [0.0] * (len(SPECIAL) + 256) + [-float(i) for i in range(len(WORDS))]
    return tokens, scores, types


def tiny_model(*, block_count: int = N_LAYER, bos_id: int = 1, byte_token: str | None = None,
               embd_rows: int | None = None, seed: int = 0) -> RawGGUF:
    """A random-weight llama of one layer (a few tens of KB) that llmedge can load and run."""
    rng = np.random.default_rng(seed)
    tokens, scores, types = tiny_vocab(byte_token)
    n_vocab = len(tokens)
    g = RawGGUF()
    g.kv("general.architecture", STRING, "llama").kv("general.name", STRING, "tiny")
    g.kv("llama.block_count", U32, block_count).kv("llama.context_length", U32, 256)
    g.kv("llama.embedding_length", U32, N_EMBD).kv("llama.feed_forward_length", U32, N_FF)
    g.kv("llama.attention.head_count", U32, N_HEAD).kv("llama.attention.head_count_kv", U32, N_HEAD)
    g.kv("llama.attention.layer_norm_rms_epsilon", F32, 1e-5).kv("llama.rope.freq_base", F32, 10000.0)
    g.kv("tokenizer.ggml.model", STRING, "llama")
    g.kv("tokenizer.ggml.tokens", ARRAY, (STRING, tokens))
    g.kv("tokenizer.ggml.scores", ARRAY, (F32, scores))
    g.kv("tokenizer.ggml.token_type", ARRAY, (I32, types))
    g.kv("tokenizer.ggml.bos_token_id", U32, bos_id).kv("tokenizer.ggml.eos_token_id", U32, 2)
    g.kv("tokenizer.ggml.unknown_token_id", U32, 0)

    def f32(*shape: int) -> bytes:
        return (rng.standard_normal(shape) * 0.2).astype("<f4").tobytes()

    rows = n_vocab if embd_rows is None else embd_rows
    g.tensors.append(Tensor("token_embd.weight", (N_EMBD, rows), data=f32(rows, N_EMBD)))
    g.tensors.append(Tensor("output_norm.weight", (N_EMBD,), data=np.ones(N_EMBD, "<f4").tobytes()))
    for i in range(min(block_count, N_LAYER)):
        for name, dims in (("attn_norm", (N_EMBD,)), ("ffn_norm", (N_EMBD,))):
            g.tensors.append(Tensor(f"blk.{i}.{name}.weight", dims, data=np.ones(dims, "<f4").tobytes()))
        for name, dims in (("attn_q", (N_EMBD, N_EMBD)), ("attn_k", (N_EMBD, N_EMBD)),
                           ("attn_v", (N_EMBD, N_EMBD)), ("attn_output", (N_EMBD, N_EMBD)),
                           ("ffn_gate", (N_EMBD, N_FF)), ("ffn_up", (N_EMBD, N_FF)),
                           ("ffn_down", (N_FF, N_EMBD))):
            g.tensors.append(Tensor(f"blk.{i}.{name}.weight", dims, data=f32(dims[1], dims[0])))
    return g
