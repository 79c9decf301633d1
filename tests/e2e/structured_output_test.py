#!/usr/bin/env python3
"""Structured output through `sextant serve` (issue 41 item 4), with the official openai client on a
random-weight model (`sextant make-model`, lively weights: left free, it writes noise): every answer
to a response_format json_schema request parses and validates against its schema (the `jsonschema`
package), 200 requests over 20 schemas, 16 at a time, sampled at temperature 1 with their own seeds;
vLLM's structured_outputs (json, regex, choice, grammar, json_object) likewise; tool_choice
"required" and named give a call of a listed tool whose arguments validate against its parameters,
in the hermes and the XML syntax; a format that cannot be compiled, or that matches no text, is a 400
naming the field. Compiles (issue 53) run on threads of their own within limits.grammar_compile_
timeout_ms: four compile bombs leave a plain completion its sub-second answer; a compile whose client
left stops; a full compile queue is a 429.
Usage: structured_output_test.py SEXTANT_BINARY TEMPLATES_DIR TOKENIZER_JSON."""
import concurrent.futures
import json
import os
import re
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import daemon_harness  # noqa: E402
from daemon_harness import Daemon, case, get, post  # noqa: E402

import jsonschema  # noqa: E402
import openai  # noqa: E402

SEXTANT, TEMPLATES, TOKENIZER = sys.argv[1], sys.argv[2], sys.argv[3]
NAME = "structured-qwen3"
MODEL = daemon_harness.make_qwen3(SEXTANT, NAME, TOKENIZER, "--layers", "2", "--hidden", "128", "--heads", "4",
                                  "--kv-heads", "2", "--head-dim", "32", "--ffn", "256", "--init-std", "0.5")

S = {"type": "string", "maxLength": 12}
SCHEMAS = [
    {"type": "object", "properties": {"name": S, "age": {"type": "integer", "minimum": 0, "maximum": 120}},
     "required": ["name", "age"], "additionalProperties": False},
    {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"], "additionalProperties": False},
    {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}}, "required": ["color"],
     "additionalProperties": False},
    {"type": "array", "items": {"type": "integer", "minimum": -5, "maximum": 5}, "minItems": 1, "maxItems": 4},
    {"type": "object", "properties": {"tags": {"type": "array", "items": S, "maxItems": 3}}, "required": ["tags"],
     "additionalProperties": False},
    {"type": "object", "properties": {"point": {"type": "object", "properties": {
        "x": {"type": "integer", "minimum": 0, "maximum": 99}, "y": {"type": "integer", "minimum": 0, "maximum": 99}},
        "required": ["x", "y"], "additionalProperties": False}}, "required": ["point"], "additionalProperties": False},
    {"type": "object", "properties": {"id": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"}}, "required": ["id"],
     "additionalProperties": False},
    {"type": "object", "properties": {"kind": {"const": "event"}, "n": {"type": "integer", "minimum": 1, "maximum": 9}},
     "required": ["kind", "n"], "additionalProperties": False},
    {"type": "object", "properties": {"v": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 9}, {"type": "null"}]}},
     "required": ["v"], "additionalProperties": False},
    {"type": "object", "properties": {"email": {"type": "string", "pattern": "^[a-z]{1,8}@[a-z]{1,8}\\.(com|org)$"}},
     "required": ["email"], "additionalProperties": False},
    {"type": "object", "properties": {"a": S, "b": {"type": "boolean"}, "c": {"type": "integer", "minimum": 0, "maximum": 3}},
     "required": ["a"], "additionalProperties": False},
    {"type": "object", "properties": {"items": {"type": "array", "maxItems": 2, "items": {
        "type": "object", "properties": {"sku": S, "qty": {"type": "integer", "minimum": 1, "maximum": 50}},
        "required": ["sku", "qty"], "additionalProperties": False}}}, "required": ["items"], "additionalProperties": False},
    {"type": "string", "enum": ["yes", "no", "maybe"]},
    {"type": "integer", "minimum": 1000, "maximum": 9999},
    {"type": "object", "properties": {"level": {"type": "string", "enum": ["low", "mid", "high"]},
                                      "score": {"type": "integer", "minimum": 0, "maximum": 100}},
     "required": ["level", "score"], "additionalProperties": False},
    {"type": "object", "properties": {"date": {"type": "string", "pattern": "^20[0-9]{2}-[01][0-9]-[0-3][0-9]$"}},
     "required": ["date"], "additionalProperties": False},
    {"type": "object", "properties": {"matrix": {"type": "array", "maxItems": 2, "items": {
        "type": "array", "maxItems": 2, "items": {"type": "integer", "minimum": 0, "maximum": 9}}}},
     "required": ["matrix"], "additionalProperties": False},
    {"type": "object", "properties": {"user": {"type": "object", "properties": {"name": S, "admin": {"type": "boolean"}},
                                               "required": ["name", "admin"], "additionalProperties": False},
                                      "active": {"type": "boolean"}},
     "required": ["user", "active"], "additionalProperties": False},
    {"type": "object", "properties": {"op": {"oneOf": [{"const": "add"}, {"const": "remove"}]},
                                      "key": {"type": "string", "minLength": 1, "maxLength": 6}},
     "required": ["op", "key"], "additionalProperties": False},
    {"type": "object", "properties": {"flags": {"type": "array", "items": {"type": "boolean"}, "minItems": 2,
                                                "maxItems": 2}, "note": {"type": ["string", "null"], "maxLength": 8}},
     "required": ["flags", "note"], "additionalProperties": False},
]
PER_SCHEMA = 10
MESSAGES = [{"role": "user", "content": "Answer in JSON."}]


