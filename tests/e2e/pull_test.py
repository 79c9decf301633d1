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
What a hostile or broken hub does (issue 53), each refused once with a message naming the file or
the request and the bound, never retried as a network error:
  * a file sent past its listed size (8 MiB more, a body that never ends, an endless gzip body):
    stopped the moment it passes the size, the .partial never longer than the listed size;
  * a listing that never ends: cut at its size bound (as fast as it comes) or its deadline (a
    trickle; SEXTANT_HUB_TIMEOUT), for `pull` and `serve --pull`;
  * two pulls of one repository on one cache while the hub ignores Range: the second waits for the
    first, and a blob on disk hashes to its name from the moment it has it;
  * redirects to ftp://, file:// and gopher://: not followed (no connection to the ftp port);
  * a listing with a path outside the repository: refused with advice that can help;
  * a full disk (a 1 MiB tmpfs, or RLIMIT_FSIZE where no tmpfs can be mounted): the write error
    itself, once; --revision ../../x: refused before any request.

Usage: pull_test.py SEXTANT_BINARY MODELS_DIR. Prints "N passed, N failed"."""
import glob
import hashlib
import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
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


def pull(home, *args, check=True, timeout=120, preexec_fn=None, **more):
    p = subprocess.run([SEXTANT, "pull", *args], capture_output=True, env=env(home, **more), timeout=timeout,
                       preexec_fn=preexec_fn)
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


class LargestFile:
    """The largest size any file in `folder` reaches while it runs (polled every 2 ms)."""

    def __init__(self, folder):
        self.folder, self.largest, self._stop = folder, 0, threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self):
        while not self._stop.is_set():
            for x in glob.glob(os.path.join(self.folder, "*")):
                try:
                    self.largest = max(self.largest, os.path.getsize(x))
                except OSError:
                    pass
            time.sleep(0.002)

    def stop(self):
        self._stop.set()
        self._thread.join()
        return self.largest


def git_blob_id(data):
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def blob_mismatches(blobs):
    """Blobs in `blobs` whose bytes do not hash to their name (SHA-256, or git's blob id)."""
    bad = []
    for x in glob.glob(os.path.join(blobs, "*")):
        name = os.path.basename(x)
        if len(name) not in (40, 64):
            continue
        data = open(x, "rb").read()
        got = hashlib.sha256(data).hexdigest() if len(name) == 64 else git_blob_id(data)
        if got != name:
            zeros = data.count(b"\0" * 4096) * 4096
            bad.append(f"{name[:12]}: {got[:12]} ({len(data)} bytes, ~{zeros} of them in runs of zeros)")
    return bad


@case
def a_file_sent_past_its_listed_size_is_stopped_at_it():
    name = "model-00002-of-00003.safetensors"
    size = os.path.getsize(os.path.join(ROOT, "test-org", "memorise", name))
    said = []
    for what, how in (("8 MiB more, no Content-Length", {"extra_bytes": 8 << 20}),
                      ("8 MiB more with a Content-Length", {"extra_bytes": 8 << 20, "content_length": True}),
                      ("a body that never ends", {"extra_bytes": -1}),
                      ("an endless gzip body", {"extra_bytes": -1, "encoding": "gzip"})):
        home = fresh_home("oversize")
        MIRROR.control({"oversize": {"path": f"test-org/memorise/{name}", **how}})
        blobs = os.path.join(repo_dir(home, "test-org/memorise"), "blobs")
        watch = LargestFile(blobs)
        t0 = time.time()
        try:
            rc, out, err = pull(home, "test-org/memorise", "--include", name, check=False, timeout=30)
        finally:
            largest = watch.stop()
        took = time.time() - t0
        gets = resolve_gets(MIRROR.stats(), name)
        assert rc != 0, (what, out)
        assert name in err and f"{size} bytes" in err and "more than" in err, (what, err[-1500:])
        assert "download or copy it again" not in err, (what, err[-1500:])
        assert len(gets) == 1, (what, len(gets), err[-1500:])
        assert largest <= size, (what, largest, size)
        assert not os.path.isdir(blobs) or not os.listdir(blobs), (what, os.listdir(blobs))
        said.append(f"{what}: {took:.2f} s, 1 request, the file never over {largest} bytes")
    line = [ln for ln in err.splitlines() if "more than" in ln][-1]
    print(f"  {name} listed as {size} bytes: " + "; ".join(said) + f"\n  {line[:300]}")


@case
def a_listing_that_never_ends_is_cut_at_its_bounds():
    home = fresh_home("endless-listing")
    listing_gets = lambda: [r for r in MIRROR.stats()["requests"] if r["path"].startswith("/api/")]  # noqa: E731
    MIRROR.control({"listing": {"repo": "test-org/memorise", "endless": True}})
    t0 = time.time()
    rc, out, err = pull(home, "test-org/memorise", check=False, timeout=60)
    fast = time.time() - t0
    assert rc != 0 and "64 MiB" in err and "listing" in err and "test-org/memorise" in err and ENDPOINT in err, \
        err[-1500:]
    assert len(listing_gets()) == 1, len(listing_gets())
    size_line = [ln for ln in err.splitlines() if "64 MiB" in ln][-1]
    # A trickle never passes the size: the deadline stops it, pull's and serve --pull's alike.
    MIRROR.control({"reset": True, "listing": {"repo": "test-org/memorise", "endless": True, "bytes_per_second": 200}})
    t0 = time.time()
    rc, out, err = pull(home, "test-org/memorise", check=False, timeout=60, SEXTANT_HUB_TIMEOUT="2")
    slow = time.time() - t0
    assert rc != 0 and "2 s" in err and "SEXTANT_HUB_TIMEOUT" in err and "test-org/memorise" in err, err[-1500:]
    assert len(listing_gets()) == 1 and slow < 10, (len(listing_gets()), slow)
    time_line = [ln for ln in err.splitlines() if "SEXTANT_HUB_TIMEOUT" in ln][-1]
    t0 = time.time()
    p = subprocess.run([SEXTANT, "serve", "--model", "test-org/memorise", "--pull", "--port", "0"], capture_output=True,
                       env=env(home, SEXTANT_HUB_TIMEOUT="2"), timeout=60)
    served = time.time() - t0
    said = p.stderr.decode(errors="replace")
    assert p.returncode != 0 and "SEXTANT_HUB_TIMEOUT" in said and served < 15, (p.returncode, served, said[-1500:])
    print(f"  endless listing: refused after {fast:.2f} s, 1 request ({size_line[:200]}); a trickle: after "
          f"{slow:.2f} s ({time_line[:200]}); serve --pull: exit {p.returncode} after {served:.2f} s")


@case
def two_pulls_of_one_repository_keep_each_blob_true_to_its_name():
    home = fresh_home("two-pulls")
    shard = "model-00002-of-00003.safetensors"
    data = open(os.path.join(ROOT, "test-org", "memorise", shard), "rb").read()
    sha = hashlib.sha256(data).hexdigest()
    blobs = os.path.join(repo_dir(home, "test-org/memorise"), "blobs")
    MIRROR.control({"ignore_range": True, "throttle": {"bytes_per_second": 400_000}})
    args = [SEXTANT, "pull", "test-org/memorise", "--include", shard]
    first = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env(home))
    partial = os.path.join(blobs, sha + ".partial")
    deadline = time.time() + 30
    while time.time() < deadline and not (os.path.exists(partial) and os.path.getsize(partial) > 0.6 * len(data)):
        time.sleep(0.01)
    second = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env(home))
    # The blob, the moment it has its name: its bytes must be the file's.
    at_first_sight = None
    deadline = time.time() + 60
    while time.time() < deadline and at_first_sight is None:
        if os.path.exists(os.path.join(blobs, sha)):
            at_first_sight = hashlib.sha256(open(os.path.join(blobs, sha), "rb").read()).hexdigest()
        elif first.poll() is not None and second.poll() is not None:
            break
        time.sleep(0.002)
    out1, err1 = first.communicate(timeout=60)
    out2, err2 = second.communicate(timeout=60)
    err1, err2 = err1.decode(errors="replace"), err2.decode(errors="replace")
    MIRROR.control({"throttle": None})
    assert at_first_sight == sha, f"the blob appeared as {at_first_sight} (not its name {sha[:12]}); " \
                                  f"now: {blob_mismatches(blobs)}"
    assert not blob_mismatches(blobs), blob_mismatches(blobs)
    assert first.returncode == 0 and second.returncode == 0, (first.returncode, err1[-1500:], second.returncode,
                                                              err2[-1500:])
    assert "waiting" in err2, err2[-1500:]
    gets = resolve_gets(MIRROR.stats(), shard)
    assert len(gets) == 1, [g["range"] for g in gets]
    snap, _ = snapshot(home, "test-org/memorise")
    assert open(os.path.join(snap, shard), "rb").read() == data
    print(f"  the second pull: {[ln for ln in err2.splitlines() if 'waiting' in ln][0][:200]}; then "
          f"{out2.decode().strip().splitlines()[0][:120]}; the blob hashed to its name when it appeared; 1 request")


