#!/usr/bin/python3
"""Train Sextant's bundled test model: a tiny Qwen2 that memorises a public-domain text.

    /usr/bin/python3 tools/train_memorise.py --out models/memorise

Uses only Debian's python3-torch, python3-numpy and python3-regex. Steps:
  1. write the text (opening of "Alice's Adventures in Wonderland", ch. I) to OUT/text.txt;
  2. train a byte-level BPE vocabulary on it (GPT-2 / Qwen2 style, Qwen2 pre-tokenizer regex);
  3. train a 2-layer Qwen2 (tools/qwen2_torch.py) until greedy decoding from the first tokens
     reproduces the whole text (then <|endoftext|>) with a comfortable top-1/top-2 logit margin;
  4. write memorise-{f32,f16,q8_0}.gguf (tools/gguf_py.py) and read each back to check it;
  5. write OUT/reference.json with reference ids and logits computed from the written files.
"""

import argparse
import hashlib
import json
import os
import sys
import time

import numpy as np
import regex
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gguf_py as gg  # noqa: E402
import qwen2_torch  # noqa: E402
from qwen2_torch import Qwen2, Qwen2Config, gguf_state_dict, load_gguf_state_dict  # noqa: E402

SEED = 1234
N_MERGES = 256              # 256 byte tokens + 256 merges = 512 normal tokens
PROMPT_TOKENS = 8
CONTINUATION_TOKENS = 256
TARGET_MARGIN = 8.0         # stop training once every position's top1 - top2 logit gap >= this
MAX_STEPS = 1500
LR = 3e-3
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

# Qwen2's pre-tokenizer regex (identical to llama.cpp's LLAMA_VOCAB_PRE_TYPE_QWEN2).
QWEN2_PRETOKENIZE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                     r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

# Lewis Carroll, "Alice's Adventures in Wonderland" (1865), Chapter I "Down the Rabbit-Hole",
# the first eight paragraphs. Public domain.
TEXT = """\
Alice was beginning to get very tired of sitting by her sister on the bank, and of having nothing to do: once or twice she had peeped into the book her sister was reading, but it had no pictures or conversations in it, 'and what is the use of a book,' thought Alice 'without pictures or conversations?'

So she was considering in her own mind (as well as she could, for the hot day made her feel very sleepy and stupid), whether the pleasure of making a daisy-chain would be worth the trouble of getting up and picking the daisies, when suddenly a White Rabbit with pink eyes ran close by her.

There was nothing so very remarkable in that; nor did Alice think it so very much out of the way to hear the Rabbit say to itself, 'Oh dear! Oh dear! I shall be late!' (when she thought it over afterwards, it occurred to her that she ought to have wondered at this, but at the time it all seemed quite natural); but when the Rabbit actually took a watch out of its waistcoat-pocket, and looked at it, and then hurried on, Alice started to her feet, for it flashed across her mind that she had never before seen a rabbit with either a waistcoat-pocket, or a watch to take out of it, and burning with curiosity, she ran across the field after it, and fortunately was just in time to see it pop down a large rabbit-hole under the hedge.

In another moment down went Alice after it, never once considering how in the world she was to get out again.

The rabbit-hole went straight on like a tunnel for some way, and then dipped suddenly down, so suddenly that Alice had not a moment to think about stopping herself before she found herself falling down a very deep well.

Either the well was very deep, or she fell very slowly, for she had plenty of time as she went down to look about her and to wonder what was going to happen next. First, she tried to look down and make out what she was coming to, but it was too dark to see anything; then she looked at the sides of the well, and noticed that they were filled with cupboards and book-shelves; here and there she saw maps and pictures hung upon pegs. She took down a jar from one of the shelves as she passed; it was labelled 'ORANGE MARMALADE', but to her great disappointment it was empty: she did not like to drop the jar for fear of killing somebody underneath, so managed to put it into one of the cupboards as she fell past it.

'Well!' thought Alice to herself, 'after such a fall as this, I shall think nothing of tumbling down stairs! How brave they'll all think me at home! Why, I wouldn't say anything about it, even if I fell off the top of the house!' (Which was very likely true.)

Down, down, down. Would the fall never come to an end! 'I wonder how many miles I've fallen by this time?' she said aloud. 'I must be getting somewhere near the centre of the earth. Let me see: that would be four thousand miles down, I think--' (for, you see, Alice had learnt several things of this sort in her lessons in the schoolroom, and though this was not a very good opportunity for showing off her knowledge, as there was no one to listen to her, still it was good practice to say it over) '--yes, that's about the right distance--but then I wonder what Latitude or Longitude I've got to?' (Alice had no idea what Latitude was, or Longitude either, but thought they were nice grand words to say.)
"""

