"""The request bodies the server accepts, checked in full before anything runs.

Types are strict (a string where a number belongs is refused, not converted) and ranges are OpenAI's.
Every field is honoured or refused by name: a request is answered as asked or not at all.
- OpenAI's fields and llama-server's that this server does not implement (UNSUPPORTED) are refused
  when set to anything but their neutral value;
- a field neither defines is refused, naming it (a typo, or a sampler this server lacks, would
  otherwise change nothing and say nothing);
- an assistant message echoed back from an earlier answer may carry OpenAI's empty extras
  (`refusal: null`, `tool_calls: []`, ...): those are dropped, anything else in them refused.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator, model_validator

from .errors import short

MAX_STOPS = 4

StopText = Annotated[str, StringConstraints(min_length=1)]


class Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class TextPart(Strict):
    type: Literal["text"]
    text: str


# what OpenAI's answers carry in a message, empty, that clients send back in the next request's history
ECHOED_EMPTY = ("refusal", "annotations", "audio", "function_call", "tool_calls")


class Message(Strict):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]
    name: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _drop_echoed_empties(cls, data: Any) -> Any:
        if isinstance(data, dict):
            return {k: v for k, v in data.items() if not (k in ECHOED_EMPTY and v in (None, []))}
        return data

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class StreamOptions(Strict):
    include_usage: bool = False


class JsonSchemaFormat(Strict):
    """OpenAI's response_format.json_schema: a named schema (strict or not, the output follows it)."""
    name: Annotated[str, StringConstraints(min_length=1, max_length=64)]
    description: str | None = None
    schema_: dict[str, Any] = Field(alias="schema")
    strict: bool | None = None


class ResponseFormat(Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_when_asked(self) -> "ResponseFormat":
        if (self.type == "json_schema") != (self.json_schema is not None):
            raise ValueError("'json_schema' is required with type 'json_schema', and only with it")
        return self

    def schema_dict(self) -> dict[str, Any]:
        return self.json_schema.schema_ if self.json_schema else {"type": "object"}


# OpenAI's fields this server does not implement, with the values that mean "not used"
UNSUPPORTED: dict[str, tuple] = {
    "n": (None, 1), "logit_bias": (None, {}),
    "presence_penalty": (None, 0, 0.0), "frequency_penalty": (None, 0, 0.0), "tools": (None, []),
    "tool_choice": (None, "none"), "functions": (None, []), "function_call": (None, "none"),
    "parallel_tool_calls": (None,), "best_of": (None, 1),
    "echo": (None, False), "suffix": (None, ""), "audio": (None,), "modalities": (None, ["text"]),
    "prediction": (None,), "reasoning_effort": (None,), "store": (None, False), "metadata": (None, {}),
    "service_tier": (None, "auto", "default"), "web_search_options": (None,),
}

# llama-server's fields (tools/server/README.md of llama.cpp) that this server does not implement
UNSUPPORTED_LLAMA: dict[str, tuple] = {
    "n_probs": (None, 0), "repeat_penalty": (None, 1, 1.0), "repeat_last_n": (None,),
    "penalty_last_n": (None,), "typical_p": (None, 1, 1.0), "tfs_z": (None, 1, 1.0), "mirostat": (None, 0),
    "mirostat_tau": (None,), "mirostat_eta": (None,), "dynatemp_range": (None, 0, 0.0),
    "dynatemp_exponent": (None,), "xtc_probability": (None, 0, 0.0), "xtc_threshold": (None,),
    "dry_multiplier": (None, 0, 0.0), "dry_base": (None,), "dry_allowed_length": (None,),
    "dry_penalty_last_n": (None,), "dry_sequence_breakers": (None,), "top_n_sigma": (None, -1, -1.0),
    "ignore_eos": (None, False), "n_keep": (None, 0), "n_discard": (None,), "min_keep": (None, 0),
    "samplers": (None,), "id_slot": (None, -1), "t_max_predict_ms": (None, 0), "image_data": (None, []),
    "lora": (None, []), "post_sampling_probs": (None, False), "return_tokens": (None, False),
    "timings_per_token": (None, False), "response_fields": (None, []), "return_progress": (None, False),
    "chat_template_kwargs": (None, {}), "reasoning_format": (None, "none"),
}


class Generation(Strict):
    """What both endpoints share: the model, the length, sampling, stop strings, streaming."""
    model: str
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0)          # not OpenAI's; llama.cpp's server takes it too
    min_p: float | None = Field(None, ge=0.0, le=1.0)     # llama-server's
    seed: int | None = Field(None, ge=-1)          # -1: a random seed, as llama-server
    n_predict: int | None = Field(None, ge=-1)    # llama-server's max_tokens; -1: as long as the context allows
    cache_prompt: bool = True                      # llama-server's: reuse a cached prefix of the prompt
    user: str | None = None                        # OpenAI's end-user id: nothing to do with it here
    response_format: ResponseFormat | None = None  # structured output (structured.py)
    json_schema: dict[str, Any] | None = None      # llama-server's: output following this JSON schema
    grammar: str | None = None                     # llama-server's: output following this GBNF grammar
    stop: StopText | Annotated[list[StopText], Field(max_length=MAX_STOPS)] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None

    @model_validator(mode="before")
    @classmethod
    def _refuse_unsupported(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for table in (UNSUPPORTED, UNSUPPORTED_LLAMA):
                for name, neutral in table.items():
                    if name in data and not any(data[name] == v and type(data[name]) is type(v) for v in neutral):
                        raise ValueError(f"'{name}' is not supported by this server (it was "
                                         f"{short(data[name])}); leave it out")
            data = {k: v for k, v in data.items() if k not in UNSUPPORTED and k not in UNSUPPORTED_LLAMA}
        return data

    @model_validator(mode="after")
    def _one_length(self) -> "Generation":
        if self.n_predict == 0:
            raise ValueError("'n_predict' must be -1 (as long as the context allows) or 1 or more, got 0")
        if self.n_predict is not None and self.max_tokens is not None and self.n_predict != self.max_tokens:
            raise ValueError(f"'n_predict' ({self.n_predict}) and 'max_tokens' ({self.max_tokens}) disagree; "
                             f"give one of them")
        return self

    @field_validator("stop", mode="before")
    @classmethod
    def _stop_shape(cls, value: Any) -> Any:
        # one sentence instead of one per alternative of the union
        ok = value is None or (isinstance(value, str) and value) or (
            isinstance(value, list) and 1 <= len(value) <= MAX_STOPS and all(isinstance(s, str) and s for s in value))
        if not ok:
            raise ValueError(f"should be a non-empty string or a list of 1 to {MAX_STOPS} non-empty strings")
        return value

    def asked_length(self) -> int | None:
        """max_tokens, else llama-server's n_predict (-1: no limit but the context)."""
        if self.max_tokens is not None:
            return self.max_tokens
        return None if self.n_predict in (None, -1) else self.n_predict

    def stops(self) -> list[str]:
        return [] if self.stop is None else [self.stop] if isinstance(self.stop, str) else list(self.stop)

    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class ChatRequest(Generation):
    messages: Annotated[list[Message], Field(min_length=1)]
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)

    @model_validator(mode="after")
    def _top_needs_logprobs(self) -> "ChatRequest":
        if self.top_logprobs and not self.logprobs:
            raise ValueError("'top_logprobs' needs 'logprobs': true")
        return self

    def n_logprobs(self) -> int | None:
        """None: no log-probabilities; else how many of the likeliest tokens to give beside each."""
        return (self.top_logprobs or 0) if self.logprobs else None

    def limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.asked_length()

    def conversation(self) -> list[dict]:
        # "developer" is OpenAI's newer name for "system"; the models' templates know only the older one
        return [{"role": "system" if m.role == "developer" else m.role, "content": m.text()} for m in self.messages]


