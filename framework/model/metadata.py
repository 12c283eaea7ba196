"""Typed reads of GGUF metadata: every key the project uses is checked for its type and range where it is
read, and a wrong one is an error naming the key, what it holds and what is expected.

Values are as the reader decoded them: int, float, bool, str, or a list of those (GGUF arrays).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

MISSING = object()      # no default: the key must be there


class MetadataError(ValueError):
    """A metadata key the model needs is missing, of the wrong type, or out of range."""


def describe(value: Any) -> str:
    """What a metadata value is, in words, short enough for an error message."""
    if isinstance(value, bool):
        return f"the boolean {value}"
    if isinstance(value, int):
        return f"the integer {value}"
    if isinstance(value, float):
        return f"the number {value!r}"
    if isinstance(value, str):
        text = value if len(value) <= 40 else value[:37] + "..."
        return f"the string {text!r}"
    if isinstance(value, list):
        if not value:
            return "an empty array"
        kinds = sorted({_kind(v) for v in value[:1000]})
        return f"an array of {len(value)} {' and '.join(kinds)}"
    return f"a {type(value).__name__}"


def _kind(v: Any) -> str:
    if isinstance(v, bool):
        return "booleans"
    if isinstance(v, int):
        return "integers"
    if isinstance(v, float):
        return "numbers"
    if isinstance(v, str):
        return "strings"
    if isinstance(v, list):
        return "arrays"
    return type(v).__name__


def _wrong(key: str, value: Any, expected: str) -> MetadataError:
    return MetadataError(f"metadata key '{key}' holds {describe(value)}; expected {expected}")


def _range(lo, hi) -> str:
    if lo is not None and hi is not None:
        return f" from {lo} to {hi}"
    if lo is not None:
        return f" of at least {lo}"
    return f" of at most {hi}" if hi is not None else ""


def get(meta: Mapping[str, Any], key: str, default: Any = MISSING) -> Any:
    if key in meta:
        return meta[key]
    if default is MISSING:
        raise MetadataError(f"metadata key '{key}' is missing; the model needs it")
    return default


def get_int(meta: Mapping[str, Any], key: str, default: Any = MISSING, lo: int | None = None,
            hi: int | None = None) -> int:
    """An integer key (any GGUF integer type), within [lo, hi]."""
    value = get(meta, key, default)
    if value is default and key not in meta:
        return value
    if isinstance(value, bool) or not isinstance(value, int):
        raise _wrong(key, value, f"an integer{_range(lo, hi)}")
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise _wrong(key, value, f"an integer{_range(lo, hi)}")
    return value


def get_float(meta: Mapping[str, Any], key: str, default: Any = MISSING, *, above: float | None = None,
              below: float | None = None) -> float:
    """A finite number key (a GGUF float, or an integer), strictly between ``above`` and ``below``."""
    value = get(meta, key, default)
    if value is default and key not in meta:
        return value
    bounds = (f" above {above:g}" if above is not None else "") + (f" and below {below:g}" if below is not None
                                                                    else "")
    expected = f"a finite number{bounds}"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _wrong(key, value, expected)
    value = float(value)
    if not math.isfinite(value) or (above is not None and value <= above) or (below is not None and value >= below):
        raise _wrong(key, value, expected)
    return value


def get_str(meta: Mapping[str, Any], key: str, default: Any = MISSING) -> str:
    value = get(meta, key, default)
    if value is default and key not in meta:
        return value
    if not isinstance(value, str):
        raise _wrong(key, value, "a string")
    return value


def get_bool(meta: Mapping[str, Any], key: str, default: Any = MISSING) -> bool:
    value = get(meta, key, default)
    if value is default and key not in meta:
        return value
    if not isinstance(value, bool):
        raise _wrong(key, value, "a boolean")
    return value


def get_list(meta: Mapping[str, Any], key: str, kind: str, default: Any = MISSING, length: int | None = None) -> list:
    """An array key whose elements are all of one kind: 'strings', 'integers' or 'numbers' (floats or
    integers); ``length``: the number of elements it must have."""
    value = get(meta, key, default)
    if value is default and key not in meta:
        return value
    types = {"strings": (str,), "integers": (int,), "numbers": (int, float)}[kind]
    need = f"an array of {kind}" + (f" with {length} elements (one per token)" if length is not None else "")
    if not isinstance(value, list):
        raise _wrong(key, value, need)
    if not set(map(type, value)) <= set(types):          # exact types: a bool is not an integer here
        i, v = next((i, v) for i, v in enumerate(value) if type(v) not in types)
        raise MetadataError(f"metadata key '{key}': element {i} is {describe(v)}; expected {need}")
    if length is not None and len(value) != length:
        raise _wrong(key, value, need)
    return value
