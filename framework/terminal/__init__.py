"""What the command line, the server and the benchmark share on a terminal: the two streams, plain
tables, and choosing devices with a note of what the choice implies. It sits below all three, so none
of them imports another."""

from .devices import select_devices
from .output import end_line, err, out, start_output
from .table import Row, print_table, print_wrapped, render

__all__ = ["Row", "end_line", "err", "out", "print_table", "print_wrapped", "render", "select_devices", "start_output"]
