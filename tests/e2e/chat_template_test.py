#!/usr/bin/env python3
"""The model's own chat template in `sextant serve` (issue 41 item 1): /v1/chat/completions renders
the messages with the template the model file carries (the bundled model's GGUF
tokenizer.chat_template: Qwen2.5's), or with --chat-template FILE instead; the prompt the model sees
is checked through usage.prompt_tokens against /v1/completions given the text the template should
have produced. chat_template_kwargs reach the template (enable_thinking), an assistant's
reasoning_content too; a template's raise_exception is a 400 naming its message; a --chat-template
that does not parse stops the start naming the file, before any weight is read. vLLM's /tokenize and
/detokenize and llama.cpp's /apply-template answer in their shapes, agreeing with what a chat request
and a completion count. A template that thinks (names </think>) has its answers split: the thinking
(from the <think> the template opened, or one the answer opens) as reasoning_content, whole and in
stream deltas, exactly as the completion of the same prompt splits.
Usage: chat_template_test.py SEXTANT_BINARY MEMORISE_DIR. Prints "N passed, N failed"."""
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import daemon_harness  # noqa: E402
from daemon_harness import Daemon, case, post  # noqa: E402

SEXTANT, MEMORISE = sys.argv[1], sys.argv[2]
MODEL = os.path.join(MEMORISE, "memorise-q8_0.gguf")
NAME = "memorise-q8_0"
TMP = tempfile.mkdtemp(prefix="sx-chat-")

TEMPLATE = """{%- for m in messages -%}
{{ m.role }}: {{ m.content }}
{% if m.reasoning_content is defined %}(thought: {{ m.reasoning_content }})
{% endif %}
{%- if m.role == 'tool' and loop.first %}{{ raise_exception('a conversation cannot start with a tool message') }}{% endif %}
{%- endfor -%}
{%- if enable_thinking is defined and enable_thinking %}[think]{% endif -%}
{%- if add_generation_prompt %}assistant:{% endif -%}"""


def write_template(name, text):
    path = os.path.join(TMP, name)
    with open(path, "w") as f:
        f.write(text)
    return path


def prompt_tokens_of_text(port, text):
    status, body = post(port, "/v1/completions", {"model": NAME, "prompt": text, "max_tokens": 1, "temperature": 0})
    assert status == 200, body
    return json.loads(body)["usage"]["prompt_tokens"]


def chat(port, messages, **extra):
    return post(port, "/v1/chat/completions", {"model": NAME, "messages": messages, "max_tokens": 1,
                                               "temperature": 0, **extra})


@case
def the_models_own_template_renders_chat():
    d = Daemon(SEXTANT, MODEL)
    try:
        assert "chat template: the model's own" in d.text(), d.text()[-2000:]
        # Qwen2.5's template: its default system turn, the user turn, the generation prompt.
        want = ("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
                "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n")
        status, body = chat(d.port, [{"role": "user", "content": "hello"}])
        assert status == 200, body
        got = json.loads(body)["usage"]["prompt_tokens"]
        assert got == prompt_tokens_of_text(d.port, want), (got, want)
        print(f"  the bundled model's GGUF template: {got} prompt tokens, as Qwen2.5's rendering")
    finally:
        d.stop()


@case
def a_chat_template_file_replaces_it_with_kwargs_and_reasoning():
    path = write_template("custom.jinja", TEMPLATE)
    d = Daemon(SEXTANT, MODEL, "--chat-template", path)
    try:
        assert f"chat template: {path}" in d.text(), d.text()[-2000:]
        cases = [
            ([{"role": "user", "content": "hi"}], {}, "user: hi\nassistant:"),
            ([{"role": "user", "content": "hi"}], {"chat_template_kwargs": {"enable_thinking": True}},
             "user: hi\n[think]assistant:"),
            ([{"role": "user", "content": "q"}, {"role": "assistant", "content": "a", "reasoning_content": "r"},
              {"role": "user", "content": "q2"}], {}, "user: q\nassistant: a\n(thought: r)\nuser: q2\nassistant:"),
        ]
        for messages, extra, text in cases:
            status, body = chat(d.port, messages, **extra)
            assert status == 200, body
            got, want = json.loads(body)["usage"]["prompt_tokens"], prompt_tokens_of_text(d.port, text)
            assert got == want, (messages, extra, got, want)
        status, body = chat(d.port, [{"role": "tool", "content": "x"}])
        err = json.loads(body)["error"]
        assert status == 400 and "a conversation cannot start with a tool message" in err["message"], body
        assert err["param"] == "messages", body
        status, body = chat(d.port, [{"role": "user", "content": "hi"}], chat_template_kwargs=[1])
        assert status == 400 and json.loads(body)["error"]["param"] == "chat_template_kwargs", body
        print(f"  --chat-template: {len(cases)} renderings as written (kwargs, reasoning_content), raise_exception a "
              f"400: {err['message'][:80]}")
    finally:
        d.stop()


@case
def a_chat_template_that_does_not_parse_stops_the_start():
    path = write_template("broken.jinja", "{% for m in messages %}{{ m.content }")
    p = subprocess.run([SEXTANT, "serve", "--model", MODEL, "--port", "0", "--admin-socket",
                        os.path.join(TMP, "a.sock"), "--chat-template", path], capture_output=True, timeout=120)
    out = p.stdout.decode(errors="replace") + p.stderr.decode(errors="replace")
    assert p.returncode != 0 and path in out and "does not parse" in out, (p.returncode, out[-2000:])
    assert "phase load" not in out and "phase model check" not in out, out[-2000:]  # before any weight
    line = [x for x in out.splitlines() if "does not parse" in x][0]
    print(f"  exit {p.returncode}: {line[:160]}")


