#!/usr/bin/env python3
"""Qwen3 dense and Qwen3-MoE (issue 40) end to end: random-weight files that `sextant make-model --arch
qwen3 | qwen3moe` writes with the real head layouts (a head size that is not hidden / heads; 128
experts, 8 used per token) give
  * llama.cpp's greedy ids: tests/data/oracle/*.json holds what llama.cpp release 11434 produced on
    the same file (scripts/llama-cpp-oracle, its F32 and F16 KV caches), recorded once; the file is
    made again here from the same seed (checked by its SHA-256) and Sextant's ids compared;
  * the same ids at TP 6, TP 4 and TP 3 x PP 2 on CPU ranks (Qwen3-MoE: experts split whole across
    the ranks, 22 / 22 / 21 / 21 / 21 / 21 at TP 6) and on lavapipe (Vulkan: the MoE shaders too);
  * the same ids from the safetensors twin (Qwen3ForCausalLM / Qwen3MoeForCausalLM directory, one
    tensor per expert, stacked at load) and from its conversion back to GGUF;
  * over the OpenAI API, the text `generate` writes;
  * `plan --shape qwen3-30b-a3b --tp 6`: the experts per rank, why whole experts, the bytes a token reads;
  * a warm reload of two replicas from the bundled Qwen2.5 model to a Qwen3-MoE file (with the real
    Qwen tokenizer) while 8 clients stream: no request fails.
Usage: qwen3_test.py SEXTANT_BINARY ORACLE_DIR MEMORISE_DIR. Prints "N passed, N failed"."""
import glob
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import daemon_harness  # noqa: E402

SEXTANT, ORACLE_DIR, MEMORISE = sys.argv[1], sys.argv[2], sys.argv[3]
TOKENIZER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "qwen2.5-tokenizer",
                         "tokenizer.json")
case = daemon_harness.case
agree = daemon_harness.agree
TMP = tempfile.mkdtemp(prefix="sx-qwen3-")


def run(*args, env=None, timeout=300):
    p = subprocess.run([SEXTANT, *args], capture_output=True, timeout=timeout,
                       env=None if env is None else dict(os.environ, **env))
    if p.returncode != 0:
        raise AssertionError(f"sextant {' '.join(args)} exited {p.returncode}: {p.stderr.decode(errors='replace')}")
    return p


def oracles():
    # qwen3 and qwen3moe (the qwen35 hybrids have tests of their own: qwen35_test.py).
    return [json.load(open(p)) for p in sorted(glob.glob(os.path.join(ORACLE_DIR, "qwen3*.json")))
            if not os.path.basename(p).startswith("qwen35")]


def dense():
    return [o for o in oracles() if "--arch" not in o["make_model"] or "qwen3moe" not in o["make_model"]]


def made(o, fmt="gguf"):
    """The oracle's file, made again from its make-model arguments (same seed, same bytes)."""
    path = os.path.join(TMP, o["name"] + (".gguf" if fmt == "gguf" else ""))
    if not os.path.exists(path):
        extra = ["--format", "safetensors"] if fmt == "safetensors" else []  # the oracle's --type f32 holds
        run("make-model", *o["make_model"], *extra, "--out", path)
        if fmt == "gguf":
            digest = hashlib.sha256(open(path, "rb").read()).hexdigest()
            assert digest == o["sha256"], f"{o['name']}: make-model wrote other bytes ({digest}) than the oracle's file"
    return path


def greedy(path, o, *flags, env=None):
    p = run("generate", "--model", path, "--prompt", o["prompt"], "-n", str(o["n"]), "--temp", "0", "--ignore-eos",
            "--ids", *flags, env=env)
    return [int(x) for x in p.stdout.split()]


