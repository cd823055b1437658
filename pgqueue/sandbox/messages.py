"""What a Messages API request and answer look like to the sandbox: request validation as the
API words it, the input-token estimate, filler answers of a given length, error JSON.

Split out of :mod:`pgqueue.sandbox.app`, which serves them.
"""

from __future__ import annotations

import math
from typing import Any

#: Characters per token for the sandbox's token estimate (Anthropic's rule of thumb).
CHARS_PER_TOKEN = 4

#: Anthropic error ``type`` per HTTP status (see the API's "Errors" page).
_ERROR_TYPES: dict[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}

_FILLER = "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor. "


def error_body(status: int, message: str) -> dict[str, Any]:
    """Anthropic's error JSON for ``status``: ``{"type": "error", "error": {...}}``."""
    kind = _ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def _texts(value: object) -> list[str]:
    """Text pieces of a ``system`` / message ``content`` value (string or list of blocks)."""
    if isinstance(value, str):
        return [value]
    out: list[str] = []
    if isinstance(value, list):
        for block in value:
            if isinstance(block, dict):
                text = block.get("text")
                if isinstance(text, str):
                    out.append(text)
                out.extend(_texts(block.get("content")))  # e.g. tool_result blocks
            elif isinstance(block, str):
                out.append(block)
    return out


def count_input_tokens(body: dict[str, Any]) -> int:
    """Estimate a request's input tokens: ``ceil(characters / 4)``.

    Counts the text of ``system`` (string or list of text blocks) and of every message's
    ``content`` (string or list of blocks with ``"text"``). Four characters per token is
    the rule of thumb in Anthropic's docs; the real tokenizer differs.
    """
    chars = sum(len(t) for t in _texts(body.get("system")))
    for message in body.get("messages") or []:
        if isinstance(message, dict):
            chars += sum(len(t) for t in _texts(message.get("content")))
    return math.ceil(chars / CHARS_PER_TOKEN)


def output_token_count(max_tokens: int, output_ratio: float) -> int:
    """Output tokens of one answer: ``max(1, ceil(max_tokens * output_ratio))``, <= max_tokens."""
    return min(max_tokens, max(1, math.ceil(max_tokens * output_ratio)))


def filler_text(tokens: int) -> str:
    """Filler of exactly ``tokens * 4`` characters, i.e. ``tokens`` tokens by our estimate."""
    n = tokens * CHARS_PER_TOKEN
    return (_FILLER * (n // len(_FILLER) + 1))[:n]


def _blank(text: object) -> bool:
    """Non-empty white space only (Python's ``str.isspace``)."""
    return isinstance(text, str) and text.isspace()


def validation_error(body: object, *, need_max_tokens: bool) -> str | None:
    """The first problem with a request body, as the API would word it, or None."""
    if not isinstance(body, dict):
        return "request body must be a JSON object"
    model = body.get("model")
    if not isinstance(model, str) or not model:
        return "model: field required (non-empty string)"
    if need_max_tokens:
        max_tokens = body.get("max_tokens")
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int):
            return "max_tokens: field required (integer)"
        if max_tokens <= 0:
            return "max_tokens: must be greater than or equal to 1"
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return "messages: field required (non-empty list)"
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            return f"messages.{i}: must be an object"
        if message.get("role") not in ("user", "assistant"):
            return f"messages.{i}.role: must be 'user' or 'assistant'"
        content = message.get("content")
        if not isinstance(content, str | list):
            return f"messages.{i}.content: must be a string or a list of content blocks"
        # Empty content, as the API refuses it (found by a tester: the sandbox answered it).
        if not content and (i < len(messages) - 1 or message["role"] != "assistant"):
            return (
                f"messages.{i}: all messages must have non-empty content except for the "
                "optional final assistant message"
            )
        if isinstance(content, list) and any(
            isinstance(b, dict) and b.get("type") == "text" and b.get("text") == "" for b in content
        ):
            return "messages: text content blocks must be non-empty"
        # White-space text too (pgqueue.validation.empty_text_message refuses the same).
        if _blank(content) or (
            isinstance(content, list)
            and any(
                isinstance(b, dict) and b.get("type") == "text" and _blank(b.get("text"))
                for b in content
            )
        ):
            return "messages: text content blocks must contain non-whitespace text"
    system = body.get("system")
    if system is not None and not isinstance(system, str | list):
        return "system: must be a string or a list of text blocks"
    if body.get("stream"):
        return "stream: streaming is not supported by the pgqueue sandbox"
    return None