# Qwen2.5's ChatML chat template, verbatim from its tokenizer_config.json "chat_template"
# (checked against /work/shared/data/qwen2.5-tokenizer/tokenizer_config.json when present).
CHAT_TEMPLATE = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""
CHAT_TEMPLATE_SOURCE = "/work/shared/data/qwen2.5-tokenizer/tokenizer_config.json"


def log(*args):
    print(*args, flush=True)


# --------------------------------------------------------------------------------------------
# Byte-level BPE
# --------------------------------------------------------------------------------------------

def bytes_to_unicode():
    """GPT-2's reversible byte -> printable unicode character map (space -> 'Ġ', '\\n' -> 'Ċ')."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))  # insertion order = GPT-2 vocab order of bytes


BYTE_TO_UNICODE = bytes_to_unicode()


def pretokenize(text):
    """Split text with the Qwen2 regex; map each piece's UTF-8 bytes to GPT-2 unicode chars."""
    return ["".join(BYTE_TO_UNICODE[b] for b in piece.encode("utf-8"))
            for piece in regex.findall(QWEN2_PRETOKENIZE, text)]


def train_bpe(text, n_merges):
    """Learn n_merges BPE merges on text. Returns (tokens, merges).

    tokens: the 256 byte tokens (in GPT-2 order) followed by each new merged token.
    merges: list of (left, right) pairs in rank order. Each step merges the most frequent
    adjacent pair (within pre-tokens); ties go to the lexicographically smallest pair.
    """
    word_counts = {}
    for w in pretokenize(text):
        word_counts[w] = word_counts.get(w, 0) + 1
    words = [(list(w), c) for w, c in sorted(word_counts.items())]
    tokens = list(BYTE_TO_UNICODE.values())
    known = set(tokens)
    merges = []
    for _ in range(n_merges):
        pairs = {}
        for symbols, count in words:
            for pair in zip(symbols, symbols[1:]):
                pairs[pair] = pairs.get(pair, 0) + count
        if not pairs:
            break
        best = min(pairs, key=lambda p: (-pairs[p], p))
        if pairs[best] < 2:
            break
        merges.append(best)
        merged = best[0] + best[1]
        if merged not in known:
            known.add(merged)
            tokens.append(merged)
        for symbols, _ in words:
            symbols[:] = merge_pair(symbols, best)
    return tokens, merges


def merge_pair(symbols, pair):
    """Replace every occurrence of pair in symbols (scanning left to right) by its merge."""
    out, i = [], 0
    while i < len(symbols):
        if i + 1 < len(symbols) and (symbols[i], symbols[i + 1]) == pair:
            out.append(symbols[i] + symbols[i + 1])
            i += 2
        else:
            out.append(symbols[i])
            i += 1
    return out


class BPETokenizer:
    """Standard rank-based byte-level BPE encoder (what HF `tokenizers` / llama.cpp do)."""

    def __init__(self, tokens, merges, specials):
        self.tokens = tokens + specials
        self.id_of = {t: i for i, t in enumerate(self.tokens)}
        assert len(self.id_of) == len(self.tokens), "duplicate token strings"
        self.rank = {pair: r for r, pair in enumerate(merges)}
        self.unicode_to_byte = {u: b for b, u in BYTE_TO_UNICODE.items()}

    def encode_word(self, word):
        symbols = list(word)
        while len(symbols) > 1:
            ranked = [(self.rank[p], p) for p in zip(symbols, symbols[1:]) if p in self.rank]
            if not ranked:
                break
            symbols = merge_pair(symbols, min(ranked)[1])
        return [self.id_of[s] for s in symbols]

    def encode(self, text):
        """Plain text (no special tokens are parsed) -> ids."""
        return [i for w in pretokenize(text) for i in self.encode_word(w)]

    def decode(self, ids):
        return b"".join(bytes(self.unicode_to_byte[c] for c in self.tokens[i]) for i in ids
                        if self.tokens[i] not in SPECIAL_TOKENS).decode("utf-8", errors="replace")