@case
def greedy_ids_equal_llama_cpps():
    assert oracles(), f"no oracle files in {ORACLE_DIR}"
    for o in oracles():
        ids = greedy(made(o), o)
        f32, f16 = o["llama_cpp"]["f32_kv"], o["llama_cpp"]["f16_kv"]
        n = agree(ids, f32)
        print(f"  {o['name']} ({o['shape']}): {n} of {o['n']} greedy ids equal llama.cpp {o['llama_cpp']['build']}'s "
              f"with an F32 KV cache; llama.cpp's own F16 and F32 caches agree on {agree(f16, f32)}")
        assert n == o["n"], (ids, f32)


@case
def tensor_and_pipeline_parallel_layouts_give_the_same_ids():
    for o in oracles():
        path = made(o)
        want = o["llama_cpp"]["f32_kv"]
        for tp, pp in ((6, 1), (4, 1), (3, 2)):
            ids = greedy(path, o, "--tp", str(tp), "--pp", str(pp), "-t", "2")
            assert ids == want, (o["name"], "cpu", tp, pp, agree(ids, want))
        vulkan = {"SEXTANT_VULKAN_DEVICES": "0,0,0,0,0,0"}
        probe = subprocess.run([SEXTANT, "generate", "--model", path, "--backend", "vulkan", "-n", "1", "x"],
                               capture_output=True, env=dict(os.environ, **vulkan), timeout=300)
        if probe.returncode != 0:  # only where there is no Vulkan implementation at all
            why = probe.stderr.decode(errors="replace").strip()
            assert "no Vulkan" in why or "Vulkan loader" in why, why
            print(f"  {o['name']}: Vulkan skipped: {why.splitlines()[-1][:200]}")
            layouts = []
        else:
            layouts = [(1, 1), (6, 1), (4, 1), (3, 2)]
        for tp, pp in layouts:
            ids = greedy(path, o, "--backend", "vulkan", "--tp", str(tp), "--pp", str(pp), env=vulkan)
            assert ids == want, (o["name"], "vulkan", tp, pp, agree(ids, want))
        print(f"  {o['name']}: CPU tp 6, tp 4, tp 3 x pp 2 and Vulkan {layouts}: llama.cpp's {o['n']} ids")


@case
def the_safetensors_twin_gives_the_gguf_ids():
    for o in oracles():
        st = made(o, "safetensors")
        config = json.load(open(os.path.join(st, "config.json")))
        moe = o not in dense()
        want_class = "Qwen3MoeForCausalLM" if moe else "Qwen3ForCausalLM"
        assert config["architectures"] == [want_class] and config["head_dim"] != config["hidden_size"] // \
            config["num_attention_heads"], config
        if moe:  # one tensor per expert, as transformers writes them; inspect says what the experts are
            index = subprocess.run([SEXTANT, "inspect", st, "--json"], capture_output=True, timeout=120)
            assert index.returncode == 0 and b"mlp.experts.127.down_proj.weight" in index.stdout, index.stdout[-500:]
            experts = json.loads(index.stdout)["config"]["experts"]
            assert experts == {"count": 128, "used_per_token": 8, "ffn": 64, "norm_topk_prob": True}, experts
            text = run("inspect", made(o)).stdout.decode()
            assert "128 experts of 64 (8 per token, renormalised)" in text, text[:400]
        ids = greedy(st, o)
        assert ids == o["llama_cpp"]["f32_kv"], (o["name"], agree(ids, o["llama_cpp"]["f32_kv"]))
        # Converted back to GGUF: the same ids again.
        back = os.path.join(TMP, o["name"] + "-converted.gguf")
        run("convert", st, "--out", back, "--type", "f32")
        assert greedy(back, o) == ids, o["name"]
        print(f"  {o['name']}: the {want_class} safetensors directory, and its GGUF conversion, give the GGUF "
              f"file's {o['n']} ids")