def start(*extra):
    return Daemon(SEXTANT, MODEL, *extra, max_model_len=4096, max_num_seqs=16)


def client_of(d):
    return openai.OpenAI(base_url=d.base + "/v1", api_key="unused", max_retries=0, timeout=600)


@case
def json_schema_answers_parse_and_validate_200_requests_20_schemas():
    assert len(SCHEMAS) == 20
    for s in SCHEMAS:
        jsonschema.Draft202012Validator.check_schema(s)
    d = start()
    try:
        client = client_of(d)

        def one(job):
            i, k = job
            r = client.chat.completions.create(
                model=NAME, messages=MESSAGES, temperature=1.0, seed=1000 * i + k, max_tokens=300,
                response_format={"type": "json_schema", "json_schema": {"name": f"s{i}", "schema": SCHEMAS[i],
                                                                        "strict": True}})
            return i, r.choices[0].message.content, r.choices[0].finish_reason

        jobs = [(i, k) for i in range(len(SCHEMAS)) for k in range(PER_SCHEMA)]
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            results = list(pool.map(one, jobs))
        distinct = set()
        for i, text, finish in results:
            assert finish == "stop", (i, text, finish)
            try:
                value = json.loads(text)
            except ValueError as e:
                raise AssertionError(f"schema {i}: {text!r} does not parse: {e}") from None
            jsonschema.validate(value, SCHEMAS[i])
            distinct.add(text)
        # Not one answer written 200 times: the constraint leaves the sampling free within the schema.
        assert len(distinct) > len(SCHEMAS) * 2, len(distinct)
        print(f"  {len(results)} answers over {len(SCHEMAS)} schemas, 16 at a time: every one parses and validates "
              f"({len(distinct)} distinct); e.g. {results[0][1]}")
    finally:
        d.stop()


