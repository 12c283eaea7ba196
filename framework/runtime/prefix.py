"""Prefix caching: the cells of prompts already computed, found again by hashes of their token blocks.

As vLLM's automatic prefix caching: a prompt is cut into blocks of BLOCK tokens, and block i's hash covers
block i and every block before it (a chain), so one hash names a whole prefix. When a sequence ends, the
cells of its whole blocks are kept by a keeper (a sequence of its own, negative ids, that only holds cells);
a new sequence whose prompt starts with a kept prefix shares those cells (runtime/cells.py: nothing is
copied) and computes only the rest. The prefix found by its whole blocks then goes on token by token as far
as the keeper's tokens match the prompt (as llama-server's cache_prompt reuses every matching token), so a
prompt sent again computes its last token only, not the tail after its last whole block; a prompt under a
block, which no hash names, is found whole in a keeper's tokens. Keepers are
evicted least recently used: when the cells they hold pass the budget, and when a step needs cells that
only they hold.
"""

from __future__ import annotations

from collections import OrderedDict

from .cells import Cells

BLOCK = 16


def block_hashes(tokens: list[int], block: int = BLOCK) -> list[int]:
    """The chained hash of each whole block: hashes[i] names tokens[:(i + 1) * block]."""
    out, h = [], 0
    for start in range(0, len(tokens) - block + 1, block):
        h = hash((h, tuple(tokens[start:start + block])))
        out.append(h)
    return out


def common_prefix(a: list[int], b: list[int], limit: int) -> int:
    """How many leading tokens a and b share, at most limit."""
    n, end = 0, min(len(a), len(b), limit)
    while n < end and a[n] == b[n]:
        n += 1
    return n


def least_shared(n_tokens: int, block: int = BLOCK) -> int:
    """The fewest leading tokens of a prompt of n_tokens worth taking from another sequence: a block, or all of a
    shorter prompt but its last token (whose logits the sequence needs); 0 for a prompt of one token."""
    return min(block, n_tokens - 1)


class PrefixCache:
    """The kept prefixes of one cache's cells: their block hashes, their keepers in order of last use."""

    def __init__(self, cells: Cells, budget: int | None = None, block: int = BLOCK):
        self.cells, self.block = cells, block
        self.budget = cells.n_cells if budget is None else budget     # cells keepers may hold
        self.index: dict[int, int] = {}                 # block hash -> the keeper of the prefix it names
        self.keepers: OrderedDict[int, list[int]] = OrderedDict()     # keeper -> its hashes, least recent first
        self.tokens: dict[int, list[int]] = {}          # keeper -> the tokens its cells hold
        self._next = 0
        self.hits, self.reused = 0, 0                    # requests that reused a prefix, and the tokens they did

    def reuse(self, seq: int, tokens: list[int]) -> int:
        """Give the new sequence the cells of the longest kept prefix of its tokens (leaving at least one
        token to compute, whose logits the sequence needs); return how many tokens it reused."""
        limit = (len(tokens) - 1) // self.block
        for h in reversed(block_hashes(tokens[:limit * self.block], self.block)):
            if h in self.index:                # as many tokens as match (whole blocks and on), but the last
                keeper = self.index[h]
                return self._take(keeper, seq, common_prefix(self.tokens[keeper], tokens, len(tokens) - 1))
        least = least_shared(len(tokens), self.block)
        if limit == 0 and least > 0:            # under a block (no hash names it): a keeper holding all but its last
            for keeper, kept in self.tokens.items():
                if common_prefix(kept, tokens, least) == least:
                    return self._take(keeper, seq, least)
        return 0

    def _take(self, keeper: int, seq: int, n: int) -> int:
        self.cells.share(keeper, seq, n)
        self.keepers.move_to_end(keeper)
        self.hits, self.reused = self.hits + 1, self.reused + n
        return n

    def retire(self, seq: int, tokens: list[int]) -> None:
        """A sequence ends: keep the cells of its whole blocks of these tokens (those it fed), free the rest."""
        hashes = block_hashes(tokens[:self.cells.n_past(seq)], self.block)
        if hashes:
            self._keep(seq, hashes, tokens)
        self.cells.free(seq)
        self.evict(0)

    def _keep(self, seq: int, hashes: list[int], tokens: list[int]) -> None:
        self._next -= 1
        keeper = self._next
        self.cells.share(seq, keeper, len(hashes) * self.block)
        replaced = set()
        for h in hashes:
            replaced.add(self.index.get(h, keeper))
            self.index[h] = keeper
        self.keepers[keeper] = hashes
        self.tokens[keeper] = tokens[:len(hashes) * self.block]
        for old in replaced - {keeper}:          # a keeper none of whose prefixes is found through it any more
            if not any(self.index.get(h) == old for h in self.keepers[old]):
                self._drop(old)

    def held(self) -> int:
        """Cells that only keepers use (freed when they are evicted)."""
        only = self.cells.refs > 0
        for seq in self.cells.sequences():
            if seq >= 0:
                only &= ~self.cells.member[seq]
        return int(only.sum())

    def evict(self, need: int) -> None:
        """Evict the least recently used keepers until they hold at most the budget and `need` cells are free."""
        while self.keepers and (self.held() > self.budget or self.cells.n_free < need):
            self._drop(next(iter(self.keepers)))

    def _drop(self, keeper: int) -> None:
        for h in self.keepers.pop(keeper):
            if self.index.get(h) == keeper:
                del self.index[h]
        del self.tokens[keeper]
        self.cells.free(keeper)