# --------------------------------------------------------------------------------------------
# Training
# --------------------------------------------------------------------------------------------

@torch.no_grad()
def evaluate(model, seq):
    """Teacher-forced next-token accuracy and top1-top2 margins over the whole sequence."""
    logits = model(torch.tensor(seq[:-1]))
    target = torch.tensor(seq[1:])
    top2 = torch.topk(logits, 2, dim=-1)
    correct = top2.indices[:, 0] == target
    margin = top2.values[:, 0] - top2.values[:, 1]
    # a position only counts as having a margin if its argmax is right
    signed = torch.where(correct, margin, -margin)
    return correct.float().mean().item(), signed.min().item(), logits


def train(model, seq, log_every=25):
    """AdamW on the full-sequence causal LM loss until every position is right with margin."""
    qwen2_torch.set_fast_matmul(True)  # oneDNN products for training; references use torch.matmul
    try:
        return _train(model, seq, log_every)
    finally:
        qwen2_torch.set_fast_matmul(False)


def _train(model, seq, log_every):
    ids = torch.tensor(seq)
    inputs, targets = ids[:-1], ids[1:]
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.95), weight_decay=0.01)
    warmup = 20
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warmup))
    t0 = time.time()
    for step in range(1, MAX_STEPS + 1):
        model.train()
        loss = F.cross_entropy(model(inputs), targets)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % log_every == 0:
            model.eval()
            acc, min_margin, _ = evaluate(model, seq)
            log(f"step {step:5d}  loss {loss.item():.5f}  acc {acc * 100:6.2f}%  "
                f"min margin {min_margin:7.3f}  ({time.time() - t0:.0f}s)")
            if acc == 1.0 and min_margin >= TARGET_MARGIN:
                return step, loss.item(), time.time() - t0
    raise SystemExit(f"did not reach 100% accuracy with margin {TARGET_MARGIN} in {MAX_STEPS} steps")


# --------------------------------------------------------------------------------------------
# GGUF export
# --------------------------------------------------------------------------------------------

FORMATS = {  # name -> (general.file_type, ggml type for 2-D weights)
    "f32": (0, gg.GGML_F32),
    "f16": (1, gg.GGML_F16),
    "q8_0": (7, gg.GGML_Q8_0),
}


def build_metadata(cfg, tok, merges, file_type):
    M = gg.Meta
    eos = tok.id_of["<|endoftext|>"]
    token_types = [3 if t in SPECIAL_TOKENS else 1 for t in tok.tokens]
    return {
        "general.architecture": M(gg.STRING, "qwen2"),
        "general.name": M(gg.STRING, "sextant-memorise"),
        "general.alignment": M(gg.UINT32, gg.DEFAULT_ALIGNMENT),
        "general.file_type": M(gg.UINT32, file_type),
        "qwen2.block_count": M(gg.UINT32, cfg.n_layers),
        "qwen2.context_length": M(gg.UINT32, cfg.context_length),
        "qwen2.embedding_length": M(gg.UINT32, cfg.hidden),
        "qwen2.feed_forward_length": M(gg.UINT32, cfg.ffn),
        "qwen2.attention.head_count": M(gg.UINT32, cfg.n_heads),
        "qwen2.attention.head_count_kv": M(gg.UINT32, cfg.n_kv_heads),
        "qwen2.rope.freq_base": M(gg.FLOAT32, cfg.rope_theta),
        "qwen2.attention.layer_norm_rms_epsilon": M(gg.FLOAT32, cfg.rms_eps),
        "tokenizer.ggml.model": M(gg.STRING, "gpt2"),
        "tokenizer.ggml.pre": M(gg.STRING, "qwen2"),
        "tokenizer.ggml.tokens": M(gg.ARRAY, list(tok.tokens), gg.STRING),
        "tokenizer.ggml.token_type": M(gg.ARRAY, token_types, gg.INT32),
        "tokenizer.ggml.merges": M(gg.ARRAY, [f"{a} {b}" for a, b in merges], gg.STRING),
        "tokenizer.ggml.eos_token_id": M(gg.UINT32, eos),
        "tokenizer.ggml.padding_token_id": M(gg.UINT32, eos),
        "tokenizer.ggml.bos_token_id": M(gg.UINT32, eos),
        "tokenizer.ggml.add_bos_token": M(gg.BOOL, False),
        "tokenizer.chat_template": M(gg.STRING, CHAT_TEMPLATE),
    }


