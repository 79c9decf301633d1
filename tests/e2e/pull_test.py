"""`sextant pull` (issue 43) against a loopback imitation of the Hugging Face Hub (hub_mirror.py, started
here) serving repositories made from the bundled model: a sharded safetensors repository
(test-org/memorise, 3 shards), a GGUF repository with several quantisations and a split file
(test-org/memorise-GGUF), a gated copy (gated-org/memorise) and one whose index names a shard it lacks
(test-org/memorise-broken). Checked:
  * a clean pull lays out the Hugging Face cache (blobs, snapshots, refs, SHA256SUMS), `ls` says
    verified, and `serve --model test-org/memorise` serves the bundled answer under that name;
  * a connection dropped mid-shard several times resumes (the bytes served for it are counted);
  * a corrupt shard is caught by its SHA-256, fetched again, then fails naming it, nothing renamed;
  * a pull killed with SIGKILL, or stopped with Ctrl-C, and run again completes from its .partial
    files (a Range request);
  * 429 with Retry-After is waited out; a gated repository is refused without a token, naming
    HF_TOKEN, and pulled with one;
  * a missing shard is refused: by pull (from the index) and by serve (a cache that lost one);
  * serve --model of a model not in the cache: refused naming `sextant pull`, pulled with --pull;
  * GGUF quantisations (one file; a split file's every part; no quant: an error listing them);
  * huggingface_hub.snapshot_download's cache is served with no request to the hub, and its
    snapshot_download makes no download after a `sextant pull`;
  * ModelScope's API (ms: prefix) and --local-dir.

Usage: pull_test.py SEXTANT_BINARY MODELS_DIR. Prints "N passed, N failed"."""
import glob
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import daemon_harness  # noqa: E402
from hub_mirror import Mirror  # noqa: E402

SEXTANT, MODELS = sys.argv[1], sys.argv[2]
REF = json.load(open(os.path.join(MODELS, "reference.json")))
case = daemon_harness.case
TMP = tempfile.mkdtemp(prefix="sx-pull-")
ROOT = os.path.join(TMP, "hub")
VENV_PYTHON = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".venv-test", "bin", "python")


