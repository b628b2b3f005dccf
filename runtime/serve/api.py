"""OpenAI chat-completions requests: what the room honours, checked; everything else
refused with a 400 in OpenAI's error format naming the parameter (never ignored).

Pure functions over JSON-ready values (no aiohttp): :func:`parse_chat_request` turns a
request body into a :class:`ChatRequest` or raises :class:`ApiError`; :func:`error_body`,
:func:`completion_body` and :func:`chunk_body` build the response objects.

Sampling: ``temperature`` (0-2, OpenAI's range; 0 or absent: greedy, the default),
``top_p`` (in (0, 1]), ``top_k`` (an extra, as vLLM and llama.cpp's server take it: an
integer >= 0, 0 off) and ``seed`` (an integer 0..2**64-1: the same seed and request give
the same answer; without one each sampled answer gets a fresh seed). ``top_p`` and
``top_k`` shape the distribution only when ``temperature`` > 0. With speculation on,
sampled answers keep the model's distribution (:mod:`planner.sampling`). Still accepted
only at the values that change nothing: ``n`` 1, penalties 0, no logprobs, no logit
bias. ``user`` is accepted and not used.
"""

from __future__ import annotations

import json
import math
import re
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from planner.sampling import MAX_SEED, MIN_TEMPERATURE, Sampling

#: stop sequences a request may give (OpenAI's limit)
MAX_STOP = 4
#: longest stop sequence, characters
MAX_STOP_CHARS = 256
#: messages in one request
MAX_MESSAGES = 256
#: answer cap when the request gives none, tokens (as ``splitroom generate --max-tokens``)
DEFAULT_MAX_TOKENS = 256

ROLES = ("system", "user", "assistant")
#: parameters accepted only at the value that means greedy decoding: name -> (allowed values, why)
_GREEDY_ONLY = {
    "n": ((1,), "this room gives one answer per request: only n 1 is honoured"),
    "presence_penalty": ((0, 0.0), "penalties are not supported: only presence_penalty 0 is honoured"),
    "frequency_penalty": ((0, 0.0), "penalties are not supported: only frequency_penalty 0 is honoured"),
    "logprobs": ((False,), "logprobs are not supported"),
    "top_logprobs": ((0,), "logprobs are not supported"),
    "parallel_tool_calls": ((False,), "tools are not supported"),
}
_ACCEPTED = {"model", "messages", "max_tokens", "max_completion_tokens", "stop", "stream", "stream_options",
             "seed", "user", "response_format", "logit_bias", "store", "metadata", "temperature", "top_p", "top_k",
             *_GREEDY_ONLY}
#: OpenAI's temperature range
MAX_TEMPERATURE = 2.0
#: deepest nesting of arrays and objects a request body may have (a chat request with
#: text parts nests 5 deep)
MAX_JSON_DEPTH = 32
_JSON_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]')


class ApiError(Exception):
    """A request the room will not run, as an HTTP status and an OpenAI error object.

    Attributes:
        status: HTTP status (400 bad request, 404 unknown model, 429 queue full, 503
            room not ready).
        message: what is wrong, for a person.
        param: the request parameter at fault (e.g. ``temperature``, ``messages[1].role``) or None.
        code: OpenAI-style code (``unsupported_parameter``, ``context_length_exceeded``,
            ``model_not_found``, ``rate_limit_exceeded``, ``room_not_ready``...) or None.
        type: OpenAI error type (``invalid_request_error``, ``rate_limit_error``,
            ``service_unavailable``...).
        retry_after_s: seconds for a Retry-After header (429 and 503), or None.
    """

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 type: str = "invalid_request_error", retry_after_s: float | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type
        self.retry_after_s = retry_after_s

    def body(self) -> dict:
        """The response body: ``{"error": {message, type, param, code}}``."""
        return error_body(self.message, self.type, self.param, self.code)

    def headers(self) -> dict[str, str]:
        """``Retry-After`` (whole seconds, at least 1) when set."""
        if self.retry_after_s is None:
            return {}
        return {"Retry-After": str(max(1, int(math.ceil(self.retry_after_s))))}


