#!/usr/bin/env python3
"""One chat path (issue 54 item 3): `sextant tokenize --chat` and `sextant generate --chat` render the
prompt exactly as `sextant serve`'s /apply-template does for the same messages ([system?, user]):
the model's own template (the bundled model's GGUF carries Qwen2.5's; a Qwen3.5 file made by
`make-model` with the Qwen3.5 tokenizer and template carries Qwen3.5's), `--chat-template FILE`
instead (as serve's flag), `--chat-template-kwargs JSON` as a request's chat_template_kwargs, and the
built-in ChatML for a model with none. The check is byte for byte: tokenize --chat's ids, detokenized
by the same server, are /apply-template's text, and are /tokenize's ids for the messages; generate
--chat takes as many prompt tokens and gives the same greedy ids as generate given /apply-template's
text (on the bundled model also chat completion's answer). Bad flags (a missing or broken template
file, kwargs that are not a JSON object) are one clear line naming the flag, never a crash.
Usage: cli_chat_test.py SEXTANT MEMORISE_DIR TEMPLATES_DIR QWEN35_TOKENIZER_JSON_XZ.
Prints "N passed, N failed"."""
import json
import lzma
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import daemon_harness  # noqa: E402
from daemon_harness import Daemon, case, post  # noqa: E402

SEXTANT, MEMORISE, TEMPLATES, Q35_TOKENIZER = sys.argv[1:5]
BUNDLED = os.path.join(MEMORISE, "memorise-q8_0.gguf")
TMP = tempfile.mkdtemp(prefix="sx-cli-chat-")
QWEN35_TEMPLATE = os.path.join(TEMPLATES, "qwen3.5", "chat_template.jinja")
CUSTOM = os.path.join(TMP, "custom.jinja")
with open(CUSTOM, "w") as f:
    f.write("{%- for m in messages -%}[{{ m.role }}] {{ m.content }}\n{%- endfor -%}"
            "{%- if mood is defined %}(mood: {{ mood }}){% endif -%}"
            "{%- if add_generation_prompt %}[assistant]{% endif -%}")


def sextant(*args, check=True):
    p = subprocess.run([SEXTANT, *args], capture_output=True, timeout=120)
    if check and p.returncode != 0:
        raise AssertionError(f"sextant {' '.join(args)} exited {p.returncode}: {p.stderr.decode(errors='replace')}")
    return p


def make_qwen35(name, template):
    """A 2-layer random-weight Qwen3.5 (DeltaNet + gated attention) GGUF with the Qwen3.5 tokenizer and,
    when `template` is given, that chat template in the file (make-model takes the chat_template.jinja
    beside the tokenizer.json, as transformers saves it)."""
    tokenizer = os.path.join(TMP, "qwen3.5-tokenizer.json")
    if not os.path.exists(tokenizer):
        with lzma.open(Q35_TOKENIZER) as src, open(tokenizer, "wb") as dst:
            dst.write(src.read())
    folder = os.path.join(TMP, name)
    os.makedirs(folder)
    os.link(tokenizer, os.path.join(folder, "tokenizer.json"))
    if template:
        shutil.copy(template, os.path.join(folder, "chat_template.jinja"))
    path = os.path.join(TMP, name + ".gguf")
    sextant("make-model", "--arch", "qwen35", "--layers", "2", "--full-attention-interval", "2", "--hidden", "64",
            "--heads", "2", "--kv-heads", "1", "--head-dim", "32", "--ffn", "128", "--ssm-k-heads", "2",
            "--ssm-v-heads", "2", "--ssm-head-dim", "32", "--ctx", "4096", "--type", "q8_0",
            "--tokenizer", os.path.join(folder, "tokenizer.json"), "--out", path)
    return path


def chat_flags(system, template, kwargs):
    flags = ["--chat"]
    if system is not None:
        flags += ["--system", system]
    if template:
        flags += ["--chat-template", template]
    if kwargs is not None:
        flags += ["--chat-template-kwargs", json.dumps(kwargs)]
    return flags


