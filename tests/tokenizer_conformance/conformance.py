#!/usr/bin/env python3
"""Tokenizer conformance: Sextant's tokenizer against Hugging Face `tokenizers` (Qwen2.5's, Qwen3.5's).

Generates a deterministic corpus (fixed seed) of varied strings (prose, CJK, code, emoji, numbers,
white space, contractions, combining characters, special tokens, invalid UTF-8, very long words),
encodes it with the reference (HF `tokenizers` from the test venv, .venv-test) and with the C++
batch program (tokenizer_batch, loaded from tokenizer.json and, separately, GGUF-style), and checks:
  * ids identical, with special tokens parsed and with them treated as text;
  * decode(ids) == HF decode(ids), and == NFC(input) for valid UTF-8 input (exact round trip),
    NFC as the reference computes it (its normalizer uses Unicode 9.0 tables, so marks assigned
    later are inert; Python's unicodedata would compose some of them);
  * the stream decoder's output == decode(ids) read with errors='replace';
  * with --vectors FILE, each {"text", "ids"} of it encodes to its ids (Qwen3.5's: ids from the
    published BPE ranks, an independent check of the merges rebuilt from them).
A tokenizer given as FILE.json.xz is decompressed into a temporary folder first.
Exit 0 when everything matches, 1 on any mismatch, 77 (skip) when the venv is missing.
"""
import argparse
import os
import random
import subprocess
import sys

SKIP = 77
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


def ensure_reference():
    """Imports HF tokenizers, re-executing under <repo>/.venv-test/bin/python if needed."""
    try:
        import tokenizers  # noqa: F401
        return
    except ImportError:
        pass
    venv_python = os.path.join(REPO, ".venv-test", "bin", "python")
    if os.path.exists(venv_python) and os.path.realpath(sys.executable) != os.path.realpath(venv_python):
        os.execv(venv_python, [venv_python] + sys.argv)
    print("tokenizer conformance: SKIPPED - the reference (Hugging Face `tokenizers`) is not installed; "
          "run scripts/setup to create .venv-test", file=sys.stderr)
    sys.exit(SKIP)


# ---------------------------------------------------------------------------------------------
# Corpus
# ---------------------------------------------------------------------------------------------

