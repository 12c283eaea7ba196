"""--draft, --draft-backends, --draft-n: speculative decoding in `framework run`, `check` and `split`.

    framework run -m gemma-4.gguf --draft gemma-4-assistant.gguf --backends vulkan:0
    framework run --draft layers:6 --draft-n 3            # the target's first 6 layers as its draft
    framework run -f edit.txt --draft ngram:3              # prompt lookup: spans copied from the prompt
    framework check --backends vulkan:0 --draft layers:2 --draft-backends cpu   # the shared-KV error
"""

from __future__ import annotations

import argparse

from ..terminal import select_devices
from .common import positive_int

DEFAULT_P_MIN = 0.75        # llama.cpp's --draft-p-min


def probability(text: str) -> float:
    v = float(text)
    if not 0.0 <= v < 1.0:
        raise argparse.ArgumentTypeError(f"a probability at least 0 and below 1, got {text}")
    return v


def add_draft_args(p: argparse.ArgumentParser) -> None:
    from ..runtime.speculative import DEFAULT_DRAFT_N
    g = p.add_argument_group("speculative decoding")
    g.add_argument("--draft", metavar="SPEC", help="a draft that proposes tokens the target checks in one step: "
                   "ngram[:N] (prompt lookup: what followed the latest earlier occurrence of the last N tokens, "
                   "default N 3; no model), layers:K (the target's first K layers and head, on the target's "
                   "cache), a GGUF file with the target's vocabulary (its own cache), or a Gemma 4 assistant GGUF "
                   "(MTP, on the target's cache) (default: none)")
    g.add_argument("--draft-backends", metavar="LIST", help="the draft's devices (default: --backends)")
    g.add_argument("--draft-n", type=positive_int, default=DEFAULT_DRAFT_N,
                   help="the most tokens drafted per target step; each round drafts the number that the recent "
                        "acceptance and the measured costs of verification rows and draft tokens make pay best "
                        f"(default {DEFAULT_DRAFT_N})")
    g.add_argument("--draft-p-min", type=probability, default=DEFAULT_P_MIN,
                   help="a model draft stops at the first token whose probability it puts below this; 0 never "
                        f"stops (default {DEFAULT_P_MIN}, llama.cpp's)")
    g.add_argument("--draft-inexact", action="store_true",
                   help="speculate on devices that do not declare a verification step's rows bit for bit a one-row "
                        "step's (Limits.exact_rows; openvino's, for one), which is otherwise refused: greedy text may "
                        "then differ from the target's own at near-ties (default: refused)")


def add_serve_draft_args(p: argparse.ArgumentParser) -> None:
    from ..runtime.speculative import DEFAULT_DRAFT_N
    g = p.add_argument_group("speculative decoding")
    g.add_argument("--draft", metavar="SPEC", help="every request drafts by ngram[:N] (prompt lookup: what followed "
                   "the latest earlier occurrence of the last N tokens, default N 3), checked in the batched step; "
                   "each response's usage reports the tokens drafted and accepted (default: none)")
    g.add_argument("--draft-n", type=positive_int, default=DEFAULT_DRAFT_N,
                   help=f"tokens drafted per step of a request (default {DEFAULT_DRAFT_N})")
    g.add_argument("--draft-inexact", action="store_true",
                   help="draft on devices that do not declare a verification step's rows bit for bit a one-row "
                        "step's (Limits.exact_rows), which is otherwise refused (default: refused)")


def speculative_decoder(args, session, devices):
    """The decoder --draft asks for, or None. Made before the target plans anything (an MTP draft needs the
    target's graphs to return their hidden state)."""
    from ..runtime.speculative import DEFAULT_DRAFT_N, SpeculativeDecoder, make_draft
    if not getattr(args, "draft", None):
        if getattr(args, "draft_backends", None) or getattr(args, "draft_n", DEFAULT_DRAFT_N) != DEFAULT_DRAFT_N \
                or getattr(args, "draft_p_min", DEFAULT_P_MIN) != DEFAULT_P_MIN \
                or getattr(args, "draft_inexact", False):
            raise ValueError("--draft-backends, --draft-n, --draft-p-min and --draft-inexact need --draft SPEC "
                             "(ngram[:N], layers:K or a draft GGUF file)")
        return None
    spec = args.draft
    from ..runtime.lookup import is_lookup
    lookup = is_lookup(spec)
    if lookup and args.draft_backends:
        raise ValueError(f"--draft-backends {args.draft_backends}: --draft {spec} runs no model and uses no device; "
                         f"drop --draft-backends")
    if lookup and args.draft_p_min != DEFAULT_P_MIN:
        raise ValueError(f"--draft-p-min {args.draft_p_min}: --draft {spec} proposes without probabilities, so no "
                         f"threshold applies; drop --draft-p-min (acceptance still pauses drafting that fails)")
    draft_devices = select_devices(args.draft_backends) if args.draft_backends else devices
    if not lookup and not spec.startswith("layers:"):
        from ..model.default import resolve_model
        spec = str(resolve_model(spec))
    from .common import load_model
    return SpeculativeDecoder(session, make_draft(spec, session, draft_devices, load=load_model), args.draft_n,
                              p_min=args.draft_p_min, inexact=args.draft_inexact)


def shared_summary(decoder) -> str:
    """The target's tensors the draft uses in place, in a line: caches by layer, weights counted."""
    if decoder.draft.session is None:
        return "reads only the text"
    shared = decoder.draft.shared()
    if not shared:
        return "shares nothing with the target (its own weights and cache)"
    caches = sorted({int(n.rsplit("_l", 1)[1]) for n in shared if n.startswith("cache_")})
    weights = [n for n in shared if not n.startswith("cache_")]
    where = sorted({r.device for r in shared.values()})
    parts = []
    if caches:
        parts.append(f"KV cache of layer{'s' if len(caches) > 1 else ''} {_ranges(caches)}")
    if weights:
        parts.append(weights[0] if len(weights) == 1 else f"{len(weights)} weights")
    return f"uses the target's {' and '.join(parts)} in place (on {', '.join(where)})"


def _ranges(values: list[int]) -> str:
    out, start = [], values[0]
    for a, b in zip(values, values[1:] + [None]):
        if b != a + 1:
            out.append(str(start) if start == a else f"{start}-{a}")
            start = b
    return ", ".join(out)


def draft_line(decoder) -> str:
    d = decoder.draft
    where = f"on {', '.join(x.name for x in d.session.devices)}" if d.session else "(no model, no device)"
    inexact = (f"; --draft-inexact: verified on {', '.join(decoder.inexact_devices)}, whose rows may differ from "
               f"a one-row step's, so greedy text may differ from the target's own at near-ties"
               if decoder.inexact_devices else "")
    return f"draft {d.describe()} {where}, {decoder.n_draft} tokens a step; {shared_summary(decoder)}{inexact}"


def draft_record(decoder) -> dict:
    """The draft in a --plan record: what it is, its devices, the tensors it shares, its plans, the run's figures."""
    d = decoder.draft
    return {"kind": d.kind, "draft": d.describe(), "devices": [x.name for x in d.session.devices] if d.session else [],
            "n_draft": decoder.n_draft,
            "shared": {name: {"owner": r.owner, "device": r.device, "buffer": r.buffer.name, "copies": list(r.copies)}
                       for name, r in d.shared().items()},
            "plans": {d.session.context.phase_name(k): plan.to_dict() for k, (plan, _) in d.session.plans.items()}
            if d.session else {},
            "stats": decoder.stats.to_dict()}
