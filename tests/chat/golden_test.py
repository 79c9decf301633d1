#!/usr/bin/env python3
"""The chat-template golden test (issue 41): every template in tests/data/chat-templates/ (Qwen2.5,
Qwen3 and its April-2025 original, Qwen3-2507 Instruct and Thinking, Qwen3-Coder, Qwen3.5 and its
small-model variant, Qwen3.6; the llama.cpp copies with CRLF line ends too) rendered with each of the
conversations below by Sextant's engine (daemon/chat/chat_template.h, through render_template) and
by Python jinja2 set up as Hugging Face transformers' apply_chat_template sets it up
(ImmutableSandboxedEnvironment with trim_blocks, lstrip_blocks and loop controls, tojson =
json.dumps(ensure_ascii=False), raise_exception, strftime_now): byte-identical output wherever jinja2
renders, and a failure wherever the template raises (raise_exception: no user query, system not
first, unknown role). Where jinja2 itself stops on the values with a Python TypeError (None where the
template tests `in`, a list of content parts added to a string, OpenAI-style string arguments
iterated by the XML-tool templates) minja may render instead: such cases are counted apart and
printed; the server never meets them (it parses string arguments and turns null content and text
parts into strings before rendering). With --openai, tool-call arguments given as JSON strings are parsed first on
both sides, as the server does: then every template renders them.
Usage: golden_test.py RENDER_TEMPLATE TEMPLATE_DIR. Needs python3-jinja2 (Debian). Prints
"N passed, N failed"."""
import copy
import json
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

RENDER, TEMPLATES = sys.argv[1], Path(sys.argv[2])


def _raise(message):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def make_env():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather for a city.",
    "parameters": {"type": "object", "properties": {
        "location": {"type": "string", "description": "City name, e.g. Paris"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["location"]}}}
SEARCH = {"type": "function", "function": {
    "name": "search", "description": "Search the web. Returns <b>HTML</b> & \"quotes\".",
    "parameters": {"type": "object", "properties": {
        "query": {"type": "string"}, "limit": {"type": "integer", "minimum": 1, "default": 5},
        "filters": {"type": "array", "items": {"type": "string"}}}, "required": ["query"]}}}
