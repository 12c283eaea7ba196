"""The request bodies the server accepts, checked in full before anything runs.

Types are strict (a string where a number belongs is refused, not converted) and ranges are OpenAI's.
Fields OpenAI defines that this server does not implement are refused when a client sets them to
anything but their neutral value, rather than ignored: a request is answered as asked or not at all.
Fields OpenAI does not define are ignored, as OpenAI's own server does.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator, model_validator

MAX_STOPS = 4

StopText = Annotated[str, StringConstraints(min_length=1)]


class Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class TextPart(Strict):
    type: Literal["text"]
    text: str


class Message(Strict):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]
    name: str | None = None

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class StreamOptions(Strict):
    include_usage: bool = False


# OpenAI's fields this server does not implement, with the values that mean "not used"
UNSUPPORTED: dict[str, tuple] = {
    "n": (None, 1), "logprobs": (None, False), "top_logprobs": (None, 0), "logit_bias": (None, {}),
    "presence_penalty": (None, 0, 0.0), "frequency_penalty": (None, 0, 0.0), "tools": (None, []),
    "tool_choice": (None, "none"), "functions": (None, []), "function_call": (None, "none"),
    "response_format": (None, {"type": "text"}), "best_of": (None, 1), "echo": (None, False), "suffix": (None, ""),
    "audio": (None,), "modalities": (None, ["text"]), "prediction": (None,),
}


class Generation(Strict):
    """What both endpoints share: the model, the length, sampling, stop strings, streaming."""
    model: str
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0)          # not OpenAI's; llama.cpp's server takes it too
    seed: int | None = None
    cache_prompt: bool = True        # llama-server's: reuse a cached prefix's cells (false: compute it all)
    stop: StopText | Annotated[list[StopText], Field(max_length=MAX_STOPS)] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None

    @model_validator(mode="before")
    @classmethod
    def _refuse_unsupported(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for name, neutral in UNSUPPORTED.items():
                if name in data and not any(data[name] == v and type(data[name]) is type(v) for v in neutral):
                    raise ValueError(f"'{name}' is not supported by this server (it was {data[name]!r}); "
                                     f"leave it out")
        return data

    @field_validator("stop", mode="before")
    @classmethod
    def _stop_shape(cls, value: Any) -> Any:
        # one sentence instead of one per alternative of the union
        ok = value is None or (isinstance(value, str) and value) or (
            isinstance(value, list) and 1 <= len(value) <= MAX_STOPS and all(isinstance(s, str) and s for s in value))
        if not ok:
            raise ValueError(f"should be a non-empty string or a list of 1 to {MAX_STOPS} non-empty strings")
        return value

    def stops(self) -> list[str]:
        return [] if self.stop is None else [self.stop] if isinstance(self.stop, str) else list(self.stop)

    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class ChatRequest(Generation):
    messages: Annotated[list[Message], Field(min_length=1)]
    max_completion_tokens: int | None = Field(None, ge=1)

    def limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def conversation(self) -> list[dict]:
        # "developer" is OpenAI's newer name for "system"; the models' templates know only the older one
        return [{"role": "system" if m.role == "developer" else m.role, "content": m.text()} for m in self.messages]


class CompletionRequest(Generation):
    prompt: str | Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)] \
        | Annotated[list[str], Field(min_length=1, max_length=1)]

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
        return self.max_tokens