def error_body(message: str, type: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    """An OpenAI error object."""
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


@dataclass(frozen=True)
class ChatRequest:
    """A checked chat request.

    Attributes:
        model: the model id asked for (the served one).
        messages: ``[{"role", "content"}]`` with text contents, for the chat template.
        max_tokens: the answer cap the request gave (tokens), or None (the server picks).
        stop: stop sequences (at most 4, non-empty); the answer ends before the first one.
        stream: answer as server-sent events, one chunk per answer token.
        include_usage: (stream) send a last chunk with ``usage``.
        sampling: how to decode (temperature, top_p, top_k, seed); None: greedy.
    """

    model: str
    messages: tuple[dict, ...]
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    stream: bool = False
    include_usage: bool = False
    sampling: Sampling | None = None
    id: str = field(default_factory=lambda: "chatcmpl-" + secrets.token_hex(12))
    created: int = field(default_factory=lambda: int(time.time()))


def _bad(message: str, param: str | None, code: str | None = "invalid_value") -> ApiError:
    return ApiError(400, message, param, code)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _text(v: str, where: str) -> str:
    """``v`` if it is Unicode text (UTF-8 can carry it); a lone surrogate (JSON's
    ``"\\ud800"``) is refused naming ``where``."""
    try:
        v.encode("utf-8")
    except UnicodeEncodeError:
        raise _bad("text must be Unicode: it holds a lone surrogate (\\ud800-\\udfff not in a pair)", where,
                   "invalid_value") from None
    return v


def _content(v: Any, where: str) -> str:
    """A message's content as text: a string, or a list of ``{"type": "text", "text"}`` parts."""
    if isinstance(v, str):
        return _text(v, where)
    if isinstance(v, list):
        out = []
        for j, part in enumerate(v):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise _bad(f"only text content parts are supported, got {str(kind)[:40]!r}", f"{where}[{j}]",
                           "unsupported_content")
            extra = sorted(set(part) - {"type", "text"})
            if extra:
                raise _bad(f"content part field {extra[0][:40]!r} is not supported", f"{where}[{j}].{extra[0][:40]}",
                           "unsupported_parameter")
            out.append(_text(part["text"], f"{where}[{j}].text"))
        return "".join(out)
    raise _bad("message content must be a string or a list of text parts", where, "invalid_type")


def _too_deep(text: str) -> str | None:
    """Where ``text`` (JSON) nests past :data:`MAX_JSON_DEPTH`: the top-level key whose
    value does (``"(body)"`` when the body itself does), or None. Strings are skipped
    whole by one regular expression, so the walk costs a step per bracket or string."""
    depth, top_object, last, key = 0, False, None, None
    for m in _JSON_TOKENS.finditer(text):
        t = m.group()
        if t[0] == '"':
            if depth == 1:
                last = t
            continue
        if t in "[{":
            depth += 1
            if depth == 1:
                top_object = t == "{"
            elif depth == 2:
                key = last if top_object else None
            if depth > MAX_JSON_DEPTH:
                if key is None:
                    return "(body)"
                try:
                    return str(json.loads(key))[:60]
                except ValueError:
                    return "(body)"
        else:
            depth -= 1
    return None


def load_json(raw: bytes) -> Any:
    """A request body as JSON. Raises ApiError (400) for a body that is not UTF-8, not
    JSON, or nests deeper than :data:`MAX_JSON_DEPTH` (naming the top-level field)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ApiError(400, "the request body is not UTF-8 text", None, "invalid_json") from None
    where = _too_deep(text)
    if where is not None:
        raise ApiError(400, f"the request body nests deeper than {MAX_JSON_DEPTH} levels in {where}",
                       None if where == "(body)" else where, "invalid_json")
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        raise ApiError(400, "the request body is not valid JSON", None, "invalid_json") from None


def parse_chat_request(body: Any, model_id: str) -> ChatRequest:
    """Check a ``POST /v1/chat/completions`` body (parsed JSON) against what the room honours.

    Raises:
        ApiError: 400 naming the parameter for anything missing, malformed, unknown or not
            honoured (sampling other than greedy, tools, images...); 404 for a model
            other than ``model_id``.
    """
    if not isinstance(body, dict):
        raise _bad("the request body must be a JSON object", None, "invalid_type")
    given = {k: v for k, v in body.items() if v is not None}  # explicit nulls mean "not given"
    for k in given:
        if k not in _ACCEPTED:
            raise _bad(f"parameter {str(k)[:60]!r} is not supported by this room", str(k)[:60],
                       "unsupported_parameter")
    for k, (ok, why) in _GREEDY_ONLY.items():
        if k not in given:
            continue
        v = given[k]
        if isinstance(ok[0], bool):
            fine = isinstance(v, bool) and v == ok[0]
        else:
            fine = isinstance(v, (int, float)) and not isinstance(v, bool) and v in ok
        if not fine:
            raise _bad(f"{why} (got {_shown(v)})", k, "unsupported_value")
    if given.get("logit_bias"):
        raise _bad("logit_bias is not supported", "logit_bias", "unsupported_value")
    rf = given.get("response_format")
    if rf is not None and rf != {"type": "text"}:
        raise _bad("only response_format {\"type\": \"text\"} is supported", "response_format", "unsupported_value")
    sampling = _sampling(given)
    if "user" in given and not isinstance(given["user"], str):
        raise _bad("user must be a string", "user", "invalid_type")

    model = given.get("model")
    if not isinstance(model, str) or not model:
        raise _bad("model is required (a string)", "model", "missing_required_parameter" if model is None
                   else "invalid_type")
    if model != model_id:
        raise ApiError(404, f"the model {model[:80]!r} is not served here; this room serves {model_id!r}",
                       "model", "model_not_found")

    msgs = given.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise _bad("messages is required: a non-empty list", "messages",
                   "missing_required_parameter" if msgs is None else "invalid_type")
    if len(msgs) > MAX_MESSAGES:
        raise _bad(f"at most {MAX_MESSAGES} messages", "messages")
    out = []
    for i, m in enumerate(msgs):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise _bad("each message must be an object with role and content", where, "invalid_type")
        role = m.get("role")
        if role not in ROLES:
            raise _bad(f"role must be one of {', '.join(ROLES)}, got {str(role)[:40]!r}", f"{where}.role")
        for k, v in m.items():
            if k not in ("role", "content") and v is not None:
                raise _bad(f"message field {str(k)[:40]!r} is not supported", f"{where}.{str(k)[:40]}",
                           "unsupported_parameter")
        if m.get("content") is None:
            raise _bad("message content is required", f"{where}.content", "missing_required_parameter")
        out.append({"role": role, "content": _content(m["content"], f"{where}.content")})

    cap = None
    for k in ("max_tokens", "max_completion_tokens"):
        if k in given:
            v = given[k]
            if not _is_int(v) or v < 1:
                raise _bad(f"{k} must be an integer >= 1, got {(repr(v) if isinstance(v, str) else str(v))[:40]}", k)
            if cap is not None and v != cap:
                raise _bad("max_tokens and max_completion_tokens disagree; give one", k)
            cap = v

    stop = given.get("stop", ())
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, (list, tuple)) or len(stop) > MAX_STOP:
        raise _bad(f"stop must be a string or a list of at most {MAX_STOP} strings", "stop")
    for s in stop:
        if not isinstance(s, str) or not s or len(s) > MAX_STOP_CHARS:
            raise _bad(f"each stop sequence must be a non-empty string of at most {MAX_STOP_CHARS} characters",
                       "stop")
        _text(s, "stop")

    stream = given.get("stream", False)
    if not isinstance(stream, bool):
        raise _bad("stream must be true or false", "stream", "invalid_type")
    include_usage = False
    so = given.get("stream_options")
    if so is not None:
        if not stream:
            raise _bad("stream_options is only allowed with stream: true", "stream_options")
        if not isinstance(so, dict) or set(so) - {"include_usage"}:
            raise _bad("stream_options supports include_usage only", "stream_options", "unsupported_parameter")
        include_usage = so.get("include_usage", False)
        if not isinstance(include_usage, bool):
            raise _bad("stream_options.include_usage must be true or false", "stream_options.include_usage",
                       "invalid_type")
    return ChatRequest(model=model, messages=tuple(out), max_tokens=cap, stop=tuple(stop), stream=stream,
                       include_usage=include_usage, sampling=sampling)


def _number(v: Any) -> bool:
    """A JSON number: an int of any size (finite, never converted to a float) or a finite float."""
    if isinstance(v, bool):
        return False
    return isinstance(v, int) or (isinstance(v, float) and math.isfinite(v))


def _shown(v: Any) -> str:
    """``v`` for an error message, at most 40 characters: a number as written, anything else
    as Python writes it (the string ``"1"`` shows as ``'1'``, so a client sees it sent a string)."""
    return (str(v) if _number(v) else repr(v))[:40]


def _sampling(given: dict) -> Sampling | None:
    """``temperature``, ``top_p``, ``top_k``, ``seed`` checked, as a Sampling (None:
    greedy, temperature absent or 0). Raises ApiError (400) naming the parameter."""
    t = given.get("temperature", 0)
    if not _number(t) or not 0 <= t <= MAX_TEMPERATURE:
        raise _bad(f"temperature must be a number from 0 to {MAX_TEMPERATURE:g} (got {_shown(t)})", "temperature",
                   "invalid_value" if _number(t) else "invalid_type")
    if 0 < t < MIN_TEMPERATURE:
        raise _bad(f"temperature must be 0 (greedy) or at least {MIN_TEMPERATURE:g} (got {_shown(t)})",
                   "temperature")
    p = given.get("top_p", 1)
    if not _number(p) or not 0 < p <= 1:
        raise _bad(f"top_p must be a number more than 0 and at most 1 (got {_shown(p)})", "top_p",
                   "invalid_value" if _number(p) else "invalid_type")
    k = given.get("top_k", 0)
    if not _is_int(k) or k < 0:
        raise _bad(f"top_k must be an integer >= 0, 0 for off (got {_shown(k)})", "top_k",
                   "invalid_value" if _is_int(k) else "invalid_type")
    seed = given.get("seed")
    if seed is not None and not _is_int(seed):
        raise _bad("seed must be an integer", "seed", "invalid_type")
    if seed is not None and not 0 <= seed <= MAX_SEED:
        raise _bad(f"seed must be from 0 to {MAX_SEED}", "seed")
    if t == 0:
        return None
    return Sampling(temperature=t, top_p=p, top_k=k, seed=seed)


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    """OpenAI's ``usage`` object."""
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def completion_body(req: ChatRequest, text: str, finish_reason: str, prompt_tokens: int,
                    completion_tokens: int) -> dict:
    """A non-streamed ``chat.completion``."""
    return {"id": req.id, "object": "chat.completion", "created": req.created, "model": req.model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                         "logprobs": None, "finish_reason": finish_reason}],
            "usage": usage(prompt_tokens, completion_tokens)}