BARE = {"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}}


def call(name, arguments, id_=None):
    c = {"type": "function", "function": {"name": name, "arguments": arguments}}
    if id_:
        c["id"] = id_
    return c


SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
CONVERSATIONS = {
    "single_user": [{"role": "user", "content": "Hello!"}],
    "system_and_user": [SYSTEM, {"role": "user", "content": "Hello!"}],
    "empty_system": [{"role": "system", "content": ""}, {"role": "user", "content": "Hi"}],
    "multi_turn": [{"role": "user", "content": "Hi! What is 2+2?"},
                   {"role": "assistant", "content": "2+2 = 4."},
                   {"role": "user", "content": "And 3+3?"}],
    "multi_turn_reasoning_field": [
        SYSTEM, {"role": "user", "content": "Hi! What is 2+2?"},
        {"role": "assistant", "content": "2+2 = 4.", "reasoning_content": "Simple arithmetic: 4."},
        {"role": "user", "content": "And 3+3?"},
        {"role": "assistant", "content": "6.", "reasoning_content": "3+3 is 6."},
        {"role": "user", "content": "Thanks."}],
    "multi_turn_think_in_content": [
        {"role": "user", "content": "Name a prime."},
        {"role": "assistant", "content": "<think>\nTwo is the smallest.\n</think>\n\n2"},
        {"role": "user", "content": "Another?"}],
    "empty_reasoning": [
        {"role": "user", "content": "Q1"},
        {"role": "assistant", "content": "A1", "reasoning_content": ""},
        {"role": "user", "content": "Q2"}],
    "non_ascii": [{"role": "system", "content": "Réponds en français, s'il te plaît. 你好 🌍"},
                  {"role": "user", "content": "Ça va? Ünïcödé — «quotes» and 日本語 and emoji 🚀🧪"}],
    "special_characters": [{"role": "user", "content": "<b>bold</b> & 'single' \"double\" \\ back\\slash\n"
                                                     "line two\ttab {{ not a template }} {% raw %}"}],
    "tool_loop_object_args": [
        SYSTEM, {"role": "user", "content": "What's the weather in Paris?"},
        {"role": "assistant", "content": "", "reasoning_content": "Call get_weather.",
         "tool_calls": [call("get_weather", {"location": "Paris", "unit": "celsius"}, "call_1")]},
        {"role": "tool", "tool_call_id": "call_1", "name": "get_weather",
         "content": "{\"temperature\": 18, \"condition\": \"sunny\"}"}],
    "tool_loop_string_args": [
        {"role": "user", "content": "What's the weather in Oslo?"},
        {"role": "assistant", "content": None,
         "tool_calls": [call("get_weather", "{\"location\": \"Oslo\"}", "call_9")]},
        {"role": "tool", "tool_call_id": "call_9", "content": "-3 C, snow"}],
    "tool_answer_after_result": [
        {"role": "user", "content": "Weather in Rome?"},
        {"role": "assistant", "content": "", "tool_calls": [call("get_weather", {"location": "Rome"})]},
        {"role": "tool", "content": "24 C"},
        {"role": "assistant", "content": "It is 24 °C in Rome."},
        {"role": "user", "content": "And tomorrow?"}],
    "parallel_calls_two_results": [
        {"role": "user", "content": "Weather in Paris and Berlin, and search news."},
        {"role": "assistant", "content": "Calling two tools.",
         "tool_calls": [call("get_weather", {"location": "Paris"}), call("search", {"query": "news", "limit": 3})]},
        {"role": "tool", "content": "18 C"},
        {"role": "tool", "content": "[\"headline one\", \"headline two\"]"}],
    "argument_types": [
        {"role": "user", "content": "Call f."},
        {"role": "assistant", "content": "Calling f now.", "tool_calls": [
            call("f", {"flag": True, "off": False, "n": 3, "neg": -7, "x": 0.5, "whole": 3.0, "tiny": 1e-07,
                       "big": 1.5e+16, "s": "é<b>&'\"", "none": None, "obj": {"k": [1, "ü", None]},
                       "list": [1, 2.5, "three", False]})]},
        {"role": "tool", "content": "f-ok"}],
    "tool_result_non_ascii": [
        {"role": "user", "content": "Search 東京"},
        {"role": "assistant", "content": "", "tool_calls": [call("search", {"query": "東京", "filters": ["天気"]})]},
        {"role": "tool", "content": "東京は晴れ ☀️"}],
    "system_with_tools": [SYSTEM, {"role": "user", "content": "What time is it?"}],
    "no_system_with_tools": [{"role": "user", "content": "What time is it?"}],
    "assistant_last": [{"role": "user", "content": "Finish this: The quick brown"},
                       {"role": "assistant", "content": "fox"}],
    "long_history": [m for i in range(6) for m in (
        {"role": "user", "content": f"Question {i}?"},
        {"role": "assistant", "content": f"Answer {i}.", "reasoning_content": f"Thinking {i}."})] +
        [{"role": "user", "content": "Last question?"}],
    "system_not_first": [{"role": "user", "content": "Hi"}, SYSTEM, {"role": "user", "content": "Again"}],
    "unknown_role": [{"role": "user", "content": "Hi"}, {"role": "narrator", "content": "Meanwhile..."}],
    "no_user": [SYSTEM, {"role": "assistant", "content": "Hello, how can I help?"}],
    "multimodal_parts": [{"role": "user", "content": [{"type": "text", "text": "Describe this."},
                                                      {"type": "text", "text": " Briefly."}]}],
}

# (conversation, tools, extra kwargs, add_generation_prompt)
CASES = []
for name in CONVERSATIONS:
    tools = None
    if name.startswith(("tool", "parallel", "argument", "system_with_tools", "no_system_with_tools")):
        tools = [WEATHER, SEARCH, BARE]
    CASES.append((name, tools, {}, True))
for name in ("multi_turn", "multi_turn_reasoning_field", "tool_loop_object_args", "long_history", "single_user"):
    CASES.append((name, [WEATHER] if name.startswith("tool") else None, {"enable_thinking": False}, True))
    CASES.append((name, [WEATHER] if name.startswith("tool") else None, {"enable_thinking": True}, True))
for name in ("multi_turn_reasoning_field", "long_history"):
    CASES.append((name, None, {"preserve_thinking": True}, True))
for name in ("multi_turn", "system_and_user", "assistant_last"):
    CASES.append((name, None, {}, False))
SPECIAL = {"bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "unk_token": None}


def openai_args(messages):
    """Tool-call arguments given as JSON strings, parsed (what the server does before rendering)."""
    out = copy.deepcopy(messages)
    for m in out:
        for c in m.get("tool_calls") or []:
            if isinstance(c["function"].get("arguments"), str):
                c["function"]["arguments"] = json.loads(c["function"]["arguments"])
    return out


def main():
    env = make_env()
    templates = sorted(TEMPLATES.glob("*/chat_template*.jinja"))
    assert templates, f"no templates under {TEMPLATES}"
    passed = failed = identical = both_fail = lenient = 0
    for path in templates:
        src = path.read_text(encoding="utf-8")
        template = env.from_string(src)
        mine_ok = 0
        for name, tools, kwargs, gen in CASES:
            for openai in (False, True):
                if openai and "string_args" not in name:
                    continue
                messages = openai_args(CONVERSATIONS[name]) if openai else CONVERSATIONS[name]
                context = dict(messages=messages, add_generation_prompt=gen, **SPECIAL, **kwargs)
                if tools is not None:
                    context["tools"] = tools
                raised = False
                try:
                    want = template.render(**context)
                except jinja2.exceptions.TemplateError as e:  # the template's raise_exception
                    want, why, raised = None, f"{type(e).__name__}: {e}", True
                except Exception as e:  # noqa: BLE001 - Python refusing the values (TypeError ...)
                    want, why = None, f"{type(e).__name__}: {e}"
                ctx = dict(context, messages=CONVERSATIONS[name]) if openai else context
                p = subprocess.run([RENDER, str(path)] + (["--openai"] if openai else []),
                                   input=json.dumps(ctx, ensure_ascii=False).encode(), capture_output=True, timeout=60)
                got = p.stdout.decode("utf-8") if p.returncode == 0 else None
                label = f"{path.parent.name}/{path.name} [{name}{' ' + json.dumps(kwargs) if kwargs else ''}" \
                        f"{'' if gen else ' no generation prompt'}{' openai' if openai else ''}]"
                if p.returncode not in (0, 3):
                    failed += 1
                    print(f"FAIL {label}: render_template exited {p.returncode}: {p.stderr.decode()[:300]}")
                elif got == want:
                    passed += 1
                    mine_ok += 1
                    if want is None:
                        both_fail += 1
                    else:
                        identical += 1
                elif want is None and not raised:
                    lenient += 1
                    print(f"  lenient {label}: jinja2 stops on the values ({why}); Sextant renders {len(got)} bytes")
                else:
                    failed += 1
                    if want is None:
                        print(f"FAIL {label}: the template raises ({why}) but Sextant rendered {len(got)} bytes")
                    elif got is None:
                        print(f"FAIL {label}: Sextant fails ({p.stderr.decode().strip()[:300]}), jinja2 renders")
                    else:
                        i = next((i for i in range(min(len(want), len(got))) if want[i] != got[i]),
                                 min(len(want), len(got)))
                        print(f"FAIL {label}: differs at byte {i}:\n  jinja2:  {want[max(0, i - 60):i + 60]!r}\n"
                              f"  sextant: {got[max(0, i - 60):i + 60]!r}")
        print(f"  {path.parent.name}/{path.name}: {mine_ok} cases as jinja2")
    print(f"{len(templates)} templates x {len(CASES)} cases (+ the OpenAI string-argument forms): "
          f"{identical} renderings byte-identical, {both_fail} failing in both, {lenient} rendered where jinja2 stops on "
          f"the values; {len(CONVERSATIONS)} conversations")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