def export_tensors(model, weight_type):
    """(name, array, ggml type): 2-D weights in weight_type, 1-D norms/biases always F32."""
    return [(name, arr, weight_type if arr.ndim == 2 else gg.GGML_F32)
            for name, arr in gguf_state_dict(model)]


def check_roundtrip(path, metadata, tensors):
    """Re-read a written file and compare it with what was meant to be written."""
    meta2, tens2 = gg.read_gguf(path)
    assert list(meta2) == list(metadata), "metadata keys differ"
    for key, m in metadata.items():
        r = meta2[key]
        assert r.vtype == m.vtype and r.elem_type == m.elem_type, key
        if m.vtype == gg.FLOAT32:
            assert np.float32(r.value) == np.float32(m.value), key
        else:
            assert r.value == m.value, key
    assert list(tens2) == [t[0] for t in tensors], "tensor names/order differ"
    for name, arr, gtype in tensors:
        t = tens2[name]
        assert t.ggml_type == gtype and t.dims == list(reversed(arr.shape)), name
        got = t.numpy()
        if gtype == gg.GGML_F32:
            assert np.array_equal(got, arr), name
        elif gtype == gg.GGML_F16:
            assert np.array_equal(got, arr.astype(np.float16).astype(np.float32)), name
        else:  # Q8_0: within one quantisation step of the block scale
            d = np.frombuffer(t.raw, np.uint8).reshape(-1, gg.Q8_0_BLOCK_BYTES)[:, :2]
            d = d.copy().view("<f2").astype(np.float32).reshape(-1)
            err = np.abs(got - arr).reshape(-1, gg.QK8_0).max(axis=1)
            assert np.all(err <= d + 1e-12), name
    return tens2


# --------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------