@case
def structured_outputs_regex_choice_grammar_and_json_object():
    d = start()
    try:
        client = client_of(d)

        def ask(so, seed, **kw):
            r = client.chat.completions.create(model=NAME, messages=MESSAGES, temperature=1.0, seed=seed,
                                               max_tokens=kw.get("max_tokens", 64), extra_body={"structured_outputs": so})
            return r.choices[0].message.content, r.choices[0].finish_reason

        for seed in range(5):
            text, finish = ask({"regex": "[0-9]{3}-[a-z]{2,4}"}, seed)
            assert re.fullmatch("[0-9]{3}-[a-z]{2,4}", text) and finish == "stop", text
            choices = ["alpha", "beta", "gamma delta", 'say "hi"', "line\nbreak\\", "ünïcode"]
            text, _ = ask({"choice": choices}, seed)
            assert text in choices, text
            text, _ = ask({"grammar": 'root ::= "(" num ("+" num)* ")"\nnum ::= [1-9]'}, seed)
            assert re.fullmatch(r"\([1-9](\+[1-9])*\)", text), text
            text, _ = ask({"json": json.dumps(SCHEMAS[0])}, seed)
            jsonschema.validate(json.loads(text), SCHEMAS[0])
        # Any JSON object: a random model may write one past max_tokens (an object's keys have no end);
        # it is an object from its first byte, and one that stopped is whole.
        stopped = 0
        for seed in range(3):
            r = client.chat.completions.create(model=NAME, messages=MESSAGES, temperature=1.0, seed=seed, max_tokens=100,
                                               response_format={"type": "json_object"})
            text = r.choices[0].message.content
            assert text.startswith("{"), text
            if r.choices[0].finish_reason == "stop":
                assert isinstance(json.loads(text), dict), text
                stopped += 1
        # The completions endpoint takes them too.
        r = client.completions.create(model=NAME, prompt="x", max_tokens=16, temperature=1.0, seed=3,
                                      extra_body={"structured_outputs": {"regex": "[a-c]{5}"}})
        assert re.fullmatch("[a-c]{5}", r.choices[0].text), r
        print(f"  regex, choice, grammar, json (as text) held on 5 seeds each; json_object: an object each time, {stopped} of 3 whole within 100 tokens")
    finally:
        d.stop()


TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                     "days": {"type": "integer", "minimum": 1, "maximum": 7}},
    "required": ["city", "days"], "additionalProperties": False}}},
         {"type": "function", "function": {"name": "search", "parameters": {
             "type": "object", "properties": {"q": {"type": "string", "maxLength": 16}}, "required": ["q"],
             "additionalProperties": False}}}]


def check_calls(client, label):
    names = set()
    for seed in range(6):
        for choice in ("required", {"type": "function", "function": {"name": "search"}}):
            r = client.chat.completions.create(model=NAME, messages=MESSAGES, temperature=1.0, seed=seed,
                                               max_tokens=300, tools=TOOLS, tool_choice=choice)
            ch = r.choices[0]
            assert ch.finish_reason == "tool_calls" and len(ch.message.tool_calls) == 1, ch
            call = ch.message.tool_calls[0]
            if isinstance(choice, dict):
                assert call.function.name == "search", call
            tool = next(t for t in TOOLS if t["function"]["name"] == call.function.name)
            jsonschema.validate(json.loads(call.function.arguments), tool["function"]["parameters"])
            names.add(call.function.name)
    # Streamed: the same call arrives as deltas.
    s = client.chat.completions.create(model=NAME, messages=MESSAGES, temperature=1.0, seed=9, max_tokens=300,
                                       tools=TOOLS, tool_choice="required", stream=True)
    args, finish = "", None
    for chunk in s:
        for c in chunk.choices:
            for tc in c.delta.tool_calls or []:
                args += tc.function.arguments or ""
            finish = c.finish_reason or finish
    assert finish == "tool_calls" and isinstance(json.loads(args), dict), (args, finish)
    print(f"  {label}: tool_choice required and named: 12 calls valid against their tool's schema "
          f"(functions {sorted(names)}), one streamed")


@case
def tool_choice_required_and_named_hold_calls_to_their_schemas_hermes():
    d = start()  # the model's own template: Qwen2.5's, hermes
    try:
        check_calls(client_of(d), "hermes (Qwen2.5's template)")
    finally:
        d.stop()


@case
def tool_choice_required_and_named_hold_calls_to_their_schemas_xml():
    d = start("--chat-template", os.path.join(TEMPLATES, "qwen3-coder", "chat_template.jinja"))
    try:
        check_calls(client_of(d), "XML (Qwen3-Coder's template)")
    finally:
        d.stop()


