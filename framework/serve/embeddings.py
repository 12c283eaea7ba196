"""POST /v1/embeddings, as llama-server's with --embeddings: each input's pooled hidden state.

An input's vector is the mean, over its tokens, of the hidden state the output head reads (after the
model's last norm; llama.cpp's `--pooling mean`), normalised as llama-server's `embd_normalize` says
(default 2: divided by its L2 norm). A model served with --embeddings gets one more session: weights and
programs are the model's, shared; a cache of --ctx cells is its own, and its steps return the hidden
state of every row (Session(hidden=True)). It runs on the compute thread, between the batched steps.
Without --embeddings nothing of it is reserved, and the route is refused naming the flag.
"""

from __future__ import annotations

import base64

import numpy as np

from ..core.scheduler import Reservation
from ..model.tokenizer import TokenizerError
from ..runtime.session import Session
from .errors import ApiError
from .schemas import EmbeddingRequest


def embedding_session(lender: Session, keep: dict) -> tuple[Session, Reservation]:
    """A session of lender's model that returns hidden states, reserved for a whole chunk of prompt rows
    over its whole cache (the largest step it takes); other prompt lengths are planned when they come."""
    s = Session(lender.model, lender.devices, share_model_with=lender, hidden=True, **keep)
    return s, s.reserve_shapes([s.context.rows_key(min(s.n_batch, s.n_ctx), s.n_ctx, None)])


def without_weights(result: Reservation) -> Reservation:
    """The reservation as check_together counts a second session of a model: the weights are the model's,
    counted once already (its programs are counted again: an over-count, never an under-count)."""
    memory = {dev: {**use, "weights": 0} for dev, use in result.memory.items()}
    return Reservation(result.plans, result.programs, memory)


def pooled(session: Session, ids: list[int]) -> np.ndarray:
    """The mean of the hidden rows of ids, fed from an empty context in chunks of --batch rows."""
    session.reset()
    total = None
    for start in range(0, len(ids), session.n_batch):
        session.eval(ids[start:start + session.n_batch], all_logits=True)
        rows = session.hidden_rows.astype(np.float64).sum(axis=0)
        total = rows if total is None else total + rows
    return total / len(ids)


def normalised(v: np.ndarray, p: int) -> np.ndarray:
    """llama.cpp's common_embd_normalize: -1 none, 0 max-abs scaled to 32760, 1 taxicab, 2 L2, p > 2 p-norm."""
    if p < 0:
        return v
    if p == 0:
        norm = np.abs(v).max() / 32760.0
    elif p == 2:
        norm = np.sqrt((v * v).sum())
    else:
        norm = (np.abs(v) ** p).sum() ** (1.0 / p)
    return v / norm if norm > 0 else v


def input_ids(tokenizer, item: str | list[int], index: int | None, model_id: str, n_ctx: int) -> list[int]:
    """An input's token ids (a text is tokenized as a prompt, with the model's beginning-of-sequence token),
    checked against the vocabulary and the context."""
    param = "input" if index is None else f"input[{index}]"
    if isinstance(item, str):
        try:
            ids = tokenizer.encode(item)
        except TokenizerError as e:
            raise ApiError(400, str(e), code="invalid_value", param=param) from None
    else:
        bad = [t for t in item if t >= tokenizer.n_vocab]
        if bad:
            raise ApiError(400, f"token ids {bad[:5]} of {param} are outside the vocabulary of '{model_id}' "
                           f"(0..{tokenizer.n_vocab - 1})", code="invalid_value", param=param)
        ids = list(item)
    if not ids:
        raise ApiError(400, f"{param} is empty and '{model_id}' adds no beginning-of-sequence token: there is no "
                       f"token to pool; give some text", code="invalid_value", param=param)
    if len(ids) > n_ctx:
        raise ApiError(400, f"{param} is {len(ids)} tokens, more than the context of {n_ctx} tokens that "
                       f"'{model_id}' is served with (--ctx)", code="context_length_exceeded", param=param,
                       prompt_tokens=len(ids), context_length=n_ctx)
    return ids


def check_width(req: EmbeddingRequest, width: int, model_id: str) -> None:
    """OpenAI's `dimensions` shortens the vectors of models trained for it; this server gives the model's
    own width only, so any other value is refused rather than ignored."""
    if req.dimensions is not None and req.dimensions != width:
        raise ApiError(400, f"'dimensions' is {req.dimensions}, but '{model_id}' gives vectors of {width} "
                       f"(its hidden size) and this server does not shorten them; leave 'dimensions' out",
                       code="invalid_value", param="dimensions")


def encoded(v: np.ndarray, encoding_format: str) -> list[float] | str:
    """OpenAI's encodings: a list of floats, or base64 of the float32 values, little-endian (what OpenAI's
    Python client asks for by default, and decodes)."""
    if encoding_format == "base64":
        return base64.b64encode(v.astype("<f4").tobytes()).decode("ascii")
    return v.astype(np.float32).tolist()
