#!/usr/bin/env python3
"""Tool calls through `sextant serve` with the official openai client (issue 41 items 2 and 3): a
round trip (tools -> tool_calls -> a tool message -> the answer), whole and streamed, for a hermes
template (Qwen3's: <tool_call>{"name", "arguments"}</tool_call>) and an XML one (Qwen3-Coder's:
<function=NAME><parameter=K>V</parameter>); thinking as reasoning_content beside the calls, a call
written inside the thinking kept; a malformed call returned as content and counted in /metrics.

The model is a small random-weight Qwen3 that `sextant make-model` writes with the Qwen2.5 tokenizer
and a context long enough for the templates' tool prompts (the bundled model holds 512 tokens), made
to write a call by the test hook SEXTANT_TEST_HOOKS=1: a request's
`sextant_test_script` is the text its answer's tokens are taken from (the forward runs for each, the
tokens go through the engine's detokenizer and stop ids, the daemon's reasoning split and tool-call
parser as any answer does). Usage: tool_calls_test.py SEXTANT_BINARY TEMPLATES_DIR TOKENIZER_JSON."""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import daemon_harness  # noqa: E402
from daemon_harness import Daemon, case, post  # noqa: E402

import openai  # the official client, from the test-only virtual environment

SEXTANT, TEMPLATES, TOKENIZER = sys.argv[1], sys.argv[2], sys.argv[3]
NAME = "tools-qwen3"
MODEL = daemon_harness.make_qwen3(SEXTANT, NAME, TOKENIZER, "--layers", "1", "--hidden", "64", "--heads", "2",
                                  "--kv-heads", "1", "--head-dim", "32", "--ffn", "128")
TMP = os.path.dirname(MODEL)
HERMES = os.path.join(TEMPLATES, "qwen3", "chat_template.jinja")
XML = os.path.join(TEMPLATES, "qwen3-coder", "chat_template.jinja")

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
                                                    "metric": {"type": "boolean"}},
                   "required": ["city"]}}},
         {"type": "function", "function": {"name": "search", "parameters": {
             "type": "object", "properties": {"q": {"type": "string"}}}}}]
USER = [{"role": "user", "content": "What is the weather in Paris, in Celsius, for 3 days?"}]


def start(template):
    return Daemon(SEXTANT, MODEL, "--chat-template", template, max_model_len=2048,
                  env={**os.environ, "SEXTANT_TEST_HOOKS": "1"})


def client_of(d):
    return openai.OpenAI(base_url=d.base + "/v1", api_key="unused", max_retries=0)


def ask(client, messages, script, stream=False, **extra):
    return client.chat.completions.create(model=NAME, messages=messages, tools=TOOLS, temperature=0, max_tokens=200,
                                          stream=stream, extra_body={"sextant_test_script": script, **extra})


def collect(stream):
    """A stream's content, reasoning, calls (by index: id, name, argument fragments) and finish."""
    out = {"content": "", "reasoning": "", "calls": {}, "finish": None, "chunks": 0}
    for chunk in stream:
        out["chunks"] += 1
        for ch in chunk.choices:
            d = ch.delta
            # The choice's first chunk carries the role, whatever the parser held back before it.
            assert (d.role == "assistant") == (out["chunks"] == 1), (out["chunks"], d)
            out["content"] += d.content or ""
            out["reasoning"] += getattr(d, "reasoning_content", None) or ""
            for tc in d.tool_calls or []:
                call = out["calls"].setdefault(tc.index, {"id": None, "name": None, "fragments": []})
                if tc.id:
                    assert call["id"] is None, "a call's id came twice"
                    call["id"] = tc.id
                if tc.function and tc.function.name:
                    assert call["name"] is None and not call["fragments"], "the name must come first, once"
                    call["name"] = tc.function.name
                if tc.function and tc.function.arguments:
                    assert call["name"] is not None, "arguments before the name"
                    call["fragments"].append(tc.function.arguments)
            if ch.finish_reason:
                out["finish"] = ch.finish_reason
    return out