def make_repos():
    st = os.path.join(ROOT, "test-org", "memorise")
    subprocess.run([SEXTANT, "make-model", "--format", "safetensors", "--type", "f32", "--shards", "3", "--from",
                    os.path.join(MODELS, "memorise-f32.gguf"), "--out", st], check=True, stdout=subprocess.DEVNULL)
    shutil.copytree(st, os.path.join(ROOT, "gated-org", "memorise"))
    broken = os.path.join(ROOT, "test-org", "memorise-broken")
    shutil.copytree(st, broken)
    os.remove(os.path.join(broken, "model-00002-of-00003.safetensors"))
    gguf = os.path.join(ROOT, "test-org", "memorise-GGUF")
    os.makedirs(gguf)
    for q in ("F32", "F16", "Q8_0"):
        shutil.copy(os.path.join(MODELS, f"memorise-{q.lower()}.gguf"), os.path.join(gguf, f"memorise-{q}.gguf"))
    data = open(os.path.join(MODELS, "memorise-q8_0.gguf"), "rb").read()  # a file in two parts
    for i, part in enumerate((data[: len(data) // 2], data[len(data) // 2:])):
        open(os.path.join(gguf, f"memorise-Q4_0-{i + 1:05d}-of-00002.gguf"), "wb").write(part)
    open(os.path.join(gguf, "README.md"), "w").write("GGUF quantisations of the bundled model\n")


make_repos()
MIRROR = Mirror(ROOT)
PORT = MIRROR.start()
ENDPOINT = f"http://127.0.0.1:{PORT}"


def env(home, **more):
    e = dict(os.environ, HF_ENDPOINT=ENDPOINT, HF_HOME=home, MODELSCOPE_DOMAIN=ENDPOINT, HF_HUB_DISABLE_TELEMETRY="1",
             HF_HUB_DISABLE_XET="1", HF_HUB_DISABLE_PROGRESS_BARS="1")
    e.pop("HF_TOKEN", None)
    e.pop("HF_HUB_CACHE", None)
    e.update(more)
    return e


def fresh_home(name):
    home = os.path.join(TMP, "home-" + name)
    shutil.rmtree(home, ignore_errors=True)
    os.makedirs(home)
    MIRROR.control({"reset": True})
    return home


def pull(home, *args, check=True, timeout=120, **more):
    p = subprocess.run([SEXTANT, "pull", *args], capture_output=True, env=env(home, **more), timeout=timeout)
    out, err = p.stdout.decode(errors="replace"), p.stderr.decode(errors="replace")
    if check and p.returncode != 0:
        raise AssertionError(f"sextant pull {' '.join(args)} exited {p.returncode}:\n{out}\n{err[-3000:]}")
    return p.returncode, out, err


def repo_dir(home, repo):
    return os.path.join(home, "hub", "models--" + repo.replace("/", "--"))


def snapshot(home, repo, ref="main"):
    root = repo_dir(home, repo)
    commit = open(os.path.join(root, "refs", ref)).read().strip()
    return os.path.join(root, "snapshots", commit), commit


def source_files(repo):
    base = os.path.join(ROOT, repo)
    return {os.path.relpath(p, base): p for p in glob.glob(os.path.join(base, "**"), recursive=True) if os.path.isfile(p)}


def greedy(home, model, n=24):
    p = subprocess.run([SEXTANT, "generate", "--model", model, "--prompt", REF["prompt_text"], "-n", str(n), "--temp",
                        "0", "--ids"], capture_output=True, env=env(home), timeout=120)
    assert p.returncode == 0, p.stderr.decode(errors="replace")[-2000:]
    return [int(x) for x in p.stdout.split()]


def served_text(home, model, *flags, n=32):
    """`serve --model MODEL`'s greedy completion of the bundled prompt, asked for under that name."""
    d = daemon_harness.Daemon(SEXTANT, model, *flags, env=env(home))
    try:
        st, body = daemon_harness.post(d.port, "/v1/completions", {"model": model, "prompt": REF["prompt_text"],
                                                                     "max_tokens": n, "temperature": 0})
        assert st == 200, body
        return json.loads(body)["choices"][0]["text"]
    finally:
        d.stop()


def resolve_gets(stats, name=None):
    return [r for r in stats["requests"] if r["method"] == "GET" and "/resolve/" in r["path"]
            and (name is None or r["path"].endswith("/" + name))]


@case
def a_clean_pull_lays_out_the_cache_and_serves_the_bundled_answer():
    home = fresh_home("clean")
    _, out, err = pull(home, "test-org/memorise")
    snap, commit = snapshot(home, "test-org/memorise")
    want = source_files("test-org/memorise")
    for rel, src in want.items():
        path = os.path.join(snap, rel)
        assert os.path.islink(path) and os.readlink(path).startswith("../../blobs/"), path
        assert open(path, "rb").read() == open(src, "rb").read(), rel
    sums = open(os.path.join(snap, "SHA256SUMS")).read().splitlines()
    assert sorted(line[66:] for line in sums) == sorted(want), sums
    assert not glob.glob(os.path.join(repo_dir(home, "test-org/memorise"), "blobs", "*.partial"))
    assert commit == MIRROR.repos()["test-org/memorise"], commit
    ls = subprocess.run([SEXTANT, "ls"], capture_output=True, env=env(home), check=True).stdout.decode()
    line = [ln for ln in ls.splitlines() if ln.startswith("test-org/memorise ")]
    assert line and " verified " in line[0] and "main" in line[0], ls
    # serve names it by its repository and gives the bundled answer.
    got = served_text(home, "test-org/memorise")
    assert REF["continuation_text"].startswith(got) and len(got) > 20, (got, REF["continuation_text"][:200])
    rc, _, err = pull(home, "test-org/memorise", "--revision", commit)  # all cached: nothing fetched
    assert "0 fetched" in _, _
    print(f"  pulled {len(want)} files at {commit[:12]}; `ls`: {line[0].split()[-2]}; serve --model test-org/memorise "
          f"gives the bundled text ({len(got)} chars); a second pull fetches nothing")


@case
def a_connection_dropped_mid_shard_resumes():
    home = fresh_home("drop")
    shard = "model-00002-of-00003.safetensors"
    size = os.path.getsize(os.path.join(ROOT, "test-org", "memorise", shard))
    MIRROR.control({"drop": {"path": f"test-org/memorise/{shard}", "times": 3, "after_bytes": size // 5}})
    _, out, err = pull(home, "test-org/memorise")
    snap, _ = snapshot(home, "test-org/memorise")
    assert open(os.path.join(snap, shard), "rb").read() == open(os.path.join(ROOT, "test-org", "memorise", shard), "rb").read()
    stats = MIRROR.stats()
    gets = resolve_gets(stats, shard)
    served = stats["bytes"][f"test-org/memorise/{shard}"]
    ranges = [g["range"] for g in gets]
    assert len(gets) == 4 and ranges[0] is None and all(r and r.startswith("bytes=") for r in ranges[1:]), ranges
    assert served <= size + 3 * 65536, (served, size)
    assert "resuming" in err, err[-2000:]
    print(f"  {shard} ({size} bytes) dropped 3 times after {size // 5} bytes each: 4 requests ({', '.join(map(str, ranges))}),"
          f" {served} bytes served in all ({served - size} more than the file)")


@case
def a_corrupt_shard_is_caught_retried_and_named():
    home = fresh_home("corrupt")
    shard = "model-00003-of-00003.safetensors"
    MIRROR.control({"corrupt": {"path": f"test-org/memorise/{shard}", "times": -1}})
    rc, out, err = pull(home, "test-org/memorise", check=False)
    assert rc != 0, out
    assert shard in err and "SHA-256" in err and "nothing was kept" in err, err[-2000:]
    gets = resolve_gets(MIRROR.stats(), shard)
    assert len(gets) == 5, len(gets)
    root = repo_dir(home, "test-org/memorise")
    blobs = os.listdir(os.path.join(root, "blobs")) if os.path.isdir(os.path.join(root, "blobs")) else []
    sha = hashlib.sha256(open(os.path.join(ROOT, "test-org", "memorise", shard), "rb").read()).hexdigest()
    assert sha not in blobs and not any(b.startswith(sha) for b in blobs), blobs
    assert not os.path.isdir(os.path.join(root, "snapshots")) or not glob.glob(os.path.join(root, "snapshots", "*", shard))
    print(f"  {shard} served corrupt: caught by SHA-256 {len(gets)} times, then: "
          f"{[ln for ln in err.splitlines() if 'corrupt' in ln][-1][:220]}")


def a_pull_under_way(home, partial_bytes):
    """`sextant pull test-org/memorise` from a throttled hub, once a .partial file holds `partial_bytes`:
    the process (stdout and stderr piped) and the blobs folder."""
    MIRROR.control({"throttle": {"bytes_per_second": 400_000}})
    p = subprocess.Popen([SEXTANT, "pull", "test-org/memorise"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         env=env(home))
    blobs = os.path.join(repo_dir(home, "test-org/memorise"), "blobs")
    deadline = time.time() + 30
    while time.time() < deadline and not any(os.path.getsize(x) > partial_bytes
                                              for x in glob.glob(os.path.join(blobs, "*.partial"))):
        time.sleep(0.05)
    return p, blobs


@case
def a_killed_pull_completes_on_the_next_run():
    home = fresh_home("killed")
    p, blobs = a_pull_under_way(home, 200_000)
    p.send_signal(signal.SIGKILL)
    p.communicate()
    kept = {x: os.path.getsize(x) for x in glob.glob(os.path.join(blobs, "*.partial"))}
    assert kept and max(kept.values()) > 200_000, kept
    MIRROR.control({"throttle": None})
    _, out, err = pull(home, "test-org/memorise")
    snap, _ = snapshot(home, "test-org/memorise")
    for rel, src in source_files("test-org/memorise").items():
        assert open(os.path.join(snap, rel), "rb").read() == open(src, "rb").read(), rel
    resumed = [g for g in resolve_gets(MIRROR.stats()) if g["range"] and not g["range"].startswith("bytes=0-")]
    assert resumed, "no Range request after the kill"
    total = sum(os.path.getsize(s) for s in source_files("test-org/memorise").values())
    served = sum(MIRROR.stats()["bytes"].values())
    assert served <= total + len(kept) * 65536 + 65536, (served, total)
    print(f"  killed with {len(kept)} partial file(s) ({sum(kept.values())} bytes kept); the next pull resumed "
          f"{len(resumed)} with Range ({resumed[0]['range']}); {served} bytes served for {total} bytes of files")


@case
def ctrl_c_keeps_the_partial_files_for_the_next_pull():
    home = fresh_home("sigint")
    p, blobs = a_pull_under_way(home, 100_000)
    t0 = time.time()
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=30)
    took = time.time() - t0
    err = err.decode(errors="replace")
    kept = glob.glob(os.path.join(blobs, "*.partial"))
    assert p.returncode == 1 and "interrupted" in err and kept, (p.returncode, err[-1500:], kept)
    assert took < 5, took
    MIRROR.control({"throttle": None})
    pull(home, "test-org/memorise")
    snap, _ = snapshot(home, "test-org/memorise")
    for rel, src in source_files("test-org/memorise").items():
        assert open(os.path.join(snap, rel), "rb").read() == open(src, "rb").read(), rel
    print(f"  Ctrl-C: exit 1 in {took:.2f} s, {len(kept)} .partial file(s) kept ("
          f"{[ln for ln in err.splitlines() if 'interrupted' in ln][-1][:150]}); the next pull completed")


@case
def too_many_requests_waits_for_retry_after():
    home = fresh_home("429")
    MIRROR.control({"too_many": {"count": 2, "retry_after": 1}})
    t0 = time.time()
    _, out, err = pull(home, "test-org/memorise")
    took = time.time() - t0
    assert "429" in err and "Retry-After" in err, err[-2000:]
    times = MIRROR.stats()["too_many_times"]
    after = [r["time"] for r in MIRROR.stats()["requests"] if r["status"] != 429]
    assert len(times) == 2 and min(after) - max(times) >= 0.9, (times, after[:3])
    print(f"  two 429s with Retry-After 1: waited, then pulled in {took:.1f} s")


@case
def a_gated_repository_needs_a_token():
    home = fresh_home("gated")
    MIRROR.control({"gated": {"repo": "gated-org/memorise", "token": "hf_test_token"}})
    rc, out, err = pull(home, "gated-org/memorise", check=False)
    assert rc != 0 and "gated or private" in err and "HF_TOKEN" in err and "401" in err, err[-1500:]
    said = [ln for ln in err.splitlines() if "gated" in ln]
    rc, out, err = pull(home, "gated-org/memorise", check=False, HF_TOKEN="wrong")
    assert rc != 0 and "403" in err and "refused" in err, err[-1500:]
    pull(home, "gated-org/memorise", HF_TOKEN="hf_test_token")
    snap, _ = snapshot(home, "gated-org/memorise")
    assert os.path.exists(os.path.join(snap, "model-00001-of-00003.safetensors"))
    print(f"  without a token: refused ({said[-1][:160] if said else err.strip()[-160:]}); with HF_TOKEN: pulled")


@case
def a_missing_shard_is_refused_naming_it():
    home = fresh_home("missing")
    rc, out, err = pull(home, "test-org/memorise-broken", check=False)
    assert rc != 0 and "model-00002-of-00003.safetensors" in err, err[-1500:]
    weights = [g for g in resolve_gets(MIRROR.stats()) if g["path"].endswith(".safetensors")]
    assert not weights, f"pull fetched weights of an incomplete repository: {weights[:2]}"
    # A cache that lost a shard (a deleted blob): serve refuses before reading any weight.
    pull(home, "test-org/memorise")
    snap, _ = snapshot(home, "test-org/memorise")
    os.remove(os.path.realpath(os.path.join(snap, "model-00002-of-00003.safetensors")))
    p = subprocess.run([SEXTANT, "serve", "--model", "test-org/memorise", "--port", "0"], capture_output=True,
                       env=env(home), timeout=60)
    said = p.stdout.decode(errors="replace") + p.stderr.decode(errors="replace")
    assert p.returncode != 0 and "model-00002-of-00003.safetensors" in said and "serve: ready" not in said, said[-2000:]
    print(f"  pull of a repository lacking a shard: refused before any download; serve of a cache that lost one: "
          f"{[ln for ln in said.splitlines() if 'model-00002' in ln][0][:200]}")


@case
def serve_pulls_a_missing_model_only_when_asked():
    home = fresh_home("serve-pull")
    p = subprocess.run([SEXTANT, "serve", "--model", "test-org/memorise", "--port", "0"], capture_output=True,
                       env=env(home), timeout=60)
    said = p.stderr.decode(errors="replace")
    assert p.returncode != 0 and "sextant pull test-org/memorise" in said, said[-1500:]
    assert not MIRROR.stats()["requests"], "serve without --pull asked the hub"
    got = served_text(home, "test-org/memorise", "--pull")
    assert REF["continuation_text"].startswith(got) and len(got) > 20, (got, REF["continuation_text"][:200])
    assert len(resolve_gets(MIRROR.stats())) == 9, len(resolve_gets(MIRROR.stats()))
    print(f"  serve --model test-org/memorise with an empty cache: refused ({said.strip().splitlines()[-1][-110:]}); "
          f"with --pull: pulled, then served the bundled text")


@case
def gguf_quantisations_and_split_files():
    home = fresh_home("gguf")
    pull(home, "test-org/memorise-GGUF:Q8_0")
    snap, _ = snapshot(home, "test-org/memorise-GGUF")
    assert sorted(os.listdir(snap)) == ["SHA256SUMS", "memorise-Q8_0.gguf"], os.listdir(snap)
    ids = greedy(home, "test-org/memorise-GGUF:Q8_0")
    assert ids == REF["continuation_ids"][: len(ids)], ids
    pull(home, "hf:test-org/memorise-GGUF:q4_0")
    assert {"memorise-Q4_0-00001-of-00002.gguf", "memorise-Q4_0-00002-of-00002.gguf"} <= set(os.listdir(snap))
    rc, out, err = pull(home, "test-org/memorise-GGUF", check=False)
    assert rc != 0 and "Q8_0" in err and ":Q4_K_M" in err, err[-1000:]
    rc, out, err = pull(home, "test-org/memorise-GGUF:Q5_K_M", check=False)
    assert rc != 0 and "no Q5_K_M" in err and "memorise-F16.gguf" in err, err[-1000:]
    print("  :Q8_0 fetched one file and generates the bundled ids; :q4_0 both parts of the split file; no quant "
          "and an absent one: refused, listing the files")


@case
def huggingface_hubs_cache_is_shared_both_ways():
    home = fresh_home("interop")
    code = ("import sys; from huggingface_hub import snapshot_download; "
            "print(snapshot_download(sys.argv[1]))")
    p = subprocess.run([VENV_PYTHON, "-c", code, "test-org/memorise"], capture_output=True, env=env(home), timeout=120)
    assert p.returncode == 0, p.stderr.decode(errors="replace")[-2000:]
    MIRROR.control({"reset": True})
    got = served_text(home, "test-org/memorise")
    assert REF["continuation_text"].startswith(got) and len(got) > 20, (got, REF["continuation_text"][:200])
    assert not MIRROR.stats()["requests"], MIRROR.stats()["requests"][:3]
    # The other way: sextant's pull, then snapshot_download downloads nothing.
    home = fresh_home("interop2")
    pull(home, "test-org/memorise")
    MIRROR.control({"reset": True})
    p = subprocess.run([VENV_PYTHON, "-c", code, "test-org/memorise"], capture_output=True, env=env(home), timeout=120)
    assert p.returncode == 0, p.stderr.decode(errors="replace")[-2000:]
    snap, _ = snapshot(home, "test-org/memorise")
    assert p.stdout.decode().strip() == snap, (p.stdout, snap)
    assert not resolve_gets(MIRROR.stats()), resolve_gets(MIRROR.stats())[:3]
    print("  huggingface_hub's cache: serve --model test-org/memorise gave the bundled text with no request to the hub; after sextant "
          "pull, snapshot_download downloaded nothing (same snapshot)")


@case
def modelscope_and_a_local_dir():
    home = fresh_home("ms")
    pull(home, "ms:test-org/memorise")
    snap, commit = snapshot(home, "test-org/memorise", "master")  # ModelScope's default branch
    assert os.path.exists(os.path.join(snap, "model-00003-of-00003.safetensors"))
    ids = greedy(home, "ms:test-org/memorise")
    assert ids == REF["continuation_ids"][: len(ids)], ids
    assert any("/api/v1/models/test-org/memorise/repo" in r["path"] for r in MIRROR.stats()["requests"])
    local = os.path.join(TMP, "local-memorise")
    shutil.rmtree(local, ignore_errors=True)
    pull(home, "test-org/memorise", "--local-dir", local)
    assert sorted(os.listdir(local)) == sorted(list(source_files("test-org/memorise")) + ["SHA256SUMS"]), os.listdir(local)
    ids = greedy(home, local)
    assert ids == REF["continuation_ids"][: len(ids)], ids
    _, out, _ = pull(home, "test-org/memorise", "--local-dir", local)  # verified earlier: only the small files again
    print(f"  ms:test-org/memorise through ModelScope's API; --local-dir {os.path.basename(local)}: a plain folder "
          f"with SHA256SUMS that generates the bundled ids; again: {out.strip().splitlines()[0][:120]}")


daemon_harness.run_cases("SX_PULL_ONLY")
MIRROR.stop()
shutil.rmtree(TMP, ignore_errors=True)
daemon_harness.summary_exit()