@case
def plan_shows_experts_per_rank_why_and_the_active_bytes():
    text = run("plan", "--shape", "qwen3-30b-a3b", "--weights", "q4_k_m", "--devices", "6x80GiB", "--tp", "6").stdout.decode()
    for rank, experts in enumerate(["0-21 (22)", "22-43 (22)", "44-64 (21)", "65-85 (21)", "86-106 (21)",
                                    "107-127 (21)"]):
        line = [row for row in text.splitlines() if row.split()[:2] == [str(rank), "0"]]
        assert line and experts in line[0], (rank, experts, text[:1500])
    assert "whole experts rather than a share of each" in text and "not whole 256-element K-quant blocks" in text, text
    said = " ".join(text.split())
    assert "A decode token reads 1.79 GiB of them: attention, the router and 8 of the 128 experts" in said, said[:2000]
    print("  plan --shape qwen3-30b-a3b --tp 6: experts 22/22/21/21/21/21, why whole experts, 1.79 GiB read per token")


@case
def the_openai_api_serves_generates_text():
    for o in (dense()[0], [x for x in oracles() if x not in dense()][0]):  # a qwen3 and a qwen3moe file
        path = made(o)
        want = run("generate", "--model", path, "--prompt", o["prompt"], "-n", "64", "--temp", "0",
                   "--ignore-eos").stdout.decode()
        want = want[:-1] if want.endswith("\n") else want  # generate ends its output with a newline
        d = daemon_harness.Daemon(SEXTANT, path)
        try:
            name = os.path.basename(path)[:-5]
            st, body = daemon_harness.post(d.port, "/v1/completions", {"model": name, "prompt": o["prompt"],
                                                                         "max_tokens": 64, "temperature": 0,
                                                                         "ignore_eos": True})
            assert st == 200, body
            answer = json.loads(body)
            got = answer["choices"][0]["text"]
            assert got == want and answer["usage"]["completion_tokens"] == 64, (got, want, answer["usage"])
            print(f"  {o['name']} served: /v1/completions gives generate's text ({len(want)} characters)")
        finally:
            d.stop()


@case
def a_reload_from_qwen2_5_to_qwen3_moe_under_load_fails_no_request():
    ref = json.load(open(os.path.join(MEMORISE, "reference.json")))
    moe = os.path.join(TMP, "moe-qwen-tokenizer.gguf")
    run("make-model", "--arch", "qwen3moe", "--layers", "2", "--type", "q8_0", "--hidden", "256", "--heads", "32",
        "--kv-heads", "4", "--head-dim", "64", "--experts", "16", "--experts-used", "4", "--expert-ffn", "64",
        "--tokenizer", TOKENIZER, "--init-std", "0.1", "--seed", "40", "--out", moe)
    d = daemon_harness.Daemon(SEXTANT, os.path.join(MEMORISE, "memorise-q8_0.gguf"), "--replicas", "2", max_num_seqs=16)
    try:
        gen = d.status()["generation"]
        load = daemon_harness.Load(d.port, 8, lambda i: ref["prompt_text"][: 20 + 7 * i], "memorise-q8_0")
        try:
            time.sleep(3)
            d.ctl("reload", "--model", moe)
            st = daemon_harness.wait_generation(d, gen + 1, timeout=120)
            assert st["model_path"] == moe and st["model"] == "memorise-q8_0", st
            time.sleep(3)
        finally:
            ok, failures = load.finish()
        assert not failures, failures[:5]
        assert ok >= 16, ok
        # The new generation answers with the MoE model's text, as generate does.
        want = run("generate", "--model", moe, "--prompt", "Hello", "-n", "12", "--temp", "0",
                   "--ignore-eos").stdout.decode()
        st, body = daemon_harness.post(d.port, "/v1/completions", {"model": "memorise-q8_0", "prompt": "Hello",
                                                                     "max_tokens": 12, "temperature": 0,
                                                                     "ignore_eos": True})
        assert st == 200 and json.loads(body)["choices"][0]["text"] == want.rstrip("\n"), (body, want)
        print(f"  8 streams across a reload of 2 replicas from Qwen2.5 (memorise) to Qwen3-MoE: {ok} complete, 0 "
              f"failed; generation {gen} -> {gen + 1}")
    finally:
        d.stop()


daemon_harness.run_cases("SX_QWEN3_ONLY")
shutil.rmtree(TMP, ignore_errors=True)
daemon_harness.summary_exit()
