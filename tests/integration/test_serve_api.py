"""runtime/serve/api.py: which OpenAI chat parameters the room honours (greedy by default;
temperature, top_p, top_k, seed), the 400s naming the parameter for the rest, and stop
sequences cut across tokens."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from planner.sampling import Sampling
from runtime.serve.api import ApiError, StopMatcher, parse_chat_request

M = "smollm2-135m"
MSG = [{"role": "user", "content": "What is the capital of France?"}]


def req(**kw):
    return parse_chat_request({"model": M, "messages": MSG, **kw}, M)


def refused(body, param, status=400):
    with pytest.raises(ApiError) as e:
        parse_chat_request(body, M)
    assert e.value.status == status, e.value.message
    assert e.value.param == param, e.value.message
    assert e.value.body()["error"]["param"] == param and e.value.body()["error"]["message"]
    return e.value


def test_what_is_honoured():
    r = req(max_tokens=5, stop="\n", stream=True, stream_options={"include_usage": True}, temperature=0,
            top_p=1, n=1, seed=3, user="me", presence_penalty=0.0, frequency_penalty=0, logprobs=False,
            response_format={"type": "text"})
    assert (r.max_tokens, r.stop, r.stream, r.include_usage, r.sampling) == (5, ("\n",), True, True, None)
    assert req(max_completion_tokens=7).max_tokens == 7
    assert req(max_tokens=7, max_completion_tokens=7).max_tokens == 7
    assert req(temperature=None, max_tokens=None).max_tokens is None  # explicit nulls are "not given"
    parts = req(messages=[{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text",
                                                                                      "text": "b"}]}])
    assert parts.messages == ({"role": "user", "content": "ab"},)


def test_sampling_parameters():
    assert req(temperature=0.7, top_p=0.9, top_k=40, seed=2**64 - 1).sampling == Sampling(0.7, 0.9, 40, 2**64 - 1)
    assert req(temperature=2).sampling == Sampling(2.0)  # seed None: the node picks a fresh one
    assert req(top_p=0.5, top_k=3, seed=1).sampling is None  # no temperature: greedy, the default
    assert req(temperature=0, seed=4).sampling is None


@pytest.mark.parametrize("extra,param", [
    ({"temperature": 2.5}, "temperature"), ({"temperature": -0.1}, "temperature"), ({"temperature": True}, "temperature"),
    ({"temperature": "1"}, "temperature"), ({"top_p": 0}, "top_p"), ({"top_p": 1.01}, "top_p"),
    ({"top_k": -1}, "top_k"), ({"top_k": 2.0}, "top_k"), ({"seed": -1}, "seed"), ({"seed": 2**64}, "seed"),
    ({"n": 2}, "n"), ({"presence_penalty": 1}, "presence_penalty"), ({"logprobs": True}, "logprobs"),
    ({"tools": [{"type": "function"}]}, "tools"), ({"functions": []}, "functions"),
    ({"logit_bias": {"1": 5}}, "logit_bias"), ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"frobnicate": 1}, "frobnicate"), ({"max_tokens": 0}, "max_tokens"), ({"max_tokens": 2.5}, "max_tokens"),
    ({"max_tokens": True}, "max_tokens"), ({"max_tokens": 3, "max_completion_tokens": 4}, "max_completion_tokens"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop"), ({"stop": [""]}, "stop"), ({"stop": 5}, "stop"),
    ({"stream": "yes"}, "stream"), ({"stream_options": {"include_usage": True}}, "stream_options"),
    ({"stream": True, "stream_options": {"other": 1}}, "stream_options"), ({"seed": "x"}, "seed"),
])
def test_what_is_refused_names_the_parameter(extra, param):
    e = refused({"model": M, "messages": MSG, **extra}, param)
    assert e.code in ("unsupported_parameter", "unsupported_value", "invalid_value", "invalid_type")


@pytest.mark.parametrize("messages,param", [
    (None, "messages"), ([], "messages"), ("hi", "messages"), ([5], "messages[0]"),
    ([{"role": "tool", "content": "x"}], "messages[0].role"), ([{"role": "user"}], "messages[0].content"),
    ([{"role": "user", "content": 3}], "messages[0].content"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}], "messages[0].content[0]"),
    ([{"role": "user", "content": "x", "name": "bob"}], "messages[0].name"),
    ([MSG[0], {"role": "assistant", "content": "x", "tool_calls": []}], "messages[1].tool_calls"),
])
def test_bad_messages_name_the_message(messages, param):
    refused({"model": M, "messages": messages} if messages is not None else {"model": M}, param)


def test_model_and_body():
    refused({"model": "gpt-4o", "messages": MSG}, "model", 404)
    refused({"messages": MSG}, "model")
    refused([1, 2], None)


def _feed(stops, pieces):
    m = StopMatcher(tuple(stops))
    out, stopped = [], False
    for p in pieces:
        o, stopped = m.push(p)
        out.append(o)
        if stopped:
            break
    if not stopped:
        out.append(m.flush())
    return "".join(out), stopped


def test_stop_sequences_cut_across_pieces():
    assert _feed(["Paris"], ["The capital is", " Pa", "ris", "."]) == ("The capital is ", True)
    assert _feed(["\n\n"], ["a\n", "b\n", "\n", "c"]) == ("a\nb", True)
    assert _feed(["xyz"], ["ab", "xy", "q"]) == ("abxyq", False)
    assert _feed([], ["a", "b"]) == ("ab", False)


def _oracle(text, stops):
    """The answer up to the stop sequence completed first (fed one character at a time),
    the earliest-starting one among those completed by the same character."""
    for end in range(1, len(text) + 1):
        starts = [end - len(s) for s in stops if end >= len(s) and text[end - len(s):end] == s]
        if starts:
            return text[:min(starts)], True
    return text, False


@settings(max_examples=300, deadline=None)
@given(st.text("ab\n", max_size=24), st.lists(st.text("ab\n", min_size=1, max_size=3), min_size=1, max_size=3))
def test_stop_matcher_one_character_at_a_time(text, stops):
    assert _feed(stops, list(text)) == _oracle(text, stops)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text("ab\n", max_size=4), max_size=8), st.lists(st.text("ab\n", min_size=1, max_size=3),
                                                                   min_size=1, max_size=3))
def test_stop_matcher_never_sends_a_stop_sequence(pieces, stops):
    text = "".join(pieces)
    out, stopped = _feed(stops, pieces)
    assert text.startswith(out) and not any(s in out for s in stops)
    assert stopped == any(s in text for s in stops)
    if not stopped:
        assert out == text


def test_mdns_candidates_are_removed_from_a_browser_offer():
    from runtime.serve.guest import strip_mdns_candidates
    offer = ("v=0\r\no=- 1 2 IN IP4 127.0.0.1\r\ns=-\r\nt=0 0\r\nm=application 9 UDP/DTLS/SCTP webrtc-datachannel\r\n"
             "a=candidate:1 1 udp 2113937151 0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0.local 54321 typ host generation 0 "
             "network-cost 999\r\na=candidate:2 1 udp 2113937151 192.168.1.5 54322 typ host generation 0\r\n"
             "a=ice-ufrag:abcd\r\n")
    out = strip_mdns_candidates(offer)
    assert ".local" not in out and "192.168.1.5 54322" in out and "a=ice-ufrag:abcd" in out
    assert out.count("\r\n") == offer.count("\r\n") - 1


def test_a_max_tokens_string_is_shown_quoted():
    """max_tokens "5" (a string) was refused with 'got 5', which reads as if 5 were
    refused; the message quotes it."""
    e = refused({"model": M, "messages": MSG, "max_tokens": "5"}, "max_tokens")
    assert e.message == "max_tokens must be an integer >= 1, got '5'"
    e = refused({"model": M, "messages": MSG, "max_tokens": 0}, "max_tokens")
    assert e.message == "max_tokens must be an integer >= 1, got 0"


ANY = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True, allow_infinity=True),
                st.text(max_size=8), st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=3),
                                                                                          st.integers(), max_size=2))


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(["temperature", "top_p", "top_k", "seed"]), ANY, max_size=4))
def test_any_sampling_values_are_taken_or_refused_naming_the_parameter(kw):
    """Fuzzed sampling fields: a ChatRequest whose Sampling holds what was sent, or a
    400 naming one of them; nothing else is raised."""
    try:
        r = req(**kw)
    except ApiError as e:
        assert e.status == 400 and e.param in kw, (kw, e.message)
        return
    t = kw.get("temperature")
    if t in (None, 0):
        assert r.sampling is None
    else:
        assert r.sampling.temperature == t and r.sampling.seed == kw.get("seed")
