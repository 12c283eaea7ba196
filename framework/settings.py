"""Settings read from the environment: one table of every variable, and one reader that checks a value
where it is read.

Each setting is declared once, by the part of the project that reads it (the core here, a plugin in
its own module), with what it accepts and its default. ``read(name)`` returns the parsed value or
raises ``SettingError`` naming the variable, the value found and what is accepted; nothing is ever
silently taken as something else. ``framework settings`` lists every declared setting with its
effective value (``table()``).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class SettingError(ValueError):
    """An environment variable holds a value its reader does not accept."""


@dataclass(frozen=True)
class Setting:
    name: str
    owner: str                          # "core", or the plugin that reads it
    accepts: str                        # what is accepted, as a noun phrase ("4 or 8", "a positive whole number")
    default: Any                        # the value when the variable is unset or empty
    help: str
    parse: Callable[[str], Any]         # the text (stripped, non-empty) -> value; ValueError when refused
    secret: bool = False                # listed as set or not, never shown


SETTINGS: dict[str, Setting] = {}


def declare(name: str, owner: str, accepts: str, default: Any, help: str,
            parse: Callable[[str], Any], secret: bool = False) -> Setting:
    """Declare a setting (once per name; declaring it again with the same owner replaces it). A secret
    one (a key) is listed by whether it is set, never by its value."""
    known = SETTINGS.get(name)
    if known is not None and known.owner != owner:
        raise ValueError(f"setting {name} is declared by both {known.owner} and {owner}")
    s = SETTINGS[name] = Setting(name, owner, accepts, default, help, parse, secret)
    return s


def read(name: str, env: Mapping[str, str] | None = None) -> Any:
    """The value of a declared setting; its default when unset or empty; SettingError when malformed."""
    s = SETTINGS[name]
    raw = (os.environ if env is None else env).get(name)
    if raw is None or not raw.strip():
        return s.default
    try:
        return s.parse(raw.strip())
    except (ValueError, TypeError) as e:
        why = f" ({e})" if str(e) and not str(e).startswith(("invalid literal", "could not convert")) else ""
        raise SettingError(f"{name}={raw!r} is not {s.accepts}{why}") from None


def raw(name: str, env: Mapping[str, str] | None = None) -> str | None:
    """The text a declared setting is set to (None when unset), for a message that quotes it."""
    return (os.environ if env is None else env).get(SETTINGS[name].name)


def table(env: Mapping[str, str] | None = None) -> list[dict]:
    """Every declared setting: name, owner, raw value, effective value (or the error), default, help."""
    env = os.environ if env is None else env
    rows = []
    for s in sorted(SETTINGS.values(), key=lambda s: (s.owner != "core", s.owner, s.name)):
        row = {"name": s.name, "owner": s.owner, "raw": env.get(s.name), "default": s.default,
               "accepts": s.accepts, "help": s.help, "error": None, "value": None}
        try:
            row["value"] = read(s.name, env)
        except SettingError as e:
            row["error"] = str(e)
        if s.secret:
            row["raw"] = row["value"] = None if row["value"] is None else "(set, not shown)"
        rows.append(row)
    return rows


# -- parsers: each raises ValueError (the caller words the message) ------------------------------------
def whole(lo: int | None = None, hi: int | None = None) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = int(text)
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            raise ValueError("")
        return value
    return parse


def number(lo: float | None = None, *, above: bool = False) -> Callable[[str], float]:
    """A finite decimal number, at least lo (or above lo)."""
    def parse(text: str) -> float:
        value = float(text)
        if not math.isfinite(value) or (lo is not None and (value <= lo if above else value < lo)):
            raise ValueError("")
        return value
    return parse


def choice(options: Iterable[str], fold: bool = True) -> Callable[[str], str]:
    options = tuple(options)

    def parse(text: str) -> str:
        value = text.lower() if fold else text
        if value not in options:
            raise ValueError("")
        return value
    return parse


_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")
FLAG_ACCEPTS = "1, true, yes or on; 0, false, no or off"


def flag(text: str) -> bool:
    value = text.lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError("")


def names(text: str) -> tuple[str, ...]:
    """A comma-separated list of names (empty items dropped)."""
    return tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))


def op_names(known: frozenset[str], owner: str) -> Callable[[str], frozenset[str]]:
    """Comma-separated op names (any case), each one of `known` (the ops `owner` has kernels for)."""
    def parse(text: str) -> frozenset[str]:
        ops = frozenset(o.upper() for o in names(text))
        unknown = sorted(ops - known)
        if unknown:
            raise ValueError(f"{', '.join(unknown)} {'is not an op' if len(unknown) == 1 else 'are not ops'} "
                             f"{owner} has a kernel for")
        return ops
    return parse


def tuning(keys: tuple[str, ...]) -> Callable[[str], dict[str, int]]:
    """KEY=whole number, comma-separated, each KEY one of `keys` (a kernel's shape, for tuning and tests)."""
    def parse(text: str) -> dict[str, int]:
        out = {}
        for item in names(text.replace(" ", "")):
            key, sep, value = item.partition("=")
            if not sep or key not in keys or not value.isdigit():
                raise ValueError(f"'{item}' is not KEY=whole number with KEY one of {', '.join(keys)}")
            out[key] = int(value)
        return out
    return parse


def folder_or_off(text: str) -> Path | None:
    """'off': nothing is cached; otherwise a folder (made absolute: a relative one is the current folder's)."""
    if text.lower() == "off":
        return None
    return Path(text).expanduser().absolute()


# -- the core's settings ------------------------------------------------------------------------------
CACHE = declare(
    "FRAMEWORK_CACHE", "core", "a folder, or 'off' (no on-disk caches)", None,
    "root of the on-disk caches (GGUF index, OpenVINO compiled models, XDNA packed weights); unset or empty: "
    "$XDG_CACHE_HOME/framework or ~/.cache/framework", folder_or_off)
DISABLE_AUTOLOAD = declare(
    "FRAMEWORK_DISABLE_PLUGIN_AUTOLOAD", "core", FLAG_ACCEPTS, False,
    "load no backend plugin from entry points (only those registered in code)", flag)
BLOCK_PLUGINS = declare(
    "FRAMEWORK_BLOCK_PLUGINS", "core", "comma-separated names of installed backend plugins", (),
    "plugins (entry-point names) not to load", names)
API_KEY = declare(
    "FRAMEWORK_API_KEY", "core", "any text", None,
    "the key `framework serve` requires (Authorization: Bearer KEY) when --api-key is not given", str, secret=True)
CONFORMANCE_SEED = declare(
    "FRAMEWORK_CONFORMANCE_SEED", "core", "a whole number of 0 or more", 20250607,
    "seed of the op conformance suite's random inputs", whole(0))


def cache_root(env: Mapping[str, str] | None = None) -> Path | None:
    """The folder every on-disk cache lives under, or None when FRAMEWORK_CACHE=off."""
    env = os.environ if env is None else env
    raw = env.get(CACHE.name)
    if raw is None or not raw.strip():
        xdg = env.get("XDG_CACHE_HOME", "").strip()
        base = Path(xdg) if xdg and Path(xdg).is_absolute() else Path.home() / ".cache"
        return base / "framework"
    return read(CACHE.name, env)


def cache_dir(part: str, override: str | None = None, env: Mapping[str, str] | None = None) -> Path | None:
    """The folder of one cache: the setting ``override`` (a folder or 'off') when set, else ``part`` under
    the cache root; None when caching is off."""
    if override is not None:
        env = os.environ if env is None else env
        raw = env.get(override)
        if raw is not None and raw.strip():
            return read(override, env)
    root = cache_root(env)
    return None if root is None else root / part
