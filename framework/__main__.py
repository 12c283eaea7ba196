"""`framework` (the console script) and `python -m framework`: the command line, started so that Ctrl-C at
any moment, even while its modules are still being imported, ends with one line and exit status 130."""

from __future__ import annotations

import sys


def main() -> int:
    try:
        from .cli.main import main as command
    except KeyboardInterrupt:
        sys.stderr.write("error: interrupted (Ctrl-C)\n")
        return 130
    return command()


if __name__ == "__main__":
    sys.exit(main())
