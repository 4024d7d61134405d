"""Values printed as Ollama's Go code prints them: ``%q`` (strconv.Quote) for names in its error
messages and stop strings, ``%v`` / ``%#v`` for the numbers and booleans of a model's parameters."""

from __future__ import annotations

import math
from decimal import Decimal
from typing import Any

_ESCAPES = {"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\v": "\\v",
            '"': '\\"', "\\": "\\\\"}


def go_quote(s: str) -> str:
    """Go's ``strconv.Quote`` (``%q``): escapes for quotes, backslashes and what is not printable."""
    out = []
    for ch in s:
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif ch.isprintable():
            out.append(ch)
        elif ord(ch) < 0x80:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(f"\\u{ord(ch):04x}" if ord(ch) < 0x10000 else f"\\U{ord(ch):08x}")
    return '"' + "".join(out) + '"'


def go_float(v: float) -> str:
    """Go's ``%v`` of a float64 (strconv's shortest ``g``: exponent form below 1e-4 and from 1e+06)."""
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    if v == 0:
        return "-0" if math.copysign(1, v) < 0 else "0"
    sign, digits, exp10 = Decimal(repr(v)).as_tuple()
    ds = "".join(map(str, digits)).rstrip("0")
    exp10 = int(exp10) + len(digits) - len(ds)  # trailing zeros moved into the exponent
    x = len(ds) + exp10 - 1  # the decimal exponent of the first digit
    neg = "-" if sign else ""
    if x < -4 or x >= 6:
        return f"{neg}{ds[0]}{'.' + ds[1:] if len(ds) > 1 else ''}e{'-' if x < 0 else '+'}{abs(x):02d}"
    return neg + format(Decimal(f"{ds}e{exp10}"), "f")


def go_value(v: Any) -> str:
    """Go's ``%#v`` of a JSON-decoded value: numbers are float64, strings quoted, booleans lower case."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return go_float(float(v))
    return go_quote(str(v))


def float32_shortest(v: float) -> float:
    """``v`` as Ollama keeps a Modelfile's float PARAMETER: parsed as a float32 (api.FormatParams) and
    sent as JSON (the float32's shortest digits), read back as a float64: 0.123456789 -> 0.12345679."""
    import numpy as np

    if not math.isfinite(v):
        return v
    with np.errstate(over="ignore"):
        f32 = np.float32(v)
    return float(np.format_float_positional(f32, unique=True, trim="-")) if math.isfinite(f32) else v
