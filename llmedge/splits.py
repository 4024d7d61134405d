"""Split GGUF files (`NAME-00001-of-0000N.gguf`, as llama-gguf-split and the converters write them)
assembled into one GGUF: the first part's metadata without the `split.*` keys, then every part's
tensors in order, written with the `gguf` package. Each part is checked against its `split.no` /
`split.count` first, so parts from different models or in the wrong order are refused."""

from __future__ import annotations

import re
from pathlib import Path

from .errors import StoreError

SPLIT_RE = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)


def split_siblings(filename: str, files: list[str]) -> list[str] | None:
    """All parts of the split file `filename` found in `files`, in order; None if it is not split.
    StoreError when a part is missing."""
    m = SPLIT_RE.search(filename)
    if m is None:
        return None
    count = int(m.group(2))
    stem = filename[: m.start()]
    wanted = [f"{stem}-{i:05d}-of-{count:05d}.gguf" for i in range(1, count + 1)]
    lower = {f.lower(): f for f in files}
    missing = [w for w in wanted if w.lower() not in lower]
    if missing:
        raise StoreError(f"split model {filename}: part {missing[0]} is missing")
    return [lower[w.lower()] for w in wanted]


def _field(reader, key: str):  # noqa: ANN001, ANN202 - gguf.GGUFReader internals
    f = reader.fields.get(key)
    return None if f is None else f.contents()


def merge_splits(parts: list[Path], out: Path) -> None:
    """Write the parts of a split GGUF as one GGUF file at `out`."""
    import gguf

    try:
        readers = [gguf.GGUFReader(p) for p in parts]
    except (ValueError, OSError) as e:
        raise StoreError(f"cannot read split model part: {e}") from None
    for i, r in enumerate(readers):
        no, count = _field(r, "split.no"), _field(r, "split.count")
        if no != i or count != len(parts):
            raise StoreError(f"{parts[i].name} is not part {i + 1} of {len(parts)} (split.no={no}, "
                             f"split.count={count})")
    first = readers[0]
    arch = _field(first, "general.architecture")
    if not isinstance(arch, str):
        raise StoreError(f"{parts[0].name} has no general.architecture")
    w = gguf.GGUFWriter(out, arch, endianess=first.endianess)
    alignment = _field(first, "general.alignment")
    if isinstance(alignment, int) and alignment > 0:
        w.data_alignment = alignment
    for field in first.fields.values():
        if field.name in ("general.architecture", "general.alignment") or field.name.startswith(("GGUF.", "split.")):
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(field.name, field.contents(), vtype, sub_type=sub)
    for r in readers:
        for t in r.tensors:
            w.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for r in readers:
        for t in r.tensors:
            w.write_tensor_data(t.data, tensor_endianess=r.endianess)
    w.close()