ENGLISH = [
    "The quick brown fox jumps over the lazy dog.",
    "It was the best of times, it was the worst of times.",
    "Sextant serves Qwen-family models on CPU, Vulkan and CUDA devices.",
    "Please don't hesitate to contact us if you've got any questions.",
    "She said: \"I'll be there at 5 p.m., unless it rains.\"",
    "Memory bandwidth, not compute, bounds decode throughput.",
    "In 1969, Apollo 11 landed on the Moon; Neil Armstrong stepped out first.",
    "e.g., i.e., etc. -- abbreviations (and parentheticals) abound!",
    "Hello, world! How are you doing today?",
    "We're testing tokenizers: BPE merges, pre-tokenizers & normalizers.",
    "Rock 'n' roll isn't dead; it's just resting.",
    "The U.S.A. and the U.K. signed the treaty on 12/03/2021.",
    "Large language models predict the next token given the previous ones.",
    "A well-known proverb: \"measure twice, cut once\".",
    "Email me at someone@example.com or visit https://example.org/path?q=1&r=2#frag.",
    "Prices rose 3.5% to $1,234.56 per unit (up from $999.99).",
]
CHINESE = [
    "你好，世界！", "我们正在测试分词器的正确性。", "机器学习是人工智能的一个分支。",
    "今天天气很好，我们去公园散步吧。", "大型语言模型可以生成流畅的文本。", "北京是中华人民共和国的首都。",
]
JAPANESE = [
    "こんにちは、世界！", "東京は日本の首都です。", "カタカナとひらがなと漢字を混ぜて書きます。",
    "ｶﾀｶﾅの半角もあります。", "私はラーメンが大好きです。",
]
KOREAN = ["안녕하세요, 세계!", "한국어 토크나이저를 테스트합니다.", "서울은 대한민국의 수도입니다."]
OTHER_SCRIPTS = [
    "Привет, мир! Как дела?", "Γειά σου Κόσμε", "مرحبا بالعالم", "שלום עולם", "नमस्ते दुनिया",
    "สวัสดีชาวโลก", "Xin chào thế giới", "Tiếng Việt có dấu", "Grüße aus Köln, Straße", "ﬁne ﬂow ǅemal",
    "İstanbul ıi İI", "Ελληνικά: ΣΊΣΥΦΟΣ σίσυφος", "ⅷ Ⅻ ① ② ³ ¼ ½",
]
PYTHON = [
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "import numpy as np\n\nx = np.arange(10)\nprint(x[::-1], x.sum())\n",
    "class Foo(Base):\n\t\"\"\"Docstring.\"\"\"\n\tdef __init__(self, *args, **kwargs):\n\t\tsuper().__init__(*args)\n",
    "for i, (k, v) in enumerate(d.items()):\n    print(f\"{i}: {k!r} -> {v:.3f}\")\n",
    "lambda x: x**2 if x >= 0 else -x  # comment\n",
]
CPP = [
    "#include <vector>\nint main() {\n  std::vector<int> v{1, 2, 3};\n  return v.size() > 2 ? 0 : 1;\n}\n",
    "template <typename T>\nT max(T a, T b) { return a > b ? a : b; }\n",
    "auto it = std::find_if(xs.begin(), xs.end(), [&](const auto& x) { return x->id == 42; });",
    "if (ptr != nullptr && *ptr >= 0x7fffffff) { throw std::runtime_error(\"overflow\"); }\r\n",
    "struct S { int a : 3; unsigned b : 5; };  // bit-fields\n",
]
JSON_SNIPPETS = [
    '{"name": "sextant", "version": "0.1.0", "tags": ["llm", "runtime"], "ok": true}',
    '[{"id": 1, "v": -3.25e-4}, {"id": 2, "v": null}]',
    '{\n  "nested": {\n    "deep": [1, 2, {"x": "y"}]\n  }\n}\n',
    '{"unicode": "caf\\u00e9 \\ud83d\\ude00", "escaped": "line\\nbreak\\ttab"}',
]
EMOJI = [
    "😀", "👍🏽", "👩‍👩‍👧‍👦", "🏳️‍🌈", "👨🏽‍💻", "🇯🇵🇺🇸", "1️⃣", "❤️", "🧑🏿‍🤝‍🧑🏻", "👋🏻👋🏼👋🏽👋🏾👋🏿",
    "🫠🫶🏼", "🐈‍⬛", "🏴󠁧󠁢󠁳󠁣󠁴󠁿", "✋🏻 stop", "I ❤️ NY 🗽", "☕️🍵", "🤷‍♀️🤷‍♂️",
]
CONTRACTIONS = [
    "DON'T", "we'LL", "I'M", "she'S", "they'Re", "you'VE", "he'D", "it's", "It'S", "WE'RE",
    "'s 't 're 've 'm 'll 'd", "''s", "it’s curly", "O'Neil's", "y'all'd've", "'ſ 'ſt", "'S'T'RE",
    "rock'n'roll", "can't won't shan't", "'LLama", "'123", "' s", "l'été",
]
COMBINING = [
    "e\u0301", "Cafe\u0301", "a\u0308o\u0308u\u0308", "A\u030a", "\u212b", "\u2126", "\u1100\u1161\u11a8",
    "\u1112\u1161\u11ab\u1100\u1173\u11af", "a\u0323\u0302", "a\u0302\u0323", "q\u0307\u0323",
    "Z\u0351\u036b\u0343\u036a\u0302\u036b\u033d\u034f\u0334", "\u0915\u093c", "\u00c5\u0301",
    "n\u0303", "o\u0328\u0304", "\u0041\u030a\u0301", "\u1e9b\u0323", "\u0958", "\ufb2c", "\u0344",
    "\u0340\u0341", "\u2000\u2001", "\uf900\uf901", "\u0e33", "\u30ac\u304c", "\u304b\u3099",
    # Marks and composites assigned after Unicode 9.0, which the reference's NFC treats as inert.
    "e\u07fd\u0301", "a\u1df6\u0323", "\U00011935\U00011930", "o\u0899\u0308", "u\u1ac1\u0323",
    "\U0001e4ec\u0301", "i\U00016ff0\u0301", "k\u0c3c\u0301",
]
# Combining-mark blocks, old and new (for random mark sequences).
MARK_RANGES = [(0x300, 0x36f), (0x483, 0x489), (0x591, 0x5c7), (0x610, 0x61a), (0x64b, 0x65f), (0x7eb, 0x7fd),
               (0x898, 0x89f), (0x8ca, 0x8ff), (0x93c, 0x94d), (0xc3c, 0xc3c), (0xd3b, 0xd3c), (0xe31, 0xe3a),
               (0x1ab0, 0x1ace), (0x1dc0, 0x1dff), (0x20d0, 0x20f0), (0x302a, 0x302f), (0x3099, 0x309a),
               (0xfe20, 0xfe2f), (0x10f46, 0x10f50), (0x11930, 0x11943), (0x16ff0, 0x16ff1), (0x1d165, 0x1d172),
               (0x1e4ec, 0x1e4ef)]