@case
def tokenize_detokenize_and_apply_template_answer_as_vllm_and_llama_cpp():
    d = Daemon(SEXTANT, MODEL)
    try:
        text = "Alice was beginning to get very tired"
        status, body = post(d.port, "/tokenize", {"model": NAME, "prompt": text})
        got = json.loads(body)
        assert status == 200 and set(got) == {"count", "max_model_len", "tokens", "token_strs"}, body
        assert got["count"] == len(got["tokens"]) == prompt_tokens_of_text(d.port, text) and got["token_strs"] is None
        assert got["max_model_len"] == 512, got
        status, body = post(d.port, "/detokenize", {"model": NAME, "tokens": got["tokens"]})
        assert status == 200 and json.loads(body) == {"prompt": text}, body
        messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Who is Alice?"}]
        status, body = post(d.port, "/apply-template", {"messages": messages, "temperature": 0.3})
        rendered = json.loads(body)["prompt"]
        assert status == 200 and rendered == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWho is "
                                              "Alice?<|im_end|>\n<|im_start|>assistant\n"), body
        status, body = post(d.port, "/tokenize", {"messages": messages, "return_token_strs": True})
        chat_tok = json.loads(body)
        status2, body2 = chat(d.port, messages)
        assert status == 200 and status2 == 200, (body, body2)
        assert chat_tok["count"] == json.loads(body2)["usage"]["prompt_tokens"], (chat_tok["count"], body2)
        assert len(chat_tok["token_strs"]) == chat_tok["count"] and chat_tok["token_strs"][0] == "<|im_start|>", body
        status, body = post(d.port, "/tokenize", {"prompt": rendered, "add_special_tokens": False})
        assert json.loads(body)["tokens"] == chat_tok["tokens"], body
        for path, req, code, param in [
                ("/tokenize", {"prompt": "a", "messages": messages}, 400, "prompt"),
                ("/tokenize", {"model": "other", "prompt": "a"}, 404, "model"),
                ("/detokenize", {"tokens": [1, 10 ** 9]}, 400, "tokens[1]"),
                ("/apply-template", {"messages": [{"role": "wizard", "content": "x"}]}, 400, "messages[0].role")]:
            status, body = post(d.port, path, req)
            assert status == code and json.loads(body)["error"]["param"] == param, (path, req, status, body)
        print(f"  /tokenize ({got['count']} and {chat_tok['count']} tokens), /detokenize round trip, /apply-template "
              f"({len(rendered)} characters) agree with completions and chat; 4 bad requests named")
    finally:
        d.stop()


THINKING = """{%- for m in messages -%}
<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endfor -%}
{%- if add_generation_prompt -%}
<|im_start|>assistant
{% if enable_thinking is defined and enable_thinking is false %}<think>

</think>

{% else %}<think>
{% endif %}
{%- endif -%}"""


def split_reference(text, opened):
    """The rule of daemon/chat/reasoning.h, restated: (reasoning or None, content)."""
    if not opened:
        s = text.lstrip(" \t\r\n")
        if not s.startswith("<think>"):
            return None, text
        text = s[len("<think>"):]
    reasoning, sep, content = text.partition("</think>")
    return reasoning.strip("\n"), content.lstrip("\n") if sep else ""


def stream_chat(port, messages, **extra):
    import http.client
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request("POST", "/v1/chat/completions", body=json.dumps(
        {"model": NAME, "messages": messages, "max_tokens": 24, "temperature": 0, "stream": True, **extra}),
        headers={"Content-Type": "application/json"})
    r = c.getresponse()
    reasoning, content = "", ""
    for line in r.read().decode().split("\n\n"):
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        delta = json.loads(line[6:])["choices"][0]["delta"]
        reasoning += delta.get("reasoning_content", "")
        content += delta.get("content") or ""
    c.close()
    return reasoning, content


@case
def thinking_goes_to_reasoning_content_whole_and_streamed():
    path = write_template("thinking.jinja", THINKING)
    d = Daemon(SEXTANT, MODEL, "--chat-template", path)
    try:
        messages = [{"role": "user", "content": "Alice was beginning to get"}]
        for kwargs, opened in (({}, True), ({"chat_template_kwargs": {"enable_thinking": False}}, False)):
            status, body = post(d.port, "/apply-template", {"messages": messages, **kwargs})
            prompt = json.loads(body)["prompt"]
            assert prompt.endswith("<think>\n") == opened, prompt
            # The same prompt as a completion: the text the chat answer is split from.
            status, body = post(d.port, "/v1/completions", {"model": NAME, "prompt": prompt, "max_tokens": 24,
                                                            "temperature": 0})
            text = json.loads(body)["choices"][0]["text"]
            want_reasoning, want_content = split_reference(text, opened)
            status, body = post(d.port, "/v1/chat/completions", {"model": NAME, "messages": messages, "max_tokens": 24,
                                                                 "temperature": 0, **kwargs})
            msg = json.loads(body)["choices"][0]["message"]
            assert status == 200 and "reasoning_content" in msg, body
            assert msg["reasoning_content"] == want_reasoning and msg["content"] == want_content, (msg, text)
            reasoning, content = stream_chat(d.port, messages, **kwargs)
            assert content == want_content and reasoning.strip("\n") == (want_reasoning or ""), (reasoning, content)
            print(f"  {'thinking opened by the template' if opened else 'enable_thinking false'}: "
                  f"reasoning_content {len(want_reasoning or '')} characters, content {len(want_content)}, "
                  f"whole and streamed, as the completion of the same prompt splits")
    finally:
        d.stop()


daemon_harness.run_cases("SX_CHAT_ONLY")
daemon_harness.summary_exit()