def count_reproduced(generated, expected):
    n = 0
    for g, e in zip(generated, expected):
        if g != e:
            break
        n += 1
    return n


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="models/memorise", help="output directory")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch CPU threads (default 1: fastest on a busy machine; the bundled files were made with 1)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.set_num_threads(args.threads)
    torch.manual_seed(SEED)
    torch.use_deterministic_algorithms(True)
    t_start = time.time()

    if os.path.exists(CHAT_TEMPLATE_SOURCE):
        with open(CHAT_TEMPLATE_SOURCE, encoding="utf-8") as f:
            assert json.load(f)["chat_template"] == CHAT_TEMPLATE, "embedded chat template is stale"

    # 1. text
    with open(os.path.join(args.out, "text.txt"), "w", encoding="utf-8", newline="\n") as f:
        f.write(TEXT)
    text_bytes = len(TEXT.encode("utf-8"))

    # 2. tokenizer
    tokens, merges = train_bpe(TEXT, N_MERGES)
    tok = BPETokenizer(tokens, merges, SPECIAL_TOKENS)
    text_ids = tok.encode(TEXT)
    assert tok.decode(text_ids) == TEXT
    eos = tok.id_of["<|endoftext|>"]
    seq = text_ids + [eos]
    log(f"text: {text_bytes} bytes -> {len(text_ids)} tokens; vocab {len(tok.tokens)} "
        f"({len(tokens)} normal incl. 256 bytes, {len(merges)} merges, {len(SPECIAL_TOKENS)} special)")

    # 3. model + training
    cfg = Qwen2Config(vocab_size=len(tok.tokens))
    assert cfg.hidden % 32 == 0 and cfg.ffn % 32 == 0 and cfg.n_heads * cfg.head_dim == cfg.hidden
    assert len(seq) <= cfg.context_length
    model = Qwen2(cfg)
    model.init_weights()
    log(f"model: {sum(p.numel() for p in model.parameters())} parameters, {cfg}")
    steps, final_loss, train_seconds = train(model, seq)
    model.eval()
    acc, train_margin, _ = evaluate(model, seq)
    log(f"trained in {steps} steps, {train_seconds:.0f}s: loss {final_loss:.5f}, "
        f"acc {acc * 100:.2f}%, min margin {train_margin:.3f}")

    # 4. GGUF files, each read back and checked
    prompt_ids = text_ids[:PROMPT_TOKENS]
    expected = seq[PROMPT_TOKENS:]
    results = {}
    for fmt, (file_type, wtype) in FORMATS.items():
        path = os.path.join(args.out, f"memorise-{fmt}.gguf")
        metadata = build_metadata(cfg, tok, merges, file_type)
        tensors = export_tensors(model, wtype)
        gg.write_gguf(path, metadata, tensors)
        read_back = check_roundtrip(path, metadata, tensors)
        # run the model from the weights as stored in the file (dequantised to float32)
        m = Qwen2(cfg)
        load_gguf_state_dict(m, {n: t.numpy() for n, t in read_back.items()})
        m.eval()
        f_acc, f_margin, f_logits = evaluate(m, seq)
        gen = m.greedy(prompt_ids, len(expected), stop_id=eos)
        with open(path, "rb") as f:
            sha = hashlib.sha256(f.read()).hexdigest()
        results[fmt] = dict(model=m, logits=f_logits, generated=gen, margin=f_margin,
                            reproduced=count_reproduced(gen, expected), size=os.path.getsize(path),
                            sha256=sha)
        log(f"{fmt:5s}: {results[fmt]['size']} bytes, teacher-forced acc {f_acc * 100:.2f}%, "
            f"min margin {f_margin:.3f}, greedy reproduces {results[fmt]['reproduced']}/{len(expected)}")

    # 5. reference.json (float32, from the weights as written to memorise-f32.gguf)
    f32 = results["f32"]
    with torch.no_grad():
        logits_last = f32["model"](torch.tensor(prompt_ids))[-1]
    all_logits = f32["logits"].double()
    reference = {
        "source": "Lewis Carroll, Alice's Adventures in Wonderland (1865), chapter I, paragraphs 1-8",
        "prompt_text": tok.decode(prompt_ids),
        "prompt_ids": prompt_ids,
        "continuation_ids": f32["generated"][:CONTINUATION_TOKENS],
        "continuation_text": tok.decode(f32["generated"][:CONTINUATION_TOKENS]),
        "logits_last": [float(x) for x in logits_last.tolist()],
        "logits_all_positions_checksum": {
            "input_ids": "text_token_ids + [eos] without its last id (teacher forcing from position 0)",
            "positions": int(all_logits.shape[0]),
            "sum": float(all_logits.sum()),
            "abs_sum": float(all_logits.abs().sum()),
            "argmax": f32["logits"].argmax(-1).tolist(),
        },
        "text_token_ids": text_ids,
        "eos_after_text": True,
        "text_bytes": text_bytes,
        "expected_full_continuation_length": len(expected),
        "hyperparameters": {
            **cfg.to_dict(),
            "n_normal_tokens": len(tokens),
            "n_merges": len(merges),
            "special_tokens": {s: tok.id_of[s] for s in SPECIAL_TOKENS},
            "tied_embeddings": True,
            "rope": "neox",
        },
        "training": {"seed": SEED, "steps": steps, "final_loss": final_loss, "lr": LR,
                     "target_margin": TARGET_MARGIN, "torch_threads": args.threads},
        "formats": {fmt: {"file": f"memorise-{fmt}.gguf", "bytes": r["size"], "sha256": r["sha256"],
                          "greedy_reproduced_tokens": r["reproduced"],
                          "min_teacher_forced_margin": r["margin"]}
                    for fmt, r in results.items()},
    }
    with open(os.path.join(args.out, "reference.json"), "w") as f:
        json.dump(reference, f, indent=1)
        f.write("\n")

    for fmt, r in results.items():
        assert r["reproduced"] == len(expected), f"{fmt} does not reproduce the whole text"
    log(f"done in {time.time() - t_start:.0f}s; prompt {reference['prompt_text']!r}")


if __name__ == "__main__":
    main()