SPECIALS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
    "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>",
    "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>",
]
SPECIAL_MIXED = [
    "<|im_start|>user\nhi<|im_end|>", "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
    "<|im_sta", "<|im_end", "im_end|>", "<|im_start|><|im_end|>", "<<|im_start|>>", "<|im_start|im_end|>",
    "foo<|endoftext|>bar", " <|endoftext|> ", "<|endoftext|><|endoftext|>", "<|IM_START|>", "< |im_start| >",
    "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>", "<|fim_prefix|>def f(<|fim_suffix|>)<|fim_middle|>",
    "e\u0301<|im_end|>\u0301", "<|im_start|>\u0301", "\n\n<|im_end|>\n\n",
]
SPACES = [" ", "  ", "   ", "\t", "\t\t", "\n", "\n\n", "\n\n\n", "\r\n", "\r\n\r\n", "\r", " \n ", "\u00a0",
          "\u3000", "\u2003", "\u0085", "\u000b", "\u000c", "\u2028", "\u2029", "\u200b", "\ufeff", "\u180e",
          "\u202f", "\u205f", "\u1680", " \t \n"]
INVALID = [
    b"\xff", b"\xfe\xff", b"\xe2\x82", b"\xf0\x80\x80", b"\xed\xa0\x80", b"\xed\xbf\xbf", b"\xc0\xaf",
    b"\xe0\x80\xaf", b"\xf4\x90\x80\x80", b"\xf1\x80\x80", b"\x80", b"\x80\x80\xbf", b"\xc3", b"\xf0\x9f\x98",
    b"\xf8\x88\x80\x80\x80", b"\xc1\xbf", b"\xe0\xa0", b"\xef\xbf", b"\xf5\x80", b"\xc2\x41",
]


def rand_range_chars(rng, lo, hi, n):
    return "".join(chr(rng.randint(lo, hi)) for _ in range(n))


UNICODE_RANGES = [
    (0x20, 0x7e), (0xa0, 0x24f), (0x250, 0x2ff), (0x300, 0x36f), (0x370, 0x3ff), (0x400, 0x4ff),
    (0x530, 0x58f), (0x590, 0x5ff), (0x600, 0x6ff), (0x900, 0x97f), (0x980, 0x9ff), (0xe00, 0xe7f),
    (0x10a0, 0x10ff), (0x1100, 0x11ff), (0x1e00, 0x1eff), (0x1f00, 0x1fff), (0x2000, 0x206f),
    (0x2070, 0x209f), (0x20a0, 0x20cf), (0x2100, 0x214f), (0x2150, 0x218f), (0x2190, 0x21ff),
    (0x2200, 0x22ff), (0x2460, 0x24ff), (0x2500, 0x257f), (0x2600, 0x26ff), (0x3000, 0x303f),
    (0x3040, 0x309f), (0x30a0, 0x30ff), (0x3130, 0x318f), (0x4e00, 0x9fff), (0xac00, 0xd7a3),
    (0xf900, 0xfaff), (0xfb00, 0xfb4f), (0xfe30, 0xfe4f), (0xff00, 0xffef), (0x10300, 0x1032f),
    (0x1d400, 0x1d7ff), (0x1f300, 0x1f5ff), (0x1f600, 0x1f64f), (0x1f900, 0x1f9ff), (0x20000, 0x2a6df),
]


def random_unicode(rng, n):
    out = []
    for _ in range(n):
        lo, hi = rng.choice(UNICODE_RANGES)
        cp = rng.randint(lo, hi)
        if 0xd800 <= cp <= 0xdfff:
            cp = 0x41
        out.append(chr(cp))
    return "".join(out)


def random_case(rng, s):
    mode = rng.randrange(4)
    if mode == 0:
        return s.upper()
    if mode == 1:
        return s.lower()
    if mode == 2:
        return "".join(c.upper() if rng.random() < 0.5 else c for c in s)
    return s


