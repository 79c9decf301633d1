#!/usr/bin/env python3
"""A tokenizer through a GGUF file: `sextant make-model --tokenizer` writes the tokenizer into a GGUF
(tokenizer.ggml.pre as llama.cpp names it: "qwen35" for Qwen3.5's regex), and `sextant tokenize
--model` reads it back; every test vector encodes to its ids. A tokenizer given as .json.xz is
decompressed first. Usage: gguf_round_trip.py SEXTANT TOKENIZER_JSON[.xz] VECTORS_JSON VOCAB.
Prints "N passed, N failed"."""
import json
import lzma
import os
import subprocess
import sys
import tempfile

sextant, tokenizer, vectors_path, vocab = sys.argv[1:5]
tmp = tempfile.mkdtemp(prefix="sx-gguf-tokenizer-")
if tokenizer.endswith(".xz"):
    path = os.path.join(tmp, "tokenizer.json")
    with lzma.open(tokenizer) as src, open(path, "wb") as dst:
        dst.write(src.read())
    tokenizer = path
model = os.path.join(tmp, "model.gguf")
subprocess.run([sextant, "make-model", "--arch", "qwen3", "--layers", "1", "--hidden", "64", "--heads", "2",
                "--kv-heads", "1", "--head-dim", "32", "--ffn", "128", "--vocab", vocab, "--type", "q8_0",
                "--tokenizer", tokenizer, "--out", model], check=True, stdout=subprocess.DEVNULL)
passed = failed = 0
for v in json.load(open(vectors_path, encoding="utf-8")):
    out = subprocess.run([sextant, "tokenize", "--model", model, v["text"]], capture_output=True, text=True, check=True)
    ids = [int(x) for x in out.stdout.split()]
    if ids == v["ids"]:
        passed += 1
    else:
        failed += 1
        print(f"FAIL {v['text']!r}: {ids} want {v['ids']}")
print(f"{passed} of {passed + failed} test vectors encode to their ids through {os.path.basename(model)}")
print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