def served_prompt(d, messages, kwargs):
    body = {"messages": messages}
    if kwargs is not None:
        body["chat_template_kwargs"] = kwargs
    status, text = post(d.port, "/apply-template", body)
    assert status == 200, text
    rendered = json.loads(text)["prompt"]
    status, text = post(d.port, "/tokenize", body)
    assert status == 200, text
    return rendered, json.loads(text)["tokens"]


def check_same_as_apply_template(model, template, conversations, generate_too=True):
    """For each (system, user, kwargs): tokenize --chat (and, for the last one, generate --chat) against
    /apply-template of a server started on `model` with the same --chat-template. Returns the rendered
    prompts."""
    d = Daemon(SEXTANT, model, *(["--chat-template", template] if template else []), max_model_len=2048)
    out = []
    try:
        for k, (system, user, kwargs) in enumerate(conversations):
            messages = ([{"role": "system", "content": system}] if system is not None else []) + \
                [{"role": "user", "content": user}]
            rendered, served_ids = served_prompt(d, messages, kwargs)
            flags = chat_flags(system, template, kwargs)
            ids = [int(x) for x in sextant("tokenize", "--model", model, *flags, user).stdout.split()]
            status, text = post(d.port, "/detokenize", {"tokens": ids})
            assert status == 200, text
            cli_text = json.loads(text)["prompt"]
            assert cli_text == rendered, f"tokenize --chat {flags}:\n{cli_text!r}\n/apply-template:\n{rendered!r}"
            assert ids == served_ids, (flags, ids, served_ids)
            if generate_too and k + 1 == len(conversations):
                gen = ["generate", "--model", model, "-n", "6", "--temp", "0", "--ignore-eos", "--ids", "-t", "2"]
                chat = sextant(*gen, *flags, user)
                plain = sextant(*gen, "--prompt", rendered)
                n_chat = int(re.search(rb"prompt (\d+) tokens", chat.stderr).group(1))
                n_plain = int(re.search(rb"prompt (\d+) tokens", plain.stderr).group(1))
                assert n_chat == n_plain == len(ids), (flags, n_chat, n_plain, len(ids))
                assert chat.stdout == plain.stdout, (flags, chat.stdout, plain.stdout)
            out.append(rendered)
    finally:
        d.stop()
    return out


@case
def the_bundled_models_own_template():
    convs = [(None, "Who is Alice?", None), ("Be brief.", "Who is Alice?", None)]
    got = check_same_as_apply_template(BUNDLED, None, convs)
    # Qwen2.5's template (the GGUF's) adds its default system turn when there is none.
    assert got[0].startswith("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud."), got[0]
    assert got[1].startswith("<|im_start|>system\nBe brief.<|im_end|>\n"), got[1]
    # generate --chat's answer is the chat completion's.
    d = Daemon(SEXTANT, BUNDLED)
    try:
        status, body = post(d.port, "/v1/chat/completions", {
            "model": "memorise-q8_0", "messages": [{"role": "user", "content": "Alice was beginning"}],
            "max_tokens": 12, "temperature": 0, "ignore_eos": True})
        assert status == 200, body
        served = json.loads(body)["choices"][0]["message"]["content"]
    finally:
        d.stop()
    p = sextant("generate", "--model", BUNDLED, "--chat", "-n", "12", "--temp", "0", "--ignore-eos", "-t", "2",
                "Alice was beginning")
    assert p.stdout.decode() == served + "\n", (p.stdout, served)
    assert b"chat template: the model's own" in p.stderr, p.stderr
    print(f"  {len(convs)} conversations: tokenize / generate --chat = /apply-template ({len(got[0])} characters); "
          f"generate --chat's answer = chat completion's: {served!r}")


