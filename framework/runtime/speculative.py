"""Speculative decoding: a draft proposes tokens, the target checks them all in one multi-token step.

Drafts (``--draft SPEC``):

- ``layers:K``: self-speculative decoding. The target's first K layers, its output norm and head, as a
  session on the target's own model (``n_layers=K``) that reads and writes the target's cache tensors of
  those layers in place: no copy, no second cache. What it writes at a position is what the target's
  first K layers write there, so the target's verification step overwrites it with the same values.
- a GGUF file with the target's vocabulary: its own cache, kept in step with the accepted tokens.
- ``ngram[:N]``: prompt lookup (``runtime/lookup.py``), the continuation of the latest earlier occurrence of
  the last N tokens in the prompt and the text so far; no model, no device, nothing to reserve.
- a Gemma 4 MTP assistant (architecture ``gemma4-assistant``): Q-only attention layers that read the
  target's cache of the layers llama.cpp maps them to, the target's token embedding, and the hidden
  state the target's head read for the last accepted token (``Session(hidden=True)``); every draft token
  is placed at the position of the first one, as llama.cpp's draft-mtp does for Gemma 4.

Every round: the draft proposes n tokens after the last sampled one; the target evaluates that token and
the n drafts in one step with the logits of every row; the drafts are accepted left to right and the first
refused one is replaced by the target's own choice (after n accepted, the target's next token is added).
Greedy: a draft is accepted when it is the target's argmax, so the output is token for token the target's
own greedy output. Sampling: standard speculative rejection sampling (Leviathan et al. 2023, Chen et al.
2023): a draft d drawn from the draft's distribution q is accepted with probability min(1, p(d) / q(d)),
p being the target's (both after temperature, top-k and top-p), and a refused one is replaced by a draw
from max(0, p - q), normalised; the tokens produced are distributed as the target's own samples.

Drafting adapts (``Adaptive``): a model draft stops proposing at the first token its own top probability
puts below ``p_min`` (llama.cpp's ``--draft-p-min``), and every draft is paused, for a number of rounds
that doubles each time, when the acceptance of its recent rounds falls below a floor, then tried again
once the drafting that bought nothing is within a few percent of the time: a draft that does not help
costs little more than the target alone.

Rejected tokens are dropped by rewinding: the KV cache is indexed by position and rows past n_past are
masked, so rollback sets n_past (``Session.rewind``). A target (or a draft with its own cache) that keeps
recurrent state (qwen35) cannot be rewound cheaply, and is refused with SpeculationError.

Reservation plans target and draft together (``Session.reserve_keys`` with partners): each plan against
its own session's residences (the draft's include the target's cache and the weights it borrows, with
the target as their owner, so a draft node on a device that cannot use their buffer is a capability error
naming the tensor, the buffer, both devices and the fix), and the programs and memory of both against
the devices' budgets of the one process (the draft's executor shares the target's weights and programs).
"""

from __future__ import annotations

import codecs
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .. import caches
from ..contract import Device
from ..core.scheduler import Reservation, Residence
from ..model.arch.base import SpeculationError
from ..model.model import Model
from .generate import Piece
from .lookup import is_lookup, lookup, parse_match
from .sampling import Sampler
from .context import KV_PAD, greedy_key
from .greedy import checked_index, greedy_tokens
from .session import Session

BASELINE_STEPS = 8          # target-alone decode steps measured after the prompt (the first is a warm-up)
DEFAULT_DRAFT_N = 4
ASSISTANT_ARCH = "gemma4-assistant"


# -- accepting drafts --------------------------------------------------------------------------------
def accept_greedy(rows: np.ndarray, drafts: list[int]) -> tuple[int, int]:
    """(drafts accepted, the target's next token) for a greedy target: rows[i] are the logits after
    the i-th token of [last, *drafts], or (1-D) their argmax already (a verification step's ARGMAX)."""
    best = [int(b) for b in (rows if rows.ndim == 1 else np.argmax(rows, axis=1))]
    for i, d in enumerate(drafts):
        if best[i] != d:
            return i, best[i]
    return len(drafts), best[len(drafts)]


def accept_sampled(p_rows: list[np.ndarray], q_rows: list[np.ndarray], drafts: list[int],
                   rng: np.random.Generator) -> tuple[int, int]:
    """Speculative rejection sampling: p_rows the target's distributions after each of [last, *drafts]
    (one more than drafts), q_rows the draft's distributions each draft was drawn from (None: a deterministic
    proposal, all the mass on the draft). Returns (drafts accepted, the next token), the tokens so produced
    being distributed as draws from p."""
    for i, d in enumerate(drafts):
        p, q = p_rows[i], q_rows[i]
        if rng.random() * (1.0 if q is None else q[d]) < p[d]:      # with probability min(1, p(d) / q(d))
            continue
        if q is None:                           # max(0, p - q) for a one-hot q: p without the draft
            residual = p.copy()
            residual[d] = 0.0
        else:
            residual = np.maximum(p - q, 0.0)
        total = residual.sum()
        return i, int(rng.choice(len(p), p=residual / total if total > 0 else p))
    p = p_rows[len(drafts)]
    return len(drafts), int(rng.choice(len(p), p=p))


