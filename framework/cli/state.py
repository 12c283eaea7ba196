"""What the framework keeps on this machine: `framework settings` (every environment setting and its
effective value) and `framework cache` (the on-disk caches, their sizes, and clearing them)."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..terminal import err, out
from .common import fail


def load_plugins() -> list[str]:
    """Load the installed backend plugins through the registry (its validation, its block list), so that
    each declares its settings and caches. Returns a line for each plugin whose settings and caches
    cannot be listed: blocked, failed, or not loaded at all because a setting is refused."""
    from .. import settings
    from ..registry import BLOCK_ENV, DISABLE_ENV, Registry
    try:
        registry = Registry().load_entry_points()
    except settings.SettingError as e:      # a refused setting, named in the line
        return [f"no plugin was loaded ({e}): their own settings and caches are not listed"]
    lines = [f"plugin '{r.name}' ({r.distribution}) could not be loaded: {r.error}"
             for r in registry.plugins.values() if r.error]
    lines += [f"plugin '{name}' is blocked by {BLOCK_ENV}: its settings and caches are not listed"
              for name in sorted(registry.blocked)]
    if settings.read(DISABLE_ENV):
        lines.append(f"{DISABLE_ENV} is set: no plugin was loaded, so their own settings and caches are not listed")
    return lines


def _console() -> Console:
    return Console(soft_wrap=True, width=None if err.is_terminal else 200)


def cmd_settings(args) -> int:
    from .. import settings
    failed = load_plugins()
    table = Table(show_edge=False, pad_edge=False)
    for col in ("setting", "owner", "effective value", "accepts", "what it does"):
        table.add_column(col)
    bad = []
    for row in settings.table():
        if row["error"]:
            bad.append(row["error"])
            value = "[red]not accepted (below)[/red]"
        elif row["raw"] is None or not row["raw"].strip():
            value = f"{escape(_show(row['value']))} [dim](default)[/dim]"
        else:
            value = escape(_show(row["value"]))
        table.add_row(row["name"], row["owner"], value, escape(row["accepts"]), escape(row["help"]))
    _console().print(table)
    for line in failed:
        err.print(f"[yellow]{escape(line)}[/yellow]", soft_wrap=True)
    for line in bad:
        err.print(f"[red]bad setting:[/red] {escape(line)}", soft_wrap=True)
    return 2 if bad else 0


def _show(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, (tuple, frozenset, set, list)):
        return ", ".join(sorted(map(str, value))) or "(none)"
    if isinstance(value, dict):
        return ",".join(f"{k}={v}" for k, v in value.items()) or "(none)"
    return str(value)


def cmd_cache(args) -> int:
    from .. import caches, settings
    from ..model import gguf_file  # noqa: F401 - registers the GGUF index cache
    for line in load_plugins():
        err.print(f"[yellow]{escape(line)}[/yellow]", soft_wrap=True)
    try:
        root = settings.cache_root()
    except settings.SettingError as e:
        return fail(str(e))
    names = args.names or list(caches.CACHES)
    unknown = [n for n in names if n not in caches.CACHES]
    if unknown:
        return fail(f"unknown cache {', '.join(unknown)}; caches: {', '.join(caches.CACHES)}")
    if args.action == "clear":
        freed = 0
        for name in names:
            folder = caches.CACHES[name].folder()
            if folder is not None and folder.is_dir():
                freed += caches.clear(folder)
                out(f"cleared {name}: {folder}\n")
        out(f"{freed / 2**20:.1f} MiB freed\n")
        return 0
    table = Table(show_edge=False, pad_edge=False)
    for col in ("cache", "folder", "files", "size", "holds"):
        table.add_column(col)
    total = 0
    for name in names:
        info = caches.CACHES[name]
        folder = info.folder()
        if folder is None:
            table.add_row(name, "(off)", "-", "-", info.what)
            continue
        files, size = caches.folder_size(folder) if folder.is_dir() else (0, 0)
        total += size
        table.add_row(name, str(folder), str(files), f"{size / 2**20:.1f} MiB", info.what)
    _console().print(table)
    out(f"root {root if root is not None else '(off: FRAMEWORK_CACHE=off)'}; {total / 2**20:.1f} MiB in all; "
        f"`framework cache clear [NAME...]` deletes them\n")
    return 0
