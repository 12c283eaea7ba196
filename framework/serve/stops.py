"""Stop strings cut out of text that arrives a token at a time."""

from __future__ import annotations

from collections.abc import Sequence


class StopFilter:
    """A stop string never reaches the output, whichever tokens it spans; text that could still be the
    beginning of one is held back until the next token shows it is not (or generation ends)."""

    def __init__(self, stops: Sequence[str]):
        self.stops = [s for s in stops if s]
        self.held = ""
        self.stopped = False

    def feed(self, text: str) -> str:
        """The text that is now safe to send. When a stop string completes, ``stopped`` is set and the
        stop string and everything after it are dropped."""
        if self.stopped:
            return ""
        buf = self.held + text
        found = [i for i in (buf.find(s) for s in self.stops) if i >= 0]
        if found:
            self.stopped, self.held = True, ""
            return buf[:min(found)]
        keep = self._open_tail(buf)
        self.held = buf[len(buf) - keep:]
        return buf[:len(buf) - keep]

    def flush(self) -> str:
        """Generation ended: what was held back can no longer begin a stop string."""
        text, self.held = self.held, ""
        return text

    def _open_tail(self, buf: str) -> int:
        """The length of the longest end of ``buf`` that is the beginning of a stop string."""
        best = 0
        for s in self.stops:
            for n in range(min(len(s) - 1, len(buf)), best, -1):
                if buf.endswith(s[:n]):
                    best = n
                    break
        return best