class Listener:
    """A TCP port that records who connects (an FTP server's banner, then silence)."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port, self.connections = self.sock.getsockname()[1], 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            try:
                c.sendall(b"220 hub_mirror ftp\r\n")
            except OSError:
                pass

    def close(self):
        self.sock.close()


@case
def redirects_to_other_protocols_are_refused_once():
    ftp = Listener()
    said = []
    try:
        for where, location in (("file", f"ftp://127.0.0.1:{ftp.port}/config.json"),
                                ("file", "file:///etc/passwd"),
                                ("file", f"gopher://127.0.0.1:{ftp.port}/1"),
                                ("listing", f"ftp://127.0.0.1:{ftp.port}/listing")):
            home = fresh_home("redirect")
            path = "test-org/memorise/config.json" if where == "file" else "test-org/memorise"
            MIRROR.control({"redirect": {"path": path, "location": location}})
            t0 = time.time()
            rc, out, err = pull(home, "test-org/memorise", "--include", "config.json", check=False, timeout=60)
            took = time.time() - t0
            scheme = location.split(":")[0]
            asked = [r for r in MIRROR.stats()["requests"] if r["status"] == 302]
            assert rc != 0 and f"{scheme}://" in err and "not follow" in err, (location, err[-1500:])
            assert len(asked) == 1 and took < 10, (location, len(asked), took, err[-1500:])
            said.append(f"{scheme} ({where}): {took:.2f} s, 1 request")
        assert ftp.connections == 0, f"{ftp.connections} connection(s) to the ftp:// port"
    finally:
        ftp.close()
    line = [ln for ln in err.splitlines() if "not follow" in ln][-1]
    print(f"  redirects: {'; '.join(said)}; no connection to the ftp port\n  {line[:300]}")


@case
def a_listing_with_a_path_outside_the_repository_gets_advice_that_helps():
    home = fresh_home("hostile-listing")
    body = json.dumps({"sha": "1" * 40, "siblings": [{"rfilename": "../../escape.json", "size": 2,
                                                      "blobId": "2" * 40}]})
    MIRROR.control({"listing": {"repo": "test-org/memorise", "body": body}})
    rc, out, err = pull(home, "test-org/memorise", check=False)
    assert rc != 0 and "outside the repository" in err, err[-1500:]
    assert "download or copy it again" not in err, err[-1500:]
    assert "another endpoint" in err, err[-1500:]
    assert not resolve_gets(MIRROR.stats())
    print(f"  {[ln for ln in err.splitlines() if 'cause' in ln][-1][:300]}")


@case
def a_full_disk_is_the_error_itself_not_a_retry():
    home = fresh_home("full")
    shard = "model-00001-of-00003.safetensors"
    hub = os.path.join(home, "hub")
    os.makedirs(hub)
    mounted = os.geteuid() == 0 and subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", hub],
                                                   capture_output=True).returncode == 0
    limit = None
    if not mounted:  # no tmpfs: a file size limit fails the same fwrite (EFBIG)
        def limit():
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
    try:
        rc, out, err = pull(home, "test-org/memorise", "--include", shard, check=False, timeout=60, preexec_fn=limit)
    finally:
        if mounted:
            subprocess.run(["umount", hub], check=True)
    why = "No space left on device" if mounted else "File too large"
    gets = resolve_gets(MIRROR.stats(), shard)
    assert rc != 0 and why in err and ".partial" in err, err[-1500:]
    assert len(gets) == 1, (len(gets), err[-1500:])
    assert not mounted or "free space" in err, err[-1500:]  # the catalogue's cause and fix
    print(f"  {'a 1 MiB tmpfs' if mounted else 'RLIMIT_FSIZE 1 MiB'}: 1 request, then "
          f"{[ln for ln in err.splitlines() if why in ln][-1][:300]}")


@case
def a_revision_that_leaves_the_cache_is_refused():
    home = fresh_home("revision")
    MIRROR.control({"any_revision": True})
    said = []
    for rev in ("../../../escaped", "a/../../b", "main\n", "/abs", "a\\b"):
        rc, out, err = pull(home, "test-org/memorise", "--revision", rev, check=False)
        assert rc == 2 and "--revision" in err, (rev, rc, err[-1500:])
        said.append(err.strip().splitlines()[-1])
    assert not MIRROR.stats()["requests"], MIRROR.stats()["requests"][:2]
    assert not os.path.exists(os.path.join(home, "escaped")), os.listdir(home)
    pull(home, "test-org/memorise", "--revision", "refs/pr/1", "--include", "config.json")
    assert os.path.isfile(os.path.join(repo_dir(home, "test-org/memorise"), "refs", "refs", "pr", "1"))
    print(f"  ../../../escaped, a/../../b, a newline, /abs, a backslash: refused before any request, exit 2 "
          f"({said[0][:200]}); refs/pr/1 accepted")


daemon_harness.run_cases("SX_PULL_ONLY")
MIRROR.stop()
shutil.rmtree(TMP, ignore_errors=True)
daemon_harness.summary_exit()
