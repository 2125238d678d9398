"""The request bodies of the OpenAI routes (pydantic, strict: a string is no number, a float no count), and what
each may ask for. What the runner cannot honour is refused, never silently ignored (``UNSUPPORTED``); fields
this server does not know are ignored, as OpenAI's API does with those it has retired."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

MAX_STOP_STRINGS = 4  # as in OpenAI's API

# Parameters refused (400) unless absent, null or at their neutral value.
UNSUPPORTED = {"echo": (False,), "logprobs": (False,), "top_logprobs": (0,), "best_of": (1,),
               "presence_penalty": (0,), "frequency_penalty": (0,), "logit_bias": ({},), "suffix": ("",),
               "tools": ([],), "functions": ([],), "tool_choice": ("none",), "response_format": ({"type": "text"},)}

STRICT = ConfigDict(strict=True, extra="ignore")


def _is_token_id(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class StreamOptions(BaseModel):
    model_config = STRICT
    include_usage: bool = False


class GenerationBody(BaseModel):
    """What both generation routes take."""

    model_config = ConfigDict(strict=True, extra="allow")  # extras kept, to refuse the UNSUPPORTED ones
    model: str | None = None  # left out: the one served model
    temperature: float = Field(1.0, ge=0, le=2)  # OpenAI's default; 0 is greedy
    top_p: float = Field(1.0, gt=0, le=1)
    seed: int | None = Field(None, ge=0, le=2**63 - 1)
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = 1

    @field_validator("n")
    @classmethod
    def _one_choice(cls, value: int) -> int:
        if value != 1:
            raise ValueError(f"only n = 1 is supported, got {value}")
        return value

    @field_validator("stop")
    @classmethod
    def _stop_strings(cls, value):
        listed = [value] if isinstance(value, str) else value or []
        if len(listed) > MAX_STOP_STRINGS:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings, got {len(listed)}")
        if any(s == "" for s in listed):
            raise ValueError("a stop string must not be empty")
        return value

    def stop_strings(self) -> tuple[str, ...]:
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())

    def unsupported(self) -> str | None:
        """The first parameter this request sets that the server cannot honour."""
        extra = self.model_extra or {}
        for name, neutral in UNSUPPORTED.items():
            if extra.get(name) is not None and extra[name] not in neutral:
                return name
        return None

    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class CompletionBody(GenerationBody):
    prompt: str | list[int]
    max_tokens: int | None = Field(None, ge=1)  # null: OpenAI's default of 16

    @field_validator("prompt", mode="before")
    @classmethod
    def _one_prompt(cls, value):
        if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str):
            return value[0]
        if isinstance(value, str) or (isinstance(value, list) and value and all(map(_is_token_id, value))):
            return value
        if isinstance(value, list) and len(value) > 1 and all(isinstance(p, (str, list)) for p in value):
            raise ValueError("one prompt per request (a list of prompts is not supported)")
        raise ValueError("expected a string, a list of one string or a list of token ids")


class Message(BaseModel):
    model_config = STRICT
    role: Literal["system", "user", "assistant"]
    content: str

    @field_validator("content", mode="before")
    @classmethod
    def _text_only(cls, value):
        """A string, or a list of text parts (joined): images, audio and files are not for this runner."""
        if isinstance(value, list):
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                       for p in value):
                raise ValueError("only text content is supported (parts of type 'text')")
            return "".join(p["text"] for p in value)
        return value


class ChatBody(GenerationBody):
    messages: list[Message] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)  # null: what is left of the context, up to the server's limit
    max_completion_tokens: int | None = Field(None, ge=1)  # the newer name; wins over max_tokens

    def asked_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens
