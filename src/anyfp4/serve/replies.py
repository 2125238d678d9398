"""The OpenAI shapes of what the generation routes answer: a whole reply, its stream chunks, Server-Sent
Events (``data: JSON``, blank line; ``data: [DONE]`` last)."""

from __future__ import annotations

import json
import time
import uuid

DONE = "data: [DONE]\n\n"


def sse(payload: dict) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


class Reply:
    """One reply of ``kind`` ``"completion"`` (``/v1/completions``) or ``"chat"`` (``/v1/chat/completions``)."""

    def __init__(self, kind: str, model: str):
        self.kind, self.model = kind, model
        self.id = ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())

    def _head(self, object_name: str) -> dict:
        return {"id": self.id, "object": object_name, "created": self.created, "model": self.model}

    def whole(self, text: str, reason: str, prompt_tokens: int, completion_tokens: int) -> dict:
        if self.kind == "chat":
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                      "finish_reason": reason}
            head = self._head("chat.completion")
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": reason}
            head = self._head("text_completion")
        return {**head, "choices": [choice], "usage": usage(prompt_tokens, completion_tokens)}

    def chunk(self, text: str | None = None, reason: str | None = None, role: bool = False) -> dict:
        """A stream chunk: new ``text``, or the end (``reason``); ``role``: a chat stream's first chunk."""
        if self.kind == "chat":
            delta = {"role": "assistant", "content": ""} if role else ({"content": text} if text is not None else {})
            return {**self._head("chat.completion.chunk"),
                    "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}]}
        return {**self._head("text_completion"),
                "choices": [{"index": 0, "text": text or "", "logprobs": None, "finish_reason": reason}]}

    def usage_chunk(self, prompt_tokens: int, completion_tokens: int) -> dict:
        """The last chunk when the request asked for ``stream_options.include_usage``."""
        object_name = "chat.completion.chunk" if self.kind == "chat" else "text_completion"
        return {**self._head(object_name), "choices": [], "usage": usage(prompt_tokens, completion_tokens)}
