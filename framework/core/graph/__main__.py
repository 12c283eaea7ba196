"""``python -m framework.core.graph --markdown > docs/ops.md``: the op table as a page."""

import sys

from .ops import markdown

if sys.argv[1:] != ["--markdown"]:
    sys.exit("usage: python -m framework.core.graph --markdown > docs/ops.md")
sys.stdout.write(markdown())
