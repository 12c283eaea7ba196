"""Fallbacks grouped for people: one group per op, device and reason codes, with a count and the
first node, instead of one line per node (a refusal that names its weight would otherwise give one
line per weight). `--strict` (reserve.check_strict) still lists every node."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from ...contract import Verdict
from .plan import MEMORY, Plan


def count(n: int, word: str, plural: str | None = None) -> str:
    """'1 fragment', '2 fragments'."""
    return f"{n} {word if n == 1 else (plural or word + 's')}"


@dataclass
class FallbackGroup:
    op: str
    device: str                        # where the nodes ran
    codes: tuple[tuple[str, str], ...]  # (refusing device, reason code), in the order they were asked
    first: str                         # the first node, by graph order
    reasons: dict[str, Verdict]        # refusing device -> its refusal of the first node
    nodes: list[str] = field(default_factory=list)

    @property
    def count(self) -> int:
        return len(self.nodes)

    def line(self, planned: bool = False) -> str:
        """One line; ``planned``: of a plan not run (`framework check`, a view of a reservation), whose nodes
        would run on the device rather than ran."""
        why = "; ".join(f"{d}: {r}" for d, r in self.reasons.items())
        where = f"{'would run' if planned else 'ran'} on {self.device} (first: {self.first}); {why}"
        if self.op == MEMORY:
            return f"fallback for memory: {count(self.count, 'node')} {where}"
        return f"fallback: {count(self.count, self.op + ' node')} {where}"


def group_fallbacks(plans: Iterable[Plan]) -> list[FallbackGroup]:
    """The fallbacks of every plan, grouped; a node met in several plans (prefill and decode) counts once."""
    groups: dict[tuple, FallbackGroup] = {}
    for plan in plans:
        for node, placement in plan.fallbacks:
            codes = tuple((d, v.code) for d, v in placement.refusals.items())
            # nodes moved for memory only make one group whatever their ops: the layers that did not fit
            op = MEMORY if placement.memory and all(c == MEMORY for _, c in codes) else node.op
            key = (op, placement.device, codes)
            group = groups.get(key)
            if group is None:
                group = groups[key] = FallbackGroup(op, placement.device, codes, node.name,
                                                    dict(placement.refusals))
            if node.name not in group.nodes:
                group.nodes.append(node.name)
    return list(groups.values())