def build_corpus(seed, target):
    """Returns a list of byte strings (deterministic for a given seed and target)."""
    rng = random.Random(seed)
    enc = lambda s: s.encode("utf-8")  # noqa: E731
    corpus = []
    fixed = (ENGLISH + CHINESE + JAPANESE + KOREAN + OTHER_SCRIPTS + PYTHON + CPP + JSON_SNIPPETS + EMOJI +
             CONTRACTIONS + COMBINING + SPECIALS + SPECIAL_MIXED + SPACES)
    corpus += [enc(s) for s in fixed]
    corpus += list(INVALID)
    corpus.append(b"")
    corpus += [bytes([b]) for b in range(1, 128)]  # every ASCII byte alone
    # Every added token glued to text on both sides.
    for sp in SPECIALS:
        corpus.append(enc("x" + sp + "y"))

    pools = {
        "english": ENGLISH, "cjk": CHINESE + JAPANESE + KOREAN, "other": OTHER_SCRIPTS, "code": PYTHON + CPP + JSON_SNIPPETS,
        "emoji": EMOJI, "contractions": CONTRACTIONS, "combining": COMBINING, "specials": SPECIALS + SPECIAL_MIXED,
        "spaces": SPACES,
    }
    generators = []

    def gen_prose():
        n = rng.randint(1, 4)
        return " ".join(rng.choice(ENGLISH) for _ in range(n))
    generators.append((gen_prose, 10))

    def gen_cased_prose():
        return random_case(rng, rng.choice(ENGLISH + CONTRACTIONS))
    generators.append((gen_cased_prose, 6))

    def gen_cjk():
        k = rng.randrange(5)
        if k == 0:
            return rand_range_chars(rng, 0x4e00, 0x9fff, rng.randint(1, 40))
        if k == 1:
            return rand_range_chars(rng, 0x3040, 0x30ff, rng.randint(1, 30))
        if k == 2:
            return rand_range_chars(rng, 0xac00, 0xd7a3, rng.randint(1, 30))
        if k == 3:  # conjoining jamo: NFC composes them into syllables
            return "".join(chr(rng.randint(0x1100, 0x1112)) + chr(rng.randint(0x1161, 0x1175)) +
                           (chr(rng.randint(0x11a8, 0x11c2)) if rng.random() < 0.5 else "")
                           for _ in range(rng.randint(1, 8)))
        return "".join(rng.choice(pools["cjk"]) for _ in range(rng.randint(1, 3)))
    generators.append((gen_cjk, 8))

    def gen_code():
        s = rng.choice(pools["code"])
        if rng.random() < 0.3:
            s = s.replace("    ", "\t")
        if rng.random() < 0.3:
            s = s.replace("\n", "\r\n")
        if rng.random() < 0.3:
            s = "  " * rng.randint(1, 6) + s
        return s
    generators.append((gen_code, 8))

    def gen_emoji():
        return "".join(rng.choice(EMOJI + [" ", "", "a", "!"]) for _ in range(rng.randint(1, 6)))
    generators.append((gen_emoji, 6))

    def gen_numbers():
        k = rng.randrange(7)
        if k == 0:
            return str(rng.randint(0, 10 ** rng.randint(1, 60)))
        if k == 1:
            return f"{rng.uniform(-1e6, 1e6):.{rng.randint(0, 8)}f}"
        if k == 2:
            return f"{rng.randint(0, 10**9):,}"
        if k == 3:
            return "abc" + str(rng.randint(0, 99999)) + "def" + str(rng.randint(0, 9))
        if k == 4:
            return rng.choice(["\u0663\u0664\u0665", "\uff11\uff12\uff13", "x\u00b2+y\u00b2", "\u2160\u2161\u2162",
                               "\u0966\u0967", "1\u00bd", "\U0001d7d9\U0001d7da"])
        if k == 5:
            return f"+1 ({rng.randint(100, 999)}) {rng.randint(100, 999)}-{rng.randint(1000, 9999)}"
        return " ".join(str(rng.randint(0, 10 ** 6)) for _ in range(rng.randint(2, 8)))
    generators.append((gen_numbers, 7))

    def gen_spaces():
        parts = []
        for _ in range(rng.randint(1, 6)):
            parts.append(rng.choice(SPACES) * rng.randint(1, 5))
            if rng.random() < 0.6:
                parts.append(rng.choice(["word", "x", "1", "!", "你好", "é", "'s", "<|im_end|>"]))
        return "".join(parts)
    generators.append((gen_spaces, 9))

    def gen_contractions():
        return " ".join(random_case(rng, rng.choice(CONTRACTIONS)) for _ in range(rng.randint(1, 4)))
    generators.append((gen_contractions, 5))

    def gen_combining():
        base = rng.choice("aeiouAEIOUnNcCsSzZ\u3042\u304b")
        marks = "".join(chr(rng.randint(0x300, 0x36f)) for _ in range(rng.randint(1, 4)))
        return rng.choice(["", "word "]) + base + marks + rng.choice(["", " x", "\u0301", "text"]) + rng.choice(COMBINING)
    generators.append((gen_combining, 7))

    def gen_marks():
        out = []
        for _ in range(rng.randint(1, 4)):
            out.append(rng.choice("aeoAEOnz \u3042\u05d0\u0915\U00011935x1"))
            for _ in range(rng.randint(0, 4)):
                lo, hi = rng.choice(MARK_RANGES)
                out.append(chr(rng.randint(lo, hi)))
        return "".join(out)
    generators.append((gen_marks, 5))

    def gen_specials():
        parts = []
        for _ in range(rng.randint(1, 6)):
            r = rng.random()
            if r < 0.4:
                parts.append(rng.choice(SPECIALS))
            elif r < 0.55:
                sp = rng.choice(SPECIALS)
                parts.append(sp[: rng.randint(1, len(sp) - 1)])  # partial
            else:
                parts.append(rng.choice(["user\n", "hi", " ", "\n", "assistant\n", "é", "{}", "<|", "|>", "<"]))
        return "".join(parts)
    generators.append((gen_specials, 8))

    def gen_invalid():
        k = rng.randrange(3)
        if k == 0:
            return bytes(rng.randrange(256) for _ in range(rng.randint(1, 24)))
        if k == 1:
            return enc(rng.choice(ENGLISH)[: rng.randint(0, 30)]) + rng.choice(INVALID) + enc(rng.choice(CHINESE))
        # A valid multi-byte string cut at a random byte.
        s = enc(rng.choice(CHINESE + EMOJI + JAPANESE))
        cut = rng.randint(1, len(s))
        return s[:cut] + enc(rng.choice(["", " tail", "\n"]))
    generators.append((gen_invalid, 7))

    def gen_long():
        k = rng.randrange(8)
        n = rng.randint(200, 6000)
        if k == 0:
            return "a" * n
        if k == 1:
            return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(n))
        if k == 2:
            return "".join(rng.choice("0123456789") for _ in range(n))
        if k == 3:
            return rng.choice([" ", "\t", "\n", "\r\n", " \n"]) * n
        if k == 4:
            return rng.choice(["!", "=", "-", "*", "#", "/"]) * n
        if k == 5:
            return rand_range_chars(rng, 0x4e00, 0x9fff, n // 3)
        if k == 6:
            return "".join(rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/") for _ in range(n)) + "=="
        return "https://example.com/" + "/".join("seg%d" % rng.randint(0, 999) for _ in range(n // 8)) + "?q=" + "x" * 50
    generators.append((gen_long, 4))

    def gen_random_unicode():
        return random_unicode(rng, rng.randint(1, 40))
    generators.append((gen_random_unicode, 10))

    def gen_mixture():
        parts = []
        for _ in range(rng.randint(2, 8)):
            pool = pools[rng.choice(list(pools))]
            parts.append(rng.choice(pool))
            if rng.random() < 0.3:
                parts.append(rng.choice(SPACES))
        return "".join(parts)
    generators.append((gen_mixture, 10))

    funcs = [g for g, w in generators for _ in range(w)]
    while len(corpus) < target:
        s = rng.choice(funcs)()
        corpus.append(s if isinstance(s, bytes) else enc(s))
    return corpus


# ---------------------------------------------------------------------------------------------
# Comparison
# ---------------------------------------------------------------------------------------------

def run_batch(batch, tokenizer_json, corpus, gguf_style):
    args = [batch, "--tokenizer", tokenizer_json] + (["--gguf-style"] if gguf_style else [])
    data = "".join(b.hex() + "\n" for b in corpus).encode("ascii")
    proc = subprocess.run(args, input=data, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=240)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({proc.returncode}): {proc.stderr.decode(errors='replace')}")
    lines = proc.stdout.decode("ascii").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if len(lines) != len(corpus):
        raise RuntimeError(f"batch program returned {len(lines)} lines for {len(corpus)} inputs")
    rows = []
    for line in lines:
        a, b, c, d = line.split("\t")
        ids = [int(x) for x in a.split()] if a else []
        ids_plain = [int(x) for x in b.split()] if b else []
        rows.append((ids, ids_plain, bytes.fromhex(c), bytes.fromhex(d)))
    return rows


def short(b, limit=120):
    r = repr(b)
    return r if len(r) <= limit else r[:limit] + f"... ({len(b)} bytes)"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", required=True, help="path of the tokenizer_batch program")
    ap.add_argument("--tokenizer", required=True, help="path of the Qwen2.5 tokenizer.json")
    ap.add_argument("--count", type=int, default=2400,
                    help="number of strings (default 2400; never fewer than the fixed part of the corpus)")
    ap.add_argument("--seed", type=int, default=20250101)
    ap.add_argument("--show", type=int, default=5, help="mismatches to print")
    ap.add_argument("--vectors", help="a JSON list of {text, ids} each must encode to")
    args = ap.parse_args()
    if args.tokenizer.endswith(".xz"):
        import lzma
        import tempfile
        path = os.path.join(tempfile.mkdtemp(prefix="sx-tokenizer-"), "tokenizer.json")
        with lzma.open(args.tokenizer) as src, open(path, "wb") as dst:
            dst.write(src.read())
        args.tokenizer = path

    ensure_reference()
    from tokenizers import Tokenizer

    corpus = build_corpus(args.seed, args.count)
    ref = Tokenizer.from_file(args.tokenizer)
    texts = [b.decode("utf-8", errors="replace") for b in corpus]
    ref.encode_special_tokens = False
    ref_ids = [e.ids for e in ref.encode_batch(texts, add_special_tokens=False)]
    ref.encode_special_tokens = True
    ref_plain = [e.ids for e in ref.encode_batch(texts, add_special_tokens=False)]
    ref.encode_special_tokens = False
    ref_decoded = ref.decode_batch(ref_ids, skip_special_tokens=False)

    ours = run_batch(args.batch, args.tokenizer, corpus, gguf_style=False)
    gguf = run_batch(args.batch, args.tokenizer, corpus, gguf_style=True)

    n = len(corpus)
    identical = round_trips = gguf_identical = 0
    failures = []
    for i, raw in enumerate(corpus):
        ids, ids_plain, decoded, streamed = ours[i]
        problems = []
        if ids != ref_ids[i]:
            problems.append(f"ids differ\n      ours: {ids}\n      HF:   {ref_ids[i]}")
        if ids_plain != ref_plain[i]:
            problems.append(f"ids (parse_special=false) differ\n      ours: {ids_plain}\n      HF:   {ref_plain[i]}")
        if not problems:
            identical += 1
        rt = []
        if decoded != ref_decoded[i].encode("utf-8"):
            rt.append(f"decode differs from HF decode: ours {short(decoded)} HF {short(ref_decoded[i].encode())}")
        valid = texts[i].encode("utf-8") == raw
        if valid and decoded != ref.normalizer.normalize_str(texts[i]).encode("utf-8"):
            rt.append(f"decode is not NFC(input): {short(decoded)}")
        if streamed != decoded.decode("utf-8", errors="replace").encode("utf-8"):
            rt.append(f"stream decoder output differs: {short(streamed)}")
        if not rt:
            round_trips += 1
        problems += rt
        g_ids, g_plain = gguf[i][0], gguf[i][1]
        if g_ids == ids and g_plain == ids_plain:
            gguf_identical += 1
        else:
            problems.append(f"GGUF-style load encodes differently\n      gguf: {g_ids}\n      json: {ids}")
        if problems:
            failures.append((i, raw, problems))

    if args.vectors:
        import json
        vectors = json.load(open(args.vectors, encoding="utf-8"))
        mine = run_batch(args.batch, args.tokenizer, [v["text"].encode("utf-8") for v in vectors], gguf_style=False)
        for v, row in zip(vectors, mine):
            n += 1
            if row[0] != v["ids"]:
                failures.append((n - 1, v["text"].encode("utf-8"), [f"test vector: ours {row[0]}, want {v['ids']}"]))
        bad = sum(1 for v, row in zip(vectors, mine) if row[0] != v["ids"])
        print(f"tokenizer conformance: {len(vectors) - bad}/{len(vectors)} test vectors of "
              f"{os.path.basename(args.vectors)} encode to their ids")
    for i, raw, problems in failures[: args.show]:
        print(f"mismatch #{i}: input {short(raw, 300)}")
        for p in problems:
            print("    " + p)
    m = len(corpus)
    print(f"tokenizer conformance: {identical}/{m} strings identical, {round_trips}/{m} round-trips exact, "
          f"{gguf_identical}/{m} GGUF-style loads identical")
    # One case per string, in the form scripts/test_summary.py counts.
    print(f"tokenizer_conformance: {n - len(failures)} passed, {len(failures)} failed")
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
