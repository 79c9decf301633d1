"""Qwen3.5 / 3.6 / 3.8 hybrids (issue 42) end to end: random-weight `qwen35` and `qwen35moe` files
that `sextant make-model` writes with the published head layouts (Qwen3.5-27B's 24 / 4 attention
heads and 16 QK / 48 V DeltaNet heads; 35B-A3B's 16 / 2 heads, 256 experts top-8 and the shared
expert), 8 layers so that two are full attention, checked against:
  * llama.cpp's greedy ids: tests/data/oracle/qwen35*.json holds what llama.cpp release 11434 gave on
    the same file (scripts/llama-cpp-oracle, its F32 and F16 KV caches), recorded once; the file is
    made again here from the same arguments and must have the recorded sha256;
  * the server: /v1/completions gives generate's text, a prompt served twice gives the same ids
    (the second time from the prefix cache: a state snapshot restored, as `ctl status` says), and
    every state slot is free after the requests;
  * tensor and pipeline parallelism (TP 6, TP 4, TP 3 x PP 2) on CPU ranks and on lavapipe give the
    same ids.

Usage: qwen35_test.py SEXTANT_BINARY ORACLE_DIR. Prints "N passed, N failed"."""
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

SEXTANT, ORACLE_DIR = sys.argv[1], sys.argv[2]
case = daemon_harness.case
agree = daemon_harness.agree
TMP = tempfile.mkdtemp(prefix="sx-qwen35-")


def run(*args, timeout=300, check=True):
    p = subprocess.run([SEXTANT, *args], capture_output=True, timeout=timeout)
    if check and p.returncode != 0:
        raise AssertionError(f"sextant {' '.join(args)} exited {p.returncode}: {p.stderr.decode(errors='replace')}")
    return p


def oracles():
    return [json.load(open(p)) for p in sorted(glob.glob(os.path.join(ORACLE_DIR, "qwen35*.json")))]


def made(o):
    """The oracle's file, made again from its make-model arguments (same seed, same bytes)."""
    path = os.path.join(TMP, o["name"] + ".gguf")
    if not os.path.exists(path):
        run("make-model", *o["make_model"], "--out", path)
        digest = hashlib.sha256(open(path, "rb").read()).hexdigest()
        assert digest == o["sha256"], f"{o['name']}: make-model wrote other bytes ({digest}) than the oracle's file"
    return path


def greedy(path, o, *flags):
    p = run("generate", "--model", path, "--prompt", o["prompt"], "-n", str(o["n"]), "--temp", "0", "--ignore-eos",
            "--ids", *flags)
    return [int(x) for x in p.stdout.split()]


@case
def greedy_ids_equal_llama_cpps():
    assert len(oracles()) == 2, f"want the qwen35 and qwen35moe oracle files in {ORACLE_DIR}"
    for o in oracles():
        path = made(o)
        info = run("inspect", path).stdout.decode()
        assert "6 Gated DeltaNet" in info, info[:600]
        ids = greedy(path, o)
        f32, f16 = o["llama_cpp"]["f32_kv"], o["llama_cpp"]["f16_kv"]
        n = agree(ids, f32)
        print(f"  {o['name']} ({o['shape']}): {n} of {o['n']} greedy ids equal llama.cpp {o['llama_cpp']['build']}'s "
              f"with an F32 KV cache; llama.cpp's own F16 and F32 caches agree on {agree(f16, f32)}")
        assert n == o["n"], (ids, f32)