def chunk_body(req: ChatRequest, delta: dict, finish_reason: str | None = None,
               usage_obj: dict | None = None, no_choice: bool = False) -> dict:
    """One ``chat.completion.chunk`` of a streamed answer (``no_choice``: the usage chunk,
    whose ``choices`` is empty)."""
    out = {"id": req.id, "object": "chat.completion.chunk", "created": req.created, "model": req.model,
           "choices": [] if no_choice else [{"index": 0, "delta": delta, "logprobs": None,
                                             "finish_reason": finish_reason}]}
    if req.include_usage:
        out["usage"] = usage_obj
    return out


class StopMatcher:
    """Cuts streamed text at the first stop sequence, holding back a tail that could be
    the start of one (so no text after a stop sequence is ever sent).

    ``push(piece) -> (text to send now, stopped)``; ``flush() -> text held back`` at the
    end of an answer that did not stop."""

    def __init__(self, stops: tuple[str, ...]):
        self.stops = stops
        self.held = ""
        self.stopped = False

    def push(self, piece: str) -> tuple[str, bool]:
        if self.stopped:
            return "", True
        self.held += piece
        if not self.stops:
            out, self.held = self.held, ""
            return out, False
        cut = min((i for i in (self.held.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            out, self.held, self.stopped = self.held[:cut], "", True
            return out, True
        keep = 0  # longest tail of held that is a proper prefix of a stop sequence
        for s in self.stops:
            for n in range(min(len(s) - 1, len(self.held)), keep, -1):
                if self.held.endswith(s[:n]):
                    keep = n
                    break
        out = self.held[:len(self.held) - keep]
        self.held = self.held[len(self.held) - keep:]
        return out, False

    def flush(self) -> str:
        out, self.held = ("" if self.stopped else self.held), ""
        return out