class CompletionRequest(Generation):
    prompt: str | Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)] \
        | Annotated[list[str], Field(min_length=1, max_length=1)]
    logprobs: int | None = Field(None, ge=0, le=5)

    def n_logprobs(self) -> int | None:
        return self.logprobs

    @field_validator("prompt", mode="before")
    @classmethod
    def _prompt_shape(cls, value: Any) -> Any:
        ok = isinstance(value, str) or (isinstance(value, list) and len(value) == 1 and isinstance(value[0], str)) or (
            isinstance(value, list) and value and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0
                                                      for t in value))
        if not ok:
            raise ValueError("should be a string, a list of one string, or a non-empty list of token ids "
                             "(one prompt per request)")
        return value

    def limit(self) -> int | None:
        return self.asked_length()


class TokenizeRequest(Strict):
    """llama-server's /tokenize; `model` may be left out when one model is served."""
    content: str
    add_special: bool = False          # the model's beginning-of-sequence token, if it adds one
    with_pieces: bool = False          # each id with its text
    model: str | None = None


class DetokenizeRequest(Strict):
    tokens: list[Annotated[int, Field(ge=0)]]
    model: str | None = None


TokenId = Annotated[int, Field(ge=0)]


class EmbeddingRequest(Strict):
    """OpenAI's /v1/embeddings: one input (a string or token ids) or a list of them; llama-server's
    `embd_normalize` (-1 none, 0 max-abs to int16 range, 1 taxicab, 2 L2, p > 2 a p-norm)."""
    model: str
    input: (Annotated[str, StringConstraints(min_length=1)] | Annotated[list[str], Field(min_length=1)]
            | Annotated[list[TokenId], Field(min_length=1)] | Annotated[list[list[TokenId]], Field(min_length=1)])
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, ge=1)     # OpenAI's: only the model's own width is accepted (embeddings.py)
    user: str | None = None                        # OpenAI's end-user id: nothing to do with it here
    embd_normalize: int = Field(2, ge=-1)          # llama-server's; 2 (L2) as its default

    def inputs(self) -> list[str | list[int]]:
        """Every input, in order: a text or a list of token ids."""
        if isinstance(self.input, str) or (self.input and isinstance(self.input[0], int)):
            return [self.input]
        return list(self.input)