def metric(d, name):
    status, body = daemon_harness.get(d.port, "/metrics")
    assert status == 200
    for line in body.splitlines():
        if line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in /metrics")


def round_trip(template, script_call, want_args, label):
    d = start(template)
    try:
        assert "SEXTANT_TEST_HOOKS=1" in d.text()
        client = client_of(d)
        # Whole.
        r = ask(client, USER, script_call + "<|im_end|>")
        ch = r.choices[0]
        assert ch.finish_reason == "tool_calls", ch
        assert ch.message.content is None, ch.message
        assert len(ch.message.tool_calls) == 1, ch.message
        call = ch.message.tool_calls[0]
        assert call.type == "function" and call.id.startswith("call_"), call
        assert call.function.name == "get_weather", call
        assert json.loads(call.function.arguments) == want_args, call.function.arguments
        # Streamed: the name first, then the arguments in fragments; no tag in content.
        s = collect(ask(client, USER, script_call + "<|im_end|>", stream=True))
        assert s["finish"] == "tool_calls", s
        assert s["content"].strip() == "" and "<tool_call" not in s["content"], s
        assert list(s["calls"]) == [0], s
        sc = s["calls"][0]
        assert sc["name"] == "get_weather" and sc["id"].startswith("call_"), s
        assert len(sc["fragments"]) >= 2, f"the arguments came in one piece: {sc['fragments']}"
        assert json.loads("".join(sc["fragments"])) == want_args, sc
        # The tool's answer goes back; the model answers in words.
        messages = USER + [ch.message.model_dump(exclude_none=True),
                           {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"}]
        status, body = post(d.port, "/apply-template", {"model": NAME, "messages": messages, "tools": TOOLS})
        assert status == 200, body
        prompt = json.loads(body)["prompt"]
        assert "<tool_response>\nsunny, 21 C\n</tool_response>" in prompt, prompt
        assert "get_weather" in prompt.split("<|im_start|>assistant")[1], prompt
        answer = "It is sunny in Paris."
        final = ask(client, messages, answer + "<|im_end|>")
        assert final.choices[0].finish_reason == "stop", final
        assert final.choices[0].message.content == answer, final
        assert not final.choices[0].message.tool_calls, final
        fs = collect(ask(client, messages, answer + "<|im_end|>", stream=True))
        assert fs["content"] == answer and fs["finish"] == "stop" and not fs["calls"], fs
        assert metric(d, "sextant_tool_calls_total") == 2
        print(f"  {label}: {call.function.name}({call.function.arguments}) whole; streamed as name + "
              f"{len(sc['fragments'])} argument fragments; the tool's answer rendered back; the reply '{answer}'")
    finally:
        d.stop()


@case
def a_hermes_template_round_trip():
    round_trip(HERMES, '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n</tool_call>',
               {"city": "Paris", "days": 3}, "hermes (Qwen3's template)")


@case
def an_xml_template_round_trip():
    round_trip(XML, "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n"
                    "</parameter>\n<parameter=metric>\nTrue\n</parameter>\n</function>\n</tool_call>",
               {"city": "Paris", "days": 3, "metric": True}, "XML (Qwen3-Coder's template)")


@case
def thinking_beside_calls_and_a_call_inside_thinking():
    d = start(HERMES)
    try:
        client = client_of(d)
        call = '<tool_call>\n{"name": "search", "arguments": {"q": "Paris weather"}}\n</tool_call>'
        script = "<think>\nThe user wants the weather.\n</think>\n\n" + call + "<|im_end|>"
        s = collect(ask(client, USER, script, stream=True))
        assert s["reasoning"].strip() == "The user wants the weather.", s
        assert s["content"].strip() == "", s
        assert s["calls"][0]["name"] == "search" and s["finish"] == "tool_calls", s
        r = ask(client, USER, script)
        assert getattr(r.choices[0].message, "reasoning_content", None) == "The user wants the weather.", r
        assert r.choices[0].message.tool_calls[0].function.name == "search", r
        # A call written while still thinking (no </think>) is a call, not lost in the reasoning.
        inside = "<think>\nI will look it up. " + call + "<|im_end|>"
        r = ask(client, USER, inside)
        m = r.choices[0].message
        assert [c.function.name for c in m.tool_calls] == ["search"], m
        assert "<tool_call>" not in (getattr(m, "reasoning_content", "") or ""), m
        assert r.choices[0].finish_reason == "tool_calls", r
        s = collect(ask(client, USER, inside, stream=True))
        assert s["calls"][0]["name"] == "search" and "<tool_call" not in s["reasoning"], s
        print("  reasoning_content beside a call, whole and streamed; a call inside unclosed thinking kept")
    finally:
        d.stop()


@case
def a_malformed_call_is_content_and_counted():
    d = start(HERMES)
    try:
        client = client_of(d)
        bad = '<tool_call>\n{"name": "get_weather", "arguments": {"city": Paris}}\n</tool_call>'
        unknown = '<tool_call>\n{"name": "format_disk", "arguments": {}}\n</tool_call>'
        before = metric(d, "sextant_tool_call_parse_failures_total")
        for script in (bad, unknown):
            r = ask(client, USER, script + "<|im_end|>")
            assert r.choices[0].message.content == script, r
            assert not r.choices[0].message.tool_calls and r.choices[0].finish_reason == "stop", r
        s = collect(ask(client, USER, unknown + "<|im_end|>", stream=True))
        assert s["content"] == unknown and not s["calls"] and s["finish"] == "stop", s
        assert metric(d, "sextant_tool_call_parse_failures_total") == before + 3
        # tool_choice none: no tools shown, nothing parsed.
        r = ask(client, USER, unknown.replace("format_disk", "search") + "<|im_end|>", tool_choice="none")
        assert r.choices[0].message.content.startswith("<tool_call>"), r
        # parallel_tool_calls false: the first call only.
        two = ('<tool_call>\n{"name": "search", "arguments": {"q": "a"}}\n</tool_call>\n'
               '<tool_call>\n{"name": "search", "arguments": {"q": "b"}}\n</tool_call>')
        r = ask(client, USER, two + "<|im_end|>")
        assert [json.loads(c.function.arguments)["q"] for c in r.choices[0].message.tool_calls] == ["a", "b"], r
        r = ask(client, USER, two + "<|im_end|>", parallel_tool_calls=False)
        assert [json.loads(c.function.arguments)["q"] for c in r.choices[0].message.tool_calls] == ["a"], r
        print("  malformed JSON and an unknown function: content, counted; tool_choice none; parallel_tool_calls")
    finally:
        d.stop()


@case
def without_hooks_the_script_is_refused():
    d = Daemon(SEXTANT, MODEL)
    try:
        status, body = post(d.port, "/v1/chat/completions", {"model": NAME, "messages": USER,
                                                             "sextant_test_script": "x"})
        assert status == 400 and "unknown field 'sextant_test_script'" in body.decode(), body
        # make-model embeds the tokenizer's template (Qwen2.5's, hermes): tools are shown, the answer parsed.
        assert "chat template: the model's own" in d.text(), d.text()[-2000:]
        status, body = post(d.port, "/v1/chat/completions", {"model": NAME, "messages": USER, "tools": TOOLS,
                                                             "max_tokens": 2})
        assert status == 200, body
    finally:
        d.stop()


@case
def a_template_that_shows_no_calls_refuses_tools():
    path = os.path.join(TMP, "plain.jinja")
    with open(path, "w") as f:
        f.write("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                "<|im_start|>assistant\n")
    d = Daemon(SEXTANT, MODEL, "--chat-template", path)
    try:
        status, body = post(d.port, "/v1/chat/completions", {"model": NAME, "messages": USER, "tools": TOOLS})
        assert status == 400, body
        err = json.loads(body)["error"]
        assert err["param"] == "tools" and "shows no tool calls" in err["message"], err
    finally:
        d.stop()


daemon_harness.run_cases("TOOL_CALLS_ONLY")
daemon_harness.summary_exit()