def confident(logits: np.ndarray, q: np.ndarray | None, p_min: float) -> bool:
    """Whether a draft's top probability reaches p_min (q: the distribution a sampled draft drew from;
    None when greedy, where it is the softmax of the logits)."""
    if p_min <= 0:
        return True
    if q is not None:
        return float(q.max()) >= p_min
    z = np.exp(logits - logits.max())
    return float(z.max() / z.sum()) >= p_min


def picker(sampler: Sampler, p_min: float = 0.0):
    """How a draft chooses: the argmax when greedy, else a draw from its distribution, which is kept; None
    (stop drafting) where the draft's top probability is below p_min."""
    def pick(logits: np.ndarray) -> tuple[int, np.ndarray | None] | None:
        if sampler.greedy:
            tok, q = int(np.argmax(logits)), None
        else:
            q = sampler.distribution(logits)
            tok = int(sampler.rng.choice(len(q), p=q))
        return (tok, q) if confident(logits, q, p_min) else None
    return pick


# -- drafts ---------------------------------------------------------------------------------------------
class Draft:
    """What proposes tokens. ``session`` is the draft's session (its plans, executor and devices)."""

    kind = ""
    session: Session | None         # None: a draft without a model (ngram), which plans and runs nothing

    def describe(self) -> str:
        raise NotImplementedError

    def keys(self, n_prompt: int, positions: range, n_draft: int) -> list[tuple]:
        """The step shapes drafting will use, the target's next token being at each of positions."""
        s = self.session
        return [s.context.shape_key(1, p + i, 1) for p in positions for i in range(n_draft)]

    def start(self, prompt: list[int]) -> None:
        """After the target's prefill of the prompt."""

    def propose(self, history: list[int], token: int, n: int, pick) -> tuple[list[int], list]:
        """n draft tokens after `token` (at position len(history)), with the distributions drawn from."""
        raise NotImplementedError

    def accepted(self, n: int) -> None:
        """After the target's verification step, n drafts having been accepted."""

    def shared(self) -> dict[str, Residence]:
        """The target's tensors the draft's kept plans use in place: name -> residence."""
        s, out = self.session, {}
        for plan, _ in s.plans.values():
            for t in plan.graph.leaves:
                home = s.residence.get(id(t))
                if home is not None and home.owner:
                    out[t.name] = home
        return out

    def borrowed(self) -> list:
        """The target's weights the draft reads (their residences follow the target's plans)."""
        return []


class LayersDraft(Draft):
    """The target's first K layers and its head, on the target's cache (self-speculative decoding)."""

    kind = "layers"

    def __init__(self, target: Session, devices: list[Device], k: int):
        n_layer = target.model.hp.n_layer
        if not 1 <= k < n_layer:
            raise SpeculationError(f"--draft layers:{k}: K must be between 1 and {n_layer - 1} for "
                                   f"{target.model.name} ({n_layer} layers)")
        self.target, self.k = target, k
        self.session = Session(target.model, devices, n_batch=target.n_batch, strict=target.strict, n_layers=k,
                               share_kv_with=target)
        self.session.borrowed = {id(t): t for t in self.borrowed()}

    def describe(self) -> str:
        return f"layers:{self.k} (the first {self.k} of {self.target.model.hp.n_layer} layers of the target)"

    def borrowed(self) -> list:
        """Every weight the draft reads is the target's own leaf."""
        graph, _ = self.session.model.build_step(1, min(KV_PAD, self.target.n_ctx), 1, self.session.cache, self.k)
        return [t for t in graph.leaves if t.kind.value == "weight"]

    def propose(self, history, token, n, pick):
        s = self.session
        s.n_past = self.target.n_past
        out, dists = [], []
        for _ in range(n):
            picked = pick(s.eval([token]))
            if picked is None:
                break
            tok, q = picked
            out.append(tok)
            dists.append(q)
            token = tok
        return out, dists


# Where every step shape is a compile (padded rows: openvino:CPU, where each compiled model also holds its own
# copy of the weights), a draft model catching up after a pause (every token since its last step) takes only
# steps of 2 rows and of CATCH_UP_ROWS, both reserved with the run: its probes had compiled the padded size of
# each catch-up inside the run (the 0.5B drafting for the 1.5B there spent 50-70% of free text's time so),
# and a model for every padded size up to the longest pause took more memory than the machine had.
CATCH_UP_ROWS = 16