@case
def a_template_that_opens_thinking_gets_the_format_in_content():
    # Qwen3.5's template leaves the prompt inside <think>: the format begins after "</think>", so the
    # answer is content, its (empty) thinking reasoning_content; a forced call likewise.
    d = start("--chat-template", os.path.join(TEMPLATES, "qwen3.5", "chat_template.jinja"))
    try:
        client = client_of(d)
        for seed in range(3):
            r = client.chat.completions.create(
                model=NAME, messages=MESSAGES, temperature=1.0, seed=seed, max_tokens=300,
                response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": SCHEMAS[0]}})
            m = r.choices[0].message
            jsonschema.validate(json.loads(m.content), SCHEMAS[0])
            assert (getattr(m, "reasoning_content", None) or "") == "", m
        r = client.chat.completions.create(model=NAME, messages=MESSAGES, temperature=1.0, seed=4, max_tokens=300,
                                           tools=TOOLS, tool_choice="required")
        call = r.choices[0].message.tool_calls[0]
        tool = next(t for t in TOOLS if t["function"]["name"] == call.function.name)
        jsonschema.validate(json.loads(call.function.arguments), tool["function"]["parameters"])
        print(f"  Qwen3.5's template (prompt in <think>): json_schema answers in content, e.g. {m.content}; "
              f"a required call {call.function.name}({call.function.arguments})")
    finally:
        d.stop()


@case
def a_format_that_cannot_be_compiled_is_a_400_naming_it():
    d = start()
    try:
        def err(body):
            status, text = post(d.port, "/v1/chat/completions", {"model": NAME, "messages": MESSAGES, **body})
            assert status == 400, (status, text)
            return json.loads(text)["error"]

        e = err({"response_format": {"type": "json_schema", "json_schema": {"schema": {"$ref": "#/$defs/missing"}}}})
        assert e["param"] == "response_format.json_schema.schema" and "missing" in e["message"], e
        assert ".cc:" not in e["message"], e
        e = err({"structured_outputs": {"regex": "[a-"}})
        assert e["param"] == "structured_outputs.regex" and "Unclosed" in e["message"], e
        e = err({"structured_outputs": {"grammar": "root ::= undefined_rule"}})
        assert e["param"] == "structured_outputs.grammar" and "undefined_rule" in e["message"], e
        e = err({"structured_outputs": {"regex": "a", "choice": ["b"]}})
        assert e["param"] == "structured_outputs" and "exactly one" in e["message"], e
        big = {"type": "object", "properties": {f"p{i}": {"type": "string", "description": "x" * 100} for i in range(700)}}
        e = err({"response_format": {"type": "json_schema", "json_schema": {"schema": big}}})
        assert e["param"] == "response_format.json_schema.schema" and "at most 65536" in e["message"], e
        e = err({"response_format": {"type": "xml"}})
        assert e["param"] == "response_format.type", e
        print("  a dangling $ref, a bad regex, an undefined rule, two formats, a 70 KB schema: 400s naming the field")
    finally:
        d.stop()


def bomb(k, rules=1400):
    """An EBNF grammar (37 KB) whose compile takes minutes on a 151k vocabulary (every state's mask
    walks each token through a chain of `rules` rules that almost any byte continues); `k` makes each
    one different (xgrammar's cache would share one)."""
    lines = ["root ::= r0"]
    for i in range(rules):
        c = chr(97 + (i + k) % 26)
        lines.append(f"r{i} ::= [^{c}]* r{i + 1} | [{c}]")
    lines.append(f'r{rules} ::= "x{k}"')
    return "\n".join(lines)


def leave_after(d, body, seconds):
    """Sends a chat request and closes the connection after `seconds` without reading the answer."""
    import socket
    payload = json.dumps(body).encode()
    s = socket.create_connection(("127.0.0.1", d.port))
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: " + str(len(payload)).encode() + b"\r\n\r\n" + payload)
    time.sleep(seconds)
    s.close()


def plain_completion(d):
    """A 4-token completion without a format: its latency in seconds."""
    t0 = time.time()
    status, text = post(d.port, "/v1/completions", {"model": NAME, "prompt": "hello", "max_tokens": 4,
                                                     "temperature": 0, "ignore_eos": True}, timeout=120)
    assert status == 200, (status, text)
    return time.time() - t0


@case
def four_compile_bombs_beside_a_plain_completion():
    # Issue 53 item 5: four compiles that would take minutes held libuv's four pool threads, which
    # every request's tokenization needs: an unrelated 4-token completion waited for 112 s. They run
    # on threads of their own now, stop at limits.grammar_compile_timeout_ms (a 400 naming the
    # field), and stop when their client leaves.
    d = start("--set", "limits.grammar_compile_timeout_ms=3000")
    try:
        plain_completion(d)  # warm
        answers = {}

        def waiting(k):
            t0 = time.time()
            answers[k] = (*post(d.port, "/v1/chat/completions", {
                "model": NAME, "messages": MESSAGES, "max_tokens": 8,
                "structured_outputs": {"grammar": bomb(k)}}, timeout=120), time.time() - t0)

        threads = [threading.Thread(target=waiting, args=(k,)) for k in (0, 1)]
        threads += [threading.Thread(target=leave_after, args=(d, {
            "model": NAME, "messages": MESSAGES, "max_tokens": 8, "structured_outputs": {"grammar": bomb(k)}}, 1.0))
            for k in (2, 3)]
        for t in threads:
            t.start()
        time.sleep(0.5)  # the four are parsed, tokenized and compiling or queued
        latencies = [plain_completion(d) for _ in range(3)]
        status, health = get(d.port, "/health")
        for t in threads:
            t.join()
        assert max(latencies) < 1.0, latencies
        assert status == 200, (status, health)
        for k in (0, 1):
            code, text, took = answers[k]
            assert code == 400, (code, text)
            e = json.loads(text)["error"]
            assert e["param"] == "structured_outputs.grammar" and e["code"] == "grammar_compile_timeout", e
            assert "did not compile within 3000 ms" in e["message"], e
            assert "limits.grammar_compile_timeout_ms" in e["message"], e
            assert took < 12, took  # 3 s each on two threads; the left clients' compiles stopped at once
        # The bombs are gone: a small schema compiles and answers at once.
        t0 = time.time()
        r = client_of(d).chat.completions.create(
            model=NAME, messages=MESSAGES, max_tokens=20, temperature=0,
            response_format={"type": "json_schema", "json_schema": {"name": "n", "schema": SCHEMAS[13]}})
        jsonschema.validate(json.loads(r.choices[0].message.content), SCHEMAS[13])
        print(f"  4 bombs (2 waiting: 400 after {answers[0][2]:.1f} s and {answers[1][2]:.1f} s, 2 left): plain "
              f"4-token completions answered in {', '.join(f'{x:.2f}' for x in latencies)} s; /health ok; a small "
              f"schema after them in {time.time() - t0:.2f} s")
    finally:
        d.stop()


@case
def a_compile_whose_client_left_stops_and_a_full_compile_queue_is_a_429():
    d = start("--set", "limits.grammar_compile_threads=1", "--set", "limits.max_queued_grammar_compiles=1",
              "--set", "limits.grammar_compile_timeout_ms=120000")
    try:
        small = {"model": NAME, "messages": MESSAGES, "max_tokens": 20, "temperature": 0,
                 "response_format": {"type": "json_schema", "json_schema": {"schema": SCHEMAS[13]}}}
        # The only compile thread takes a bomb whose client leaves after 1 s: the compile stops, and
        # the small schema behind it waits about that long, not the 120 s budget.
        t0 = time.time()
        left = threading.Thread(target=leave_after, args=(d, {
            "model": NAME, "messages": MESSAGES, "structured_outputs": {"grammar": bomb(10)}}, 1.0))
        left.start()
        time.sleep(0.3)
        status, text = post(d.port, "/v1/chat/completions", small, timeout=120)
        waited = time.time() - t0
        left.join()
        assert status == 200, (status, text)
        assert waited < 10, waited
        # One bomb compiles, one waits: a third is refused at once, naming the limit.
        leavers = [threading.Thread(target=leave_after, args=(d, {
            "model": NAME, "messages": MESSAGES, "structured_outputs": {"grammar": bomb(k)}}, 3.0)) for k in (11, 12)]
        for t in leavers:
            t.start()
            time.sleep(0.3)
        t1 = time.time()
        status, text = post(d.port, "/v1/chat/completions", {
            "model": NAME, "messages": MESSAGES, "structured_outputs": {"grammar": bomb(13)}})
        refused_in = time.time() - t1
        assert status == 429, (status, text)
        e = json.loads(text)["error"]
        assert e["type"] == "rate_limit_error" and "limits.max_queued_grammar_compiles = 1" in e["message"], e
        assert refused_in < 1.0, refused_in
        # Plain requests never wait for them.
        latency = plain_completion(d)
        assert latency < 1.0, latency
        for t in leavers:
            t.join()
        # Both left: once the daemon has seen them go (a half-closed connection is found out by
        # probing it: 100 ms and more after its FIN), their compiles hold no place, and the small
        # schema is served again. Under the sanitizers the probe came after the next request did.
        t2 = time.time()
        while True:
            status, text = post(d.port, "/v1/chat/completions", small, timeout=120)
            if status != 429 or time.time() - t2 > 5:
                break
            time.sleep(0.1)
        drained_in = time.time() - t2
        assert status == 200 and drained_in < 10, (status, text, drained_in)
        # A shutdown while a bomb compiles stops it: its client gets a 503, and the daemon exits cleanly.
        shut = {}
        pending = threading.Thread(target=lambda: shut.update(answer=post(d.port, "/v1/chat/completions", {
            "model": NAME, "messages": MESSAGES, "structured_outputs": {"grammar": bomb(14)}}, timeout=120)))
        pending.start()
        time.sleep(0.5)
        t3 = time.time()
        rc, _ = d.stop()
        pending.join()
        assert rc == 0 and time.time() - t3 < 10, (rc, time.time() - t3)
        assert shut["answer"][0] == 503 and b"the server is stopping" in shut["answer"][1], shut
        print(f"  a left client's compile stopped (the next compile waited {waited:.1f} s, not 120); a third bomb "
              f"refused in {refused_in * 1000:.0f} ms with a 429; a plain completion beside them in {latency:.2f} s; "
              f"the small schema served again {drained_in:.2f} s after both left; "
              f"a shutdown during a compile took {time.time() - t3:.1f} s")
    finally:
        if d.proc.poll() is None:
            d.stop()


@case
def a_schema_that_matches_nothing_is_a_400_and_min_items_without_items_is_served():
    # Issue 53 item 7: each $ref leads only to the other; the answer was 200, empty, "stop".
    # Item 9: xgrammar's strict mode refused {"type": "array", "minItems": 1} as unsatisfiable.
    d = start()
    try:
        status, text = post(d.port, "/v1/chat/completions", {
            "model": NAME, "messages": MESSAGES, "response_format": {"type": "json_schema", "json_schema": {
                "name": "loop", "schema": {"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/b"},
                                                                          "b": {"$ref": "#/$defs/a"}}}}}})
        assert status == 400, (status, text)
        e = json.loads(text)["error"]
        assert e["param"] == "response_format.json_schema.schema" and "no text matches it" in e["message"], e
        client = client_of(d)
        stopped = 0
        for seed in range(3):
            r = client.chat.completions.create(
                model=NAME, messages=MESSAGES, temperature=1.0, seed=seed, max_tokens=200,
                response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": {
                    "type": "array", "minItems": 1}}})
            text = r.choices[0].message.content
            assert text.startswith("[") and not text.replace(" ", "").startswith("[]"), text
            if r.choices[0].finish_reason == "stop":
                value = json.loads(text)
                assert isinstance(value, list) and len(value) >= 1, text
                stopped += 1
        print(f"  a $ref cycle: 400 naming the field ({e['message'][:60]}...); minItems 1 without items: 3 answers "
              f"that start an array with an item, {stopped} whole")
    finally:
        d.stop()


daemon_harness.run_cases("STRUCTURED_ONLY")
daemon_harness.summary_exit()