@case
def tensor_and_pipeline_parallel_layouts_give_the_same_ids():
    """DeltaNet heads split unevenly like attention heads (16 K heads on 6 ranks: 2, 3, 3, 2, 3, 3, each
    with its tiled V heads), experts by expert parallelism, the shared expert on each stage's first rank."""
    for o in oracles():
        path = made(o)
        want = o["llama_cpp"]["f32_kv"]
        for tp, pp in ((6, 1), (4, 1), (3, 2)):
            ids = greedy(path, o, "--tp", str(tp), "--pp", str(pp), "-t", "2")
            assert ids == want, (o["name"], "cpu", tp, pp, agree(ids, want))
        print(f"  {o['name']}: CPU ranks at tp 6, tp 4 and tp 3 x pp 2 give llama.cpp's {o['n']} ids")
    # Vulkan (lavapipe in CI): the same layouts through the DeltaNet shaders.
    vulkan = dict(os.environ, SEXTANT_VULKAN_DEVICES="0,0,0,0,0,0")
    probe = subprocess.run([SEXTANT, "generate", "--model", made(oracles()[0]), "--backend", "vulkan", "-n", "1", "x"],
                           capture_output=True, env=vulkan, timeout=300)
    if probe.returncode != 0:  # only where there is no Vulkan implementation at all
        why = probe.stderr.decode(errors="replace").strip()
        assert "no Vulkan" in why or "Vulkan loader" in why, why
        print(f"  Vulkan skipped: {why.splitlines()[-1][:200]}")
        return
    for o in oracles():
        path = made(o)
        want = o["llama_cpp"]["f32_kv"]
        for tp, pp in ((1, 1), (6, 1), (4, 1), (3, 2)):
            p = subprocess.run([SEXTANT, "generate", "--model", path, "--backend", "vulkan", "--prompt", o["prompt"],
                                "-n", str(o["n"]), "--temp", "0", "--ignore-eos", "--ids", "--tp", str(tp), "--pp",
                                str(pp)], capture_output=True, env=vulkan, timeout=600)
            assert p.returncode == 0, p.stderr.decode(errors="replace")[-800:]
            ids = [int(x) for x in p.stdout.split()]
            assert ids == want, (o["name"], "vulkan", tp, pp, agree(ids, want))
        print(f"  {o['name']}: Vulkan (lavapipe) at tp 1, tp 6, tp 4 and tp 3 x pp 2 gives llama.cpp's {o['n']} ids")


@case
def the_hugging_face_checkpoint_gives_llama_cpps_ids():
    """The same weights as a Hugging Face checkpoint (`make-model --format safetensors --from`: what
    Qwen/Qwen3.5-* publish, i.e. llama.cpp's converter undone: V heads grouped by K head, (1 + w) norms
    stored as w, A_log, fused experts, keys in text_config, 3 shards, a vision tower and an MTP layer
    that are skipped and logged) gives llama.cpp's ids read from the GGUF, at tp 1, tp 6 and tp 3 x pp 2
    on CPU ranks (the grouped V heads split in one run per rank) and at tp 6 on lavapipe."""
    vulkan = dict(os.environ, SEXTANT_VULKAN_DEVICES="0,0,0,0,0,0")
    for o in oracles():
        hf = os.path.join(TMP, o["name"] + "-hf")
        run("make-model", "--format", "safetensors", "--type", "f32", "--shards", "3", "--from", made(o), "--out", hf)
        config = json.load(open(os.path.join(hf, "config.json")))
        assert config["architectures"][0] in ("Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration")
        want = o["llama_cpp"]["f32_kv"]
        layouts = [("cpu", 1, 1), ("cpu", 6, 1), ("cpu", 3, 2), ("vulkan", 6, 1)]
        for backend, tp, pp in layouts:
            p = subprocess.run([SEXTANT, "generate", "--model", hf, "--backend", backend, "--prompt", o["prompt"],
                                "-n", str(o["n"]), "--temp", "0", "--ignore-eos", "--ids", "--tp", str(tp), "--pp",
                                str(pp)] + (["-t", "2"] if backend == "cpu" else []), capture_output=True, env=vulkan,
                               timeout=600)
            err = p.stderr.decode(errors="replace")
            if backend == "vulkan" and p.returncode != 0 and ("no Vulkan" in err or "Vulkan loader" in err):
                print(f"  Vulkan skipped: {err.strip().splitlines()[-1][:200]}")
                continue
            assert p.returncode == 0, err[-800:]
            ids = [int(x) for x in p.stdout.split()]
            assert ids == want, (o["name"], backend, tp, pp, agree(ids, want))
            assert "vision tower's 2 tensors (model.visual.*) are not loaded" in err, err[-800:]
        print(f"  {o['name']} as {config['architectures'][0]} (3 shards): llama.cpp's {o['n']} ids at "
              + ", ".join(f"{b} tp {t} x pp {p}" for b, t, p in layouts) + "; the vision tower skipped, logged")