def catch_up_steps(n: int, big: int) -> list[int]:
    """n tokens in steps whose padded rows are 2 or `big` (a power of two): `big` at a time while more than half
    of it is left, then pairs."""
    steps = []
    while n > 2:
        steps.append(min(n, big) if n > big // 2 else 2)
        n -= steps[-1]
    return steps + ([n] if n else [])


class ModelDraft(Draft):
    """A separate model with the target's vocabulary and a cache of its own."""

    kind = "model"

    def __init__(self, target: Session, model: Model, devices: list[Device]):
        check_vocabulary(target.model, model)
        if model.arch.recurrent:
            raise SpeculationError(f"draft {model.name} ({model.arch.name}) keeps recurrent state, which cannot "
                                   f"be rewound after rejected tokens; use a draft whose state is its KV cache")
        self.target, self.model = target, model
        self.session = Session(model, devices, n_ctx=target.n_ctx, n_batch=target.n_batch, strict=target.strict,
                               draft_of=target)

    def describe(self) -> str:
        return f"{self.model.file.path.name} ({self.model.arch.name}, {self.model.hp.n_layer} layers, own cache)"

    def keys(self, n_prompt, positions, n_draft):
        s = self.session
        keys = s.context.shapes_for(n_prompt, 0)                           # its own prefill of the prompt
        rows = [2] + ([self.catch_up_big] if self.catch_up_big else [])
        for p in positions:                                                # catching up, then drafting
            keys += [s.context.shape_key(c, p + 1 - c, 1) for c in rows if c <= p + 1]
            keys += [s.context.shape_key(1, p + i, 1) for i in range(n_draft)]
        return keys

    @property
    def catch_up_big(self) -> int | None:
        """The long catch-up step's rows where shapes compile (padded rows), else None: one step of any size."""
        s = self.session
        return min(CATCH_UP_ROWS, s.n_batch) if s.context.padded else None

    def start(self, prompt):
        self.session.reset()
        self.session.eval(prompt)

    def propose(self, history, token, n, pick):
        s = self.session
        s.rewind(min(s.n_past, len(history)))
        pending = history[s.n_past:] + [token]
        big = self.catch_up_big
        steps = catch_up_steps(len(pending), big) if big else [len(pending)]
        for n_rows in steps:
            logits = s.eval(pending[:n_rows], prompt=False)
            pending = pending[n_rows:]
        out, dists = [], []
        for i in range(n):
            picked = pick(logits)
            if picked is None:
                break
            tok, q = picked
            out.append(tok)
            dists.append(q)
            if i + 1 < n:
                logits = s.eval([tok])
        return out, dists


class NgramDraft(Draft):
    """Prompt lookup: the continuation of the latest earlier occurrence of the last N tokens."""

    kind = "ngram"
    session = None

    def __init__(self, target: Session, n_match: int):
        self.n_match = n_match

    def describe(self) -> str:
        return (f"ngram:{self.n_match} (prompt lookup: what followed the latest earlier occurrence of the last "
                f"{self.n_match} tokens)")

    def keys(self, n_prompt, positions, n_draft):
        return []

    def propose(self, history, token, n, pick):
        drafts = lookup(history + [token], self.n_match, n)
        return drafts, [None] * len(drafts)        # deterministic: accept_sampled takes None as one-hot

    def shared(self):
        return {}


class AssistantSession(Session):
    """Gemma 4's MTP assistant: one token at a time at the position after the target's context, over the
    target's cache (rows before that position), from a hidden state instead of the previous layers'."""

    def draft_step(self, token: int, h: np.ndarray, pos0: int) -> tuple[np.ndarray, np.ndarray]:
        plan, inp = self.plan(1, pos0, 1)
        n_kv = inp.mask.shape[1]
        pos = np.array([pos0], dtype=np.int32)
        values = {id(inp.tokens): np.array([token], dtype=np.int32), id(inp.pos): pos,
                  id(inp.kv_rows): pos, id(inp.extra["inp_h"]): h.reshape(1, -1).astype(np.float32),
                  id(inp.mask): prior_mask(pos0, n_kv, 0), id(inp.out_ids): np.zeros(1, dtype=np.int32)}
        if inp.mask_swa is not None:
            values[id(inp.mask_swa)] = prior_mask(pos0, n_kv, self.model.hp.sliding_window)
        clock = caches.Stopwatch()             # a first run's kernel compiles are not decode time
        logits, hidden = self.executor.run(plan, values)
        self.decode.tokens += 1
        self.decode.seconds += clock.seconds
        self.decode.compile_seconds += clock.filled
        return logits[0], hidden[0]


def prior_mask(pos0: int, n_kv: int, window: int) -> np.ndarray:
    """(1, n_kv): 0 on the cache rows before pos0 (within the window when windowed), else -inf: what the
    assistant's query at pos0 sees of the target's cache, which holds nothing at pos0 yet."""
    s = np.arange(n_kv, dtype=np.int64)
    visible = s < pos0
    if window:
        visible &= (pos0 - s) < window
    return np.where(visible, np.float32(0), np.float32(-np.inf)).astype(np.float32)[None, :]


class AssistantDraft(Draft):
    """Gemma 4's MTP assistant (gemma4-assistant) over its gemma4 target's cache."""

    kind = "assistant"

    def __init__(self, target: Session, model: Model, devices: list[Device]):
        check_vocabulary(target.model, model)
        if target.plans:
            raise SpeculationError("the assistant needs the target's hidden state: make its draft before the "
                                   "target plans any step")
        model.arch.bind_target(target.model)         # names the mismatch (architecture, widths, heads)
        target.context.hidden = True
        target.context.graphs.clear()                # graphs the memory fit built, without the hidden output
        self.target, self.model = target, model
        self.session = AssistantSession(model, devices, n_batch=1, strict=target.strict, share_kv_with=target,
                                        hidden=True)
        self.session.borrowed = {id(t): t for t in self.borrowed()}
        self.pending_h: np.ndarray | None = None

    def describe(self) -> str:
        return (f"{self.model.file.path.name} ({ASSISTANT_ARCH}, {self.model.hp.n_layer} layers reading the "
                f"target's cache of layers {', '.join(map(str, self.model.arch.target_layers()))})")

    def borrowed(self) -> list:
        return self.model.arch.borrowed_weights()

    def keys(self, n_prompt, positions, n_draft):
        return [self.session.context.shape_key(1, p, 1) for p in positions]       # every draft at the same position

    def start(self, prompt):
        self.pending_h = self.target.hidden_rows[-1]

    def propose(self, history, token, n, pick):
        h, pos0 = self.pending_h, self.target.n_past
        out, dists = [], []
        for _ in range(n):
            logits, h = self.session.draft_step(token, h, pos0)
            picked = pick(logits)
            if picked is None:
                break
            token, q = picked
            out.append(token)
            dists.append(q)
        return out, dists

    def accepted(self, n):
        self.pending_h = self.target.hidden_rows[n]


def place_borrowed(draft: Session, target: Session, target_plans) -> None:
    """The residence of every weight the draft borrows (Session.borrowed): the devices whose fragments of
    the target's plans read it, the target as its owner."""
    holders: dict[int, list[str]] = {}
    for plan in target_plans:
        for f in plan.fragments:
            for t in f.inputs:
                if id(t) in draft.borrowed and f.device not in holders.setdefault(id(t), []):
                    holders[id(t)].append(f.device)
    by_name = {d.name: d for d in target.devices}
    for key, devices in holders.items():
        first = by_name[devices[0]]
        draft.residence[key] = Residence(first.name, first.weight_buffer_type or first.buffer_type,
                                         first.physical_id, tuple(devices[1:]), "the target")


def check_vocabulary(target: Model, draft: Model) -> None:
    a = target.file.metadata.get("tokenizer.ggml.tokens")
    b = draft.file.metadata.get("tokenizer.ggml.tokens")
    if target.hp.n_vocab != draft.hp.n_vocab or (a is not None and b is not None and list(a) != list(b)):
        first = next((i for i, (x, y) in enumerate(zip(a or (), b or ())) if x != y), None)
        where = f"; they first differ at token {first}" if first is not None else ""
        raise SpeculationError(f"draft {draft.file.path.name} has a vocabulary of {draft.hp.n_vocab} tokens, the "
                               f"target {target.file.path.name} {target.hp.n_vocab}{where}: a draft must share the "
                               f"target's vocabulary (use layers:K for a draft made of the target itself)")


def make_draft(spec: str, target: Session, devices: list[Device], load=Model) -> Draft:
    """The draft a --draft SPEC names: layers:K, or a GGUF file (a gemma4-assistant one is an MTP draft)."""
    if target.model.arch.recurrent:
        raise SpeculationError(f"{target.model.name} ({target.model.arch.name}) keeps recurrent state that rejected "
                               f"draft tokens would already have changed, and it cannot be rolled back: speculative "
                               f"decoding needs a target whose state is its KV cache; run it without --draft")
    if is_lookup(spec):
        try:
            return NgramDraft(target, parse_match(spec))
        except ValueError as e:
            raise SpeculationError(str(e)) from None
    if spec.startswith("layers:"):
        try:
            k = int(spec.split(":", 1)[1])
        except ValueError:
            raise SpeculationError(f"--draft {spec}: K must be a whole number of layers (layers:K)") from None
        return LayersDraft(target, devices, k)
    path = Path(spec)
    if not path.is_file():
        raise SpeculationError(f"--draft {spec}: not a file; a draft is ngram[:N] (prompt lookup), layers:K (the "
                               f"target's first K layers) or a GGUF file with the target's vocabulary (a Gemma 4 "
                               f"assistant for MTP)")
    model = load(path)
    if model.arch.name == ASSISTANT_ARCH:
        return AssistantDraft(target, model, devices)
    return ModelDraft(target, model, devices)


def exact_rows_check(target: Session, plans: dict, n_draft: int, inexact: bool) -> list[str]:
    """Greedy text with a draft is the target's own only where every row of a verification step gets the logits a
    one-row decode step gives it: every device of these verification plans (shape key -> plan) must declare that
    for the step's rows (Limits.exact_rows). Refused with SpeculationError unless inexact; returns what inexact let
    through, "device (why)"."""
    by_name = {d.name: d for d in target.devices}
    short: dict[str, int] = {}           # device -> the most rows of a verification step it computes
    for key, plan in plans.items():
        for f in plan.fragments:
            exact = by_name[f.device].limits.exact_rows
            if exact is not None and exact < key[0]:
                short[f.device] = max(short.get(f.device, 0), key[0])
    if short and not inexact:
        raise SpeculationError(inexact_message(by_name, short, n_draft))
    return [f"{name} (Limits.exact_rows {by_name[name].limits.exact_rows}, a verification step of {rows} rows)"
            for name, rows in short.items()]


def inexact_message(by_name: dict[str, Device], short: dict[str, int], n_draft: int) -> str:
    """Why speculative decoding is refused on these devices (name -> the most rows a verification step holds),
    and the fixes."""
    parts = []
    for name, rows in short.items():
        exact = by_name[name].limits.exact_rows
        declared = ("declares no row count" if not exact else f"declares at most {exact} rows")
        parts.append(f"{name} ({by_name[name].plugin or 'its plugin'}) {declared} whose logits in one step are "
                     f"bit for bit a one-row decode step's (Limits.exact_rows), and the target's verification "
                     f"step holds up to {rows}")
    fewer = [by_name[n].limits.exact_rows for n in short if by_name[n].limits.exact_rows]
    fix = f"--draft-n {min(fewer) - 1} or fewer, " if fewer and min(fewer) > 1 else ""
    return (f"speculative decoding refused: {'; '.join(parts)}. Greedy text with the draft could then differ from "
            f"the target's own at near-ties. Fix: {fix}other --backends for the target, or --draft-inexact to "
            f"accept that (the draft's {n_draft} tokens are still checked against the target's logits)")


# -- decoding ---------------------------------------------------------------------------------------------
@dataclass
class Adaptive:
    """When to draft: paused for ``pause`` rounds (2, then doubling up to MAX_PAUSE) once the acceptance of
    the last ``window`` drafting rounds falls below ``floor``; after a pause one drafting round decides
    whether to go on (its acceptance at the floor or above resets the pause) or to pause twice as long.
    That round waits while the drafting time that bought nothing (a round's drafting seconds times the share
    of its drafts refused) is over ``budget`` of all the rounds' time: a model draft's probe first runs the
    draft over every token since its last step, so on text it does not predict the probes alone took a fifth
    of the time; this bounds what such text loses to about the budget."""

    floor: float = 0.3
    window: int = 4
    budget: float = 0.04
    pause: int = 0                  # rounds left without drafting
    next_pause: int = 2
    probing: bool = False
    recent: list = field(default_factory=list)     # (drafted, accepted) of the latest drafting rounds
    wasted: float = 0.0             # seconds of drafting whose drafts were refused
    elapsed: float = 0.0            # seconds of every round, drafting or not

    MAX_PAUSE = 64

    def allows(self) -> bool:
        if self.pause > 0:
            self.pause -= 1
            return False
        return not self.probing or self.wasted <= self.budget * self.elapsed

    def update(self, drafted: int, accepted: int, drafting: float = 0.0, seconds: float = 0.0) -> None:
        """A round's drafts and accepted ones; drafting: its seconds of drafting, seconds: the whole round's."""
        self.elapsed += seconds
        if not drafted:
            return
        self.wasted += drafting * (drafted - accepted) / drafted
        self.recent = self.recent[-(self.window - 1):] + [(drafted, accepted)]
        if not self.probing and len(self.recent) < self.window:
            return
        rate = sum(a for _, a in self.recent) / sum(d for d, _ in self.recent)
        if rate < self.floor:
            self.pause, self.next_pause = self.next_pause, min(2 * self.next_pause, self.MAX_PAUSE)
            self.probing, self.recent = True, []
        elif self.probing:
            self.probing, self.next_pause = False, 2


@dataclass
class DraftLength:
    """How many tokens to draft this round: the n of 1 to n_max with the most tokens expected per second of a
    round. A round drafting n yields 1 + h1 + h1*h2 + ... + h1*...*hn tokens, hj being the chance that the j-th
    draft is accepted once the j - 1 before it were (from the latest ``window`` drafting rounds: ``chances``). It
    costs n draft tokens and a target step of n + 1 rows, each as measured in this run (moving averages; a row
    count not yet measured is interpolated from those that were). Long drafts pay where verification rows are
    cheap and drafts are accepted; one refused early wastes the rows after it, which a short draft does not
    pay for. Chances by position, not one chance for every draft: prompt lookup's drafts are often all right
    (a copied span) or wrong from the first. Until two row counts are measured it drafts n_max."""

    n_max: int
    window: int = 8
    SMOOTH = 0.25                   # the weight of the latest measurement in the moving averages
    step: dict = field(default_factory=dict)       # rows -> seconds of a round's target step with that many rows
    draft_token: float = 0.0        # seconds a drafted token costs the draft
    recent: list = field(default_factory=list)     # (drafted, accepted) of the latest drafting rounds

    def choose(self) -> int:
        if len(self.step) < 2:
            return self.n_max
        expected = self.expected()
        return max(range(1, self.n_max + 1), key=lambda n: expected[n] / self.cost(n))

    def chances(self) -> list[float]:
        """For j of 1 to n_max, the chance that the j-th draft is accepted once the j - 1 before it were: of the
        recent rounds that checked a j-th draft, the share that accepted it, two rounds at the chance of the
        position before counted in advance (at one half for the first). A position seldom checked (a draft model
        stopped by p_min before it, or rounds drafting fewer) so takes the chance of the one before it, not a
        guess that would keep the drafts too short ever to check it."""
        out, prior = [], 0.5
        for j in range(1, self.n_max + 1):
            checked = sum(1 for d, a in self.recent if d >= j and a >= j - 1)
            taken = sum(1 for _, a in self.recent if a >= j)
            prior = (taken + 2 * prior) / (checked + 2)
            out.append(prior)
        return out

    def expected(self) -> list[float]:
        """Tokens a round drafting n yields, for n of 0 to n_max."""
        out, p = [1.0], 1.0
        for h in self.chances():
            p *= h
            out.append(out[-1] + p)
        return out

    def cost(self, n: int) -> float:
        return n * self.draft_token + self.rows_cost(n + 1)

    def rows_cost(self, rows: int) -> float:
        """Seconds of a target step of that many rows: measured, or on the line through the nearest measured
        row counts (extended past the last two at their slope, never falling)."""
        if rows in self.step:
            return self.step[rows]
        known = sorted(self.step)
        below = [k for k in known if k < rows]
        above = [k for k in known if k > rows]
        lo, hi = (below[-1], above[0]) if below and above else (known[-2], known[-1]) if below else known[:2]
        slope = max(0.0, (self.step[hi] - self.step[lo]) / (hi - lo))
        return max(1e-9, self.step[lo] + slope * (rows - lo))

    def average(self, old: float | None, new: float) -> float:
        return new if old is None else old + self.SMOOTH * (new - old)

    def record(self, drafted: int, accepted: int, draft_seconds: float, rows_seconds: float) -> None:
        """After a round: its drafts, those accepted, the seconds drafting took and the seconds of the rest (the
        target's step of 1 + drafted rows and the acceptance)."""
        self.step[drafted + 1] = self.average(self.step.get(drafted + 1), rows_seconds)
        if drafted:
            self.draft_token = self.average(self.draft_token or None, draft_seconds / drafted)
            self.recent = self.recent[-(self.window - 1):] + [(drafted, accepted)]


@dataclass
class SpecStats:
    rounds: int = 0                 # target steps of the speculative loop
    drafted: int = 0
    accepted: int = 0
    paused: int = 0                 # rounds without a draft because drafting was paused (Adaptive)
    tokens: int = 0                 # tokens the loop produced (the first token, from the prefill, not counted)
    seconds: float = 0.0            # the loop's time: drafting, verification, acceptance
    draft_seconds: float = 0.0
    baseline_tokens: int = 0        # target-alone decode steps timed in the same run
    prompt_tokens: int = 0          # the target's prefill of the prompt
    prompt_seconds: float = 0.0
    baseline_seconds: float = 0.0

    @property
    def acceptance(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_step(self) -> float:
        return self.tokens / self.rounds if self.rounds else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    @property
    def baseline_tokens_per_second(self) -> float:
        return self.baseline_tokens / self.baseline_seconds if self.baseline_seconds else 0.0

    @property
    def speedup(self) -> float:
        base = self.baseline_tokens_per_second
        return self.tokens_per_second / base if base else 0.0

    def to_dict(self) -> dict:
        return {"prompt": {"tokens": self.prompt_tokens, "seconds": self.prompt_seconds},
                "rounds": self.rounds, "drafted": self.drafted, "accepted": self.accepted, "paused": self.paused,
                "acceptance": round(self.acceptance, 4), "tokens": self.tokens,
                "tokens_per_target_step": round(self.tokens_per_step, 4), "seconds": self.seconds,
                "draft_seconds": self.draft_seconds, "tokens_per_second": self.tokens_per_second,
                "baseline": {"tokens": self.baseline_tokens, "seconds": self.baseline_seconds,
                             "tokens_per_second": self.baseline_tokens_per_second,
                             "how": "decode steps of the target alone right after the prompt, the first not "
                                    "timed, then rolled back"},
                "speedup": round(self.speedup, 4)}

    def line(self) -> str:
        if not self.rounds:
            return "speculative: nothing was decoded (the first token came from the prompt's step)"
        paused = f", drafting paused {self.paused} of {self.rounds} rounds" if self.paused else ""
        return (f"speculative: drafted {self.drafted}, accepted {self.accepted} "
                f"({100 * self.acceptance:.1f}%){paused}, "
                f"{self.tokens_per_step:.2f} tokens per target step; decode {self.tokens_per_second:.1f} tok/s "
                f"against {self.baseline_tokens_per_second:.1f} tok/s for the target alone "
                f"({self.baseline_tokens} steps timed in this run): x{self.speedup:.2f}")


class SpeculativeDecoder:
    def __init__(self, target: Session, draft: Draft, n_draft: int = DEFAULT_DRAFT_N, baseline: int = BASELINE_STEPS,
                 p_min: float = 0.0, inexact: bool = False):
        """baseline: decode steps of the target alone timed after the prompt (0: none), for the speed-up;
        p_min: a model draft stops at the first token it is less sure of (0: never); inexact: verify on devices
        that do not declare a verification step's rows exact (Limits.exact_rows), which reserve otherwise refuses."""
        if n_draft < 1:
            raise SpeculationError(f"--draft-n must be at least 1, got {n_draft}")
        if not 0.0 <= p_min < 1.0:
            raise SpeculationError(f"--draft-p-min must be at least 0 and below 1, got {p_min}")
        self.target, self.draft, self.n_draft, self.baseline = target, draft, n_draft, baseline
        self.p_min, self.adaptive, self.inexact = p_min, Adaptive(), inexact
        self.length = DraftLength(n_draft)
        self.inexact_devices: list[str] = []      # what inexact let through: "device (why)"
        if draft.session is not None:
            target.partners, draft.session.partners = [draft.session], [target]
        self.stats = SpecStats()

    def sessions(self) -> list[Session]:
        """The sessions that plan and run: the target's, and the draft's where it has one."""
        return [s for s in (self.target, self.draft.session) if s is not None]

    # -- reservation ----------------------------------------------------------------------------------
    def keys(self, n_prompt: int, n_predict: int, greedy: bool = False) -> tuple[list[tuple], list[tuple]]:
        """The target's and the draft's step shapes: the prompt's chunks, the baseline's decode steps, and
        for every position of the generation a verification of 1 to n_draft + 1 tokens and the drafting;
        greedy (where the target takes its argmax on the device): the decode and verification steps' ARGMAX."""
        t = self.target
        on_device = greedy_key if greedy and t.argmax_on_device else (lambda k: k)
        end = n_prompt + n_predict
        t.context.shapes_for(n_prompt, n_predict)       # the context's room for both, checked
        keys = t.context.shapes_for(n_prompt, 0)        # the prompt's logits: its first token is sampled from them
        keys += [on_device(t.context.shape_key(1, n_prompt + i, 1)) for i in range(self.baseline_steps(n_prompt))]
        positions = range(n_prompt, end)
        for p in positions:
            keys += [on_device(t.context.shape_key(n, p, None)) for n in range(1, min(self.n_draft + 1, end - p) + 1)]
        return list(dict.fromkeys(keys)), list(dict.fromkeys(self.draft.keys(n_prompt, positions, self.n_draft)))

    def baseline_steps(self, n_prompt: int) -> int:
        return max(0, min(self.baseline, self.target.n_ctx - n_prompt))

    def reserve(self, n_prompt: int, n_predict: int, greedy: bool = False) -> Reservation:
        """Plan and check target and draft together (greedy: for a greedy sampler); nothing is loaded or compiled."""
        target_keys, draft_keys = self.keys(n_prompt, n_predict, greedy)
        self.check_exact(target_keys)
        d = self.draft.session
        if d is None:
            return self.target.reserve_keys(target_keys, {})
        if d.borrowed:
            place_borrowed(d, self.target, self.target.make_plans(target_keys).values())
        return self.target.reserve_keys(target_keys, {d: draft_keys})

    def check_exact(self, target_keys: list[tuple]) -> None:
        """Refuse (unless inexact) a target whose verification steps' rows are not declared exact (exact_rows)."""
        # verification keys: several tokens, the logits of every row (a prompt chunk keeps its last row)
        keys = [k for k in target_keys if k[0] > 1 and k[2] is None]
        self.inexact_devices = exact_rows_check(self.target, self.target.make_plans(keys), self.n_draft,
                                                self.inexact)

    def prepare(self, progress=None) -> None:
        """Load weights and compile programs of every reserved plan, before any clock starts."""
        for s in self.sessions():
            for plan, _ in s.plans.values():
                s.executor.prepare(plan, progress)

    # -- generation -----------------------------------------------------------------------------------
    def generate(self, prompt_ids: list[int], n_predict: int, sampler: Sampler,
                 stop_ids: frozenset[int] = frozenset()) -> Iterator[Piece]:
        t, st = self.target, self.stats
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        tok = t.model.tokenizer
        logits = t.eval(prompt_ids)
        st.prompt_tokens, st.prompt_seconds = t.prefill.tokens, t.prefill.seconds
        hidden = t.hidden_rows
        self._baseline(int(np.argmax(logits)), len(prompt_ids), sampler.greedy)
        t.hidden_rows = hidden
        self.draft.start(prompt_ids)
        token = sampler(logits)
        if token in stop_ids:
            return
        yield Piece(token, decoder.decode(tok.token_bytes(token)))
        history, done, pick = list(prompt_ids), 1, picker(sampler, self.p_min)
        while done < n_predict and t.n_past < t.n_ctx:
            produced = self._round(history, token, min(self.n_draft, n_predict - done - 1,
                                                       t.n_ctx - t.n_past - 1), sampler, pick)
            for new in produced:
                if new in stop_ids:
                    return
                yield Piece(new, decoder.decode(tok.token_bytes(new)))
                done += 1
            token = produced[-1]

    def _round(self, history: list[int], token: int, n: int, sampler: Sampler, pick) -> list[int]:
        """One draft and verification: appends the accepted tokens to history; returns the new tokens."""
        t, st = self.target, self.stats
        clock = caches.Stopwatch()
        allowed = n > 0 and self.adaptive.allows()
        drafts, dists = self.draft.propose(history, token, min(n, self.length.choose()), pick) if allowed \
            else ([], [])
        st.paused += n > 0 and not allowed
        drafting = clock.seconds
        base = t.n_past
        rows = self._verify([token] + drafts, sampler.greedy)
        if sampler.greedy:
            n_ok, new = accept_greedy(rows, drafts)
        else:
            n_ok, new = accept_sampled([sampler.distribution(r) for r in rows], dists, drafts, sampler.rng)
        t.rewind(base + 1 + n_ok)
        history += [token] + drafts[:n_ok]
        self.draft.accepted(n_ok)
        # a draft model that proposed nothing (p_min at its first token) still ran a step: a round that cost and
        # did not pay, which counts against drafting as a refused draft does (prompt lookup without a match is free)
        self.adaptive.update(max(len(drafts), int(allowed and self.draft.session is not None)), n_ok, drafting,
                             clock.seconds)
        self.length.record(len(drafts), n_ok, drafting, clock.seconds - drafting)
        st.rounds += 1
        st.drafted += len(drafts)
        st.accepted += n_ok
        st.tokens += n_ok + 1
        st.draft_seconds += drafting
        st.seconds += clock.seconds
        return drafts[:n_ok] + [new]

    def _verify(self, tokens: list[int], greedy: bool) -> np.ndarray:
        """The target's step over the last token and the drafts: every row's logits, or for a greedy sampler
        where the target takes its argmax on the device, every row's ARGMAX (n indices come back, not n rows of
        the vocabulary's logits)."""
        t = self.target
        if not (greedy and t.argmax_on_device) or len(tokens) > t.n_batch:
            return t.eval(tokens, all_logits=True, prompt=False)
        n_past = t.n_past
        best = np.asarray(t.step(tokens, True, False, greedy=True)).reshape(-1)
        checked_index(t, best, lambda: t.plan(len(tokens), n_past, None, True)[0].graph.outputs[0])   # -1: not finite
        return best

    def _baseline(self, token: int, n_prompt: int, greedy: bool = False) -> None:
        """Decode steps of the target alone from the prompt (the first one not timed), then rolled back: for a
        greedy sampler, greedy decoding's own (runtime/greedy.py: the argmax on the device, each step queued before
        the one before is read, where the target can), as a run without a draft decodes; else the logits'."""
        t, st = self.target, self.stats
        n = self.baseline_steps(n_prompt)
        prefill = (t.prefill.tokens, t.prefill.seconds, t.prefill.compile_seconds)
        steps = greedy_tokens(t, [token], n) if greedy else (t.eval([token]) for _ in range(n))
        clock = None
        for _ in steps:
            if clock is not None:
                st.baseline_tokens += 1
                st.baseline_seconds += clock.seconds
            clock = caches.Stopwatch()
        t.rewind(n_prompt)
        t.decode.tokens = t.decode.seconds = 0
        t.prefill.tokens, t.prefill.seconds, t.prefill.compile_seconds = prefill

