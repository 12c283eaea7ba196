"""Fallbacks grouped for people: one group per op, device and reason codes, with a count and the
first node, instead of one line per node (a refusal that names its weight would otherwise give one
line per weight). `--strict` (reserve.check_strict) still lists every node."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from .plan import Plan


def count(n: int, word: str, plural: str | None = None) -> str:
    """'1 fragment', '2 fragments'."""
    return f"{n} {word if n == 1 else (plural or word + 's')}"


@dataclass
class FallbackGroup:
    op: str
    device: str                        # where the nodes ran
    codes: tuple[tuple[str, str], ...]  # (refusing device, reason code), in the order they were asked
    first: str                         # the first node, by graph order
    reasons: dict[str, str]            # refusing device -> the first node's "code: reason"
    nodes: list[str] = field(default_factory=list)

    @property
    def count(self) -> int:
        return len(self.nodes)

    def line(self) -> str:
        why = "; ".join(f"{d}: {r}" for d, r in self.reasons.items())
        return f"fallback: {count(self.count, self.op + ' node')} ran on {self.device} (first: {self.first}); {why}"


def group_fallbacks(plans: Iterable[Plan]) -> list[FallbackGroup]:
    """The fallbacks of every plan, grouped; a node met in several plans (prefill and decode) counts once."""
    groups: dict[tuple, FallbackGroup] = {}
    for plan in plans:
        for node, placement in plan.fallbacks:
            codes = tuple((d, r.split(":", 1)[0].strip()) for d, r in placement.refusals.items())
            key = (node.op, placement.device, codes)
            group = groups.get(key)
            if group is None:
                group = groups[key] = FallbackGroup(node.op, placement.device, codes, node.name,
                                                    dict(placement.refusals))
            if node.name not in group.nodes:
                group.nodes.append(node.name)
    return list(groups.values())