@case
def the_bundled_model_with_a_chat_template_file_and_kwargs():
    convs = [("sys", "hi", None), (None, "hi", {"mood": "calm"})]
    got = check_same_as_apply_template(BUNDLED, CUSTOM, convs)
    assert got == ["[system] sys[user] hi[assistant]", "[user] hi(mood: calm)[assistant]"], got
    print(f"  --chat-template {os.path.basename(CUSTOM)} and --chat-template-kwargs: {got}")


@case
def a_qwen35_file_with_its_own_template():
    model = make_qwen35("qwen35-own", QWEN35_TEMPLATE)
    convs = [(None, "What is 2+2?", None), ("Be brief.", "What is 2+2?", {"enable_thinking": False})]
    got = check_same_as_apply_template(model, None, convs)
    assert got[0].endswith("<|im_start|>assistant\n<think>\n"), got[0]
    assert got[1].endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n"), got[1]
    assert "You are Qwen" not in got[0], got[0]  # not Qwen2.5's ChatML default system turn
    print(f"  Qwen3.5's template from the GGUF (thinking on and off): {got[1]!r}")


@case
def a_qwen35_file_without_one_chatml_or_chat_template():
    model = make_qwen35("qwen35-bare", None)
    got = check_same_as_apply_template(model, None, [(None, "hello", None)], generate_too=False)
    assert got == ["<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
                   "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"], got  # the built-in ChatML
    convs = [("Be brief.", "What is 2+2?", None), (None, "What is 2+2?", {"enable_thinking": False})]
    got = check_same_as_apply_template(model, QWEN35_TEMPLATE, convs)
    assert got[0] == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
                      "<|im_start|>assistant\n<think>\n"), got[0]
    print(f"  ChatML without a template; --chat-template qwen3.5/chat_template.jinja: {got[1]!r}")


@case
def bad_chat_flags_are_named():
    broken = os.path.join(TMP, "broken.jinja")
    with open(broken, "w") as f:
        f.write("{% for m in messages %}{{ m.content }")
    raises = os.path.join(TMP, "raises.jinja")
    with open(raises, "w") as f:
        f.write("{{ raise_exception('this template wants a system message') }}")
    missing = os.path.join(TMP, "no-such-template.jinja")
    cases = [
        (["--chat", "--chat-template", missing], ["--chat-template", missing]),
        (["--chat", "--chat-template", broken], ["--chat-template", broken, "does not parse"]),
        (["--chat", "--chat-template", TMP], ["--chat-template", TMP]),
        (["--chat", "--chat-template-kwargs", "{bad"], ["--chat-template-kwargs", "not valid JSON"]),
        (["--chat", "--chat-template-kwargs", "[1]"], ["--chat-template-kwargs", "must be a JSON object"]),
        (["--chat", "--chat-template-kwargs", "[" * 60000 + "]" * 60000], ["--chat-template-kwargs"]),
        (["--chat", "--chat-template", raises], ["--chat", "this template wants a system message"]),
        (["--system", "s"], ["--system", "add --chat"]),
        (["--chat-template", CUSTOM], ["--chat-template", "add --chat"]),
    ]
    for command in ("tokenize", "generate"):
        for flags, wanted in cases:
            p = sextant(command, "--model", BUNDLED, *flags, "hi", check=False)
            err = p.stderr.decode(errors="replace")
            # 2: a bad argument (INVALID_ARGUMENT), 1: another error (a missing file); never a signal.
            assert p.returncode in (1, 2), (command, flags[:3], p.returncode, err[-500:])
            assert err.startswith(f"sextant {command}: ") and all(w in err for w in wanted), (command, flags[:3], err[-500:])
            assert p.stdout == b"", (command, flags[:3], p.stdout[:200])
    print(f"  {len(cases)} bad flags x tokenize / generate: a clear error, e.g. "
          f"{sextant('tokenize', '--model', BUNDLED, '--chat', '--chat-template', missing, 'hi', check=False).stderr.decode().strip()!r}")


daemon_harness.run_cases("SX_CLI_CHAT_ONLY")
daemon_harness.summary_exit()