@case
def plan_lays_out_the_published_sizes_on_six_devices():
    """Qwen3.8-27B in BF16 and Q4_K_M and Qwen3.6-35B-A3B in Q4_K_M on 6 x 24 GiB, Qwen3.5-397B-A17B in
    Q4_K_M on 6 x 80 GiB: a layout each, DeltaNet K heads split in block-aligned units (ssm_out's 128
    columns per V head: pairs of K heads under Q4_K's 256-column blocks, single heads in BF16)."""
    cases = [("qwen3.8-27b", "bf16", "6x24GiB", "0-1 (2) + 6 V, 2-4 (3) + 9 V, 5-7 (3) + 9 V"),
             ("qwen3.8-27b", "q4_k_m", "6x24GiB", "0-1 (2) + 6 V, 2-3 (2) + 6 V, 4-7 (4) + 12 V"),
             ("qwen3.6-35b-a3b", "q4_k_m", "6x24GiB", "0-1 (2) + 4 V, 2-3 (2) + 4 V, 4-7 (4) + 8 V"),
             ("qwen3.5-397b-a17b", "q4_k_m", "6x80GiB", "0-1 (2) + 8 V, 2-3 (2) + 8 V, 4-7 (4) + 16 V")]
    for shape, weights, devices, split in cases:
        text = run("plan", "--shape", shape, "--weights", weights, "--devices", devices, "--tp", "6").stdout.decode()
        said = " ".join(text.split())
        assert "Gated DeltaNet" in said and split in said, (shape, weights, said[:3000])
        verdict = [line for line in text.splitlines() if line.startswith(("Fits", "Does not fit", "Refused"))]
        pool = [line for line in text.splitlines() if line.startswith("KV pool:")]
        assert verdict and pool, text[-1500:]
        print(f"  plan --shape {shape} --weights {weights} --devices {devices} --tp 6: {verdict[0]} {pool[0]}")


@case
def the_server_answers_with_generates_text_and_frees_every_state_slot():
    for o in oracles():
        path = made(o)
        want = run("generate", "--model", path, "--prompt", o["prompt"], "-n", "32", "--temp", "0",
                   "--ignore-eos").stdout.decode()
        want = want[:-1] if want.endswith("\n") else want  # generate ends its output with a newline
        d = daemon_harness.Daemon(SEXTANT, path, max_num_seqs=8)
        try:
            name = os.path.basename(path)[:-5]
            texts = []
            for _ in range(2):  # the second time a prefix cache would be warm
                st, body = daemon_harness.post(d.port, "/v1/completions", {"model": name, "prompt": o["prompt"],
                                                                             "max_tokens": 32, "temperature": 0,
                                                                             "ignore_eos": True})
                assert st == 200, body
                texts.append(json.loads(body)["choices"][0]["text"])
            assert texts == [want, want], (texts, want)
            # Eight clients streaming for a few seconds, then every slot back.
            load = daemon_harness.Load(d.port, 8, lambda i: o["prompt"][: 5 + 2 * i], name)
            time.sleep(4)
            ok, failures = load.finish()
            assert not failures and ok >= 8, (ok, failures[:3])
            daemon_harness.wait_idle(d)
            status = d.status()
            said = json.dumps(status)
            assert '"state_slots": {"free": 8, "total": 8}' in said, said[:3000]
            cache = status["prefix_cache"]
            assert cache["enabled"] and cache["snapshots"]["restored"] > 0, cache
            print(f"  {o['name']} served: /v1/completions twice gives generate's text (the second from the prefix "
                  f"cache: {cache['snapshots']['restored']} snapshots restored in all); {ok} streamed requests; "
                  "8 of 8 state slots free")
        finally:
            d.stop()


daemon_harness.run_cases("SX_QWEN35_ONLY")
shutil.rmtree(TMP, ignore_errors=True)
daemon_harness.summary_exit()
