"""A `sextant serve` process for the end-to-end tests (serve_test.py, hostile_test.py): started on
an ephemeral port with its own admin socket, its log kept in a file, and the few ways of talking to
it that the tests share."""
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

CASES = []
results = []  # (name, exception or None) per case run


def case(fn):
    CASES.append(fn)
    return fn


def run_cases(only_env):
    """Runs every @case (or those named, comma-separated, in $only_env), printing PASS / FAIL."""
    only = os.environ.get(only_env, "").split(",") if os.environ.get(only_env) else None
    for fn in CASES:
        if only and fn.__name__ not in only:
            continue
        t0 = time.time()
        try:
            fn()
            results.append((fn.__name__, None))
            print(f"PASS {fn.__name__} ({time.time() - t0:.1f} s)", flush=True)
        except Exception as e:  # noqa: BLE001 - report every failure and go on
            results.append((fn.__name__, e))
            print(f"FAIL {fn.__name__}: {type(e).__name__}: {e}", flush=True)


def summary_exit():
    """Prints "N passed, N failed" and exits 1 when a case failed."""
    failed = [n for n, e in results if e is not None]
    print(f"{len(results) - len(failed)} passed, {len(failed)} failed")
    sys.exit(1 if failed else 0)


class Daemon:
    """A `sextant serve` process on an ephemeral port with its own admin socket."""

    def __init__(self, sextant, model, *extra, max_num_seqs=32, env=None, ready=True, prefix=(), threads=2,
                 popen_kwargs=None, socket=None, max_model_len=512):
        """`socket`: the admin socket a config among `extra` names; the daemon then gets neither
        --port 0 nor --admin-socket (the config's http.port and admin.socket hold)."""
        self.sextant = sextant
        self.dir = tempfile.mkdtemp(prefix="sx-serve-")
        self.socket = socket or os.path.join(self.dir, "admin.sock")
        self.log_path = os.path.join(self.dir, "serve.log")
        self.log = open(self.log_path, "w+b")
        listeners = [] if socket else ["--port", "0", "--admin-socket", self.socket]
        args = [*prefix, sextant, "serve", "--model", model, *listeners,
                *(["-t", str(threads)] if threads else []),
                "--max-num-seqs", str(max_num_seqs), "--max-model-len", str(max_model_len), "--set", "http.header_timeout_ms=2000",
                *extra]
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT, env=env, **(popen_kwargs or {}))
        self.port = None
        deadline = time.time() + 60
        while time.time() < deadline:
            text = self.text()
            m = re.search(r"listening on http://(\[[0-9a-f:]+\]|[0-9.]+):(\d+)", text)
            if m:
                self.host, self.port = m.group(1), int(m.group(2))
            if "serve: ready" in text or (not ready and self.port):
                break
            if self.proc.poll() is not None:
                raise AssertionError(f"serve exited {self.proc.returncode}:\n{text}")
            time.sleep(0.05)
        else:
            raise AssertionError("serve did not become ready in 60 s:\n" + self.text())
        self.base = f"http://{self.host}:{self.port}"

    def text(self):
        with open(self.log_path, "rb") as f:
            return f.read().decode(errors="replace")

    def ctl(self, *args, check=True):
        p = subprocess.run([self.sextant, "ctl", "--socket", self.socket, *args], capture_output=True, timeout=30)
        if check and p.returncode != 0:
            raise AssertionError(f"ctl {args}: {p.returncode} {p.stderr.decode(errors='replace')}")
        return p

    def status(self):
        return json.loads(self.ctl("--json", "status").stdout)

    def sanitized(self):
        """Whether the daemon runs under AddressSanitizer (the sanitizer build of .ci/run), whose
        allocator keeps freed memory in quarantine (up to 256 MiB): there, RSS grows with the bytes
        allocated, not with what is kept, and leaks are LeakSanitizer's to find at exit."""
        with open(f"/proc/{self.proc.pid}/maps") as maps:
            return any("libasan" in line for line in maps)

    def rss_kib(self):
        for line in open(f"/proc/{self.proc.pid}/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        return 0

    def stop(self, sig=signal.SIGTERM, timeout=60):
        """Sends `sig` (None: the daemon was told to shut down; only wait) and waits for the exit."""
        if sig is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
        rc = self.proc.wait(timeout=timeout)
        text = self.text()
        assert "still had open handles" not in text, text[-2000:]
        return rc, text


def stream(port, prompt, max_tokens, model):
    """One streamed completion over raw HTTP: (text, finish_reason). Raises on anything that is not
    a complete, well-formed stream: a status other than 200, a chunk that is not JSON, an error
    event, no finish_reason or no [DONE]."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    c.request("POST", "/v1/completions", headers={"Content-Type": "application/json"},
              body=json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                               "stream": True, "ignore_eos": True}))
    r = c.getresponse()
    if r.status != 200:
        raise AssertionError(f"status {r.status}: {r.read()[:300]!r}")
    text, finish, done = "", None, False
    for line in r.read().decode().split("\n"):
        if not line.startswith("data: "):
            continue
        data = line[6:]
        if data == "[DONE]":
            done = True
            continue
        event = json.loads(data)
        if "error" in event:
            raise AssertionError(f"error event: {event}")
        choice = event["choices"][0]
        text += choice.get("text") or ""
        finish = choice.get("finish_reason") or finish
    c.close()
    if not done or finish is None:
        raise AssertionError(f"incomplete stream: done={done} finish={finish} text={text[:80]!r}")
    return text, finish


class Load:
    """`n` clients streaming completions (`prompt(i)`, 16 tokens) in a loop until stopped, counting
    what went wrong."""

    def __init__(self, port, n, prompt, model):
        self.port, self.prompt, self.model = port, prompt, model
        self.stop_flag, self.ok, self.failures = False, 0, []
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self.client, args=(i,)) for i in range(n)]
        for t in self.threads:
            t.start()

    def client(self, i):
        while not self.stop_flag:
            try:
                text, finish = stream(self.port, self.prompt(i), 16, self.model)
                assert finish == "length" and text, (finish, text)
                with self.lock:
                    self.ok += 1
            except Exception as e:  # noqa: BLE001
                with self.lock:
                    self.failures.append(repr(e))

    def finish(self):
        self.stop_flag = True
        for t in self.threads:
            t.join()
        return self.ok, self.failures


def wait_generation(d, generation, timeout=60):
    """Waits until `generation` is in service with no reload in progress; its status."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        st = d.status()
        if st.get("generation") == generation and "reload" not in st:
            return st
        time.sleep(0.1)
    raise AssertionError(f"generation {generation} not in service after {timeout} s: {d.status()}")


def wait_idle(d, timeout=30):
    """Waits until no request runs or waits and every KV block is free again."""
    deadline = time.time() + timeout
    st = None
    while time.time() < deadline:
        st = d.status()
        q, kv = st["queue"], st["kv_cache"]
        if q["running"] == 0 and q["waiting"] == 0 and kv["free_blocks"] == kv["total_blocks"] and st["in_flight"] == 0:
            return st
        time.sleep(0.1)
    raise AssertionError(f"not idle after {timeout} s: {st}")


def agree(a, b):
    """How many leading ids two greedy runs share."""
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def post(port, path, body, headers=None, timeout=60):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    c.request("POST", path, body=json.dumps(body) if not isinstance(body, (bytes, str)) else body,
              headers={"Content-Type": "application/json", **(headers or {})})
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, data


def make_qwen3(sextant, name, tokenizer, *shape):
    """A random-weight Qwen3 GGUF (`sextant make-model`, Q8_0, a 4096-token context) with `tokenizer`
    (a tokenizer.json) and the `shape` flags (--layers, --hidden, ...) in a new temporary folder: its
    path; the model id is `name`."""
    path = os.path.join(tempfile.mkdtemp(prefix=f"sx-{name}-"), name + ".gguf")
    subprocess.run([sextant, "make-model", "--arch", "qwen3", "--ctx", "4096", "--type", "q8_0", *shape,
                    "--tokenizer", tokenizer, "--out", path], check=True, stdout=subprocess.DEVNULL)
    return path


def hybrid_oracles(oracle_dir):
    """The qwen35 / qwen35moe oracle specs of tests/data/oracle, name order."""
    import glob
    return [json.load(open(p)) for p in sorted(glob.glob(os.path.join(oracle_dir, "qwen35*.json")))]


def made_oracle(sextant, spec, directory):
    """The oracle file of `spec` in `directory`, made by `make-model` the first time."""
    path = os.path.join(directory, spec["name"] + ".gguf")
    if not os.path.exists(path):
        subprocess.run([sextant, "make-model", *spec["make_model"], "--out", path], check=True, capture_output=True,
                       timeout=300)
    return path


def get(port, path, timeout=30):
    """A GET: its status and its body as text."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    c.request("GET", path)
    r = c.getresponse()
    body = r.read()
    c.close()
    return r.status, body.decode()


def raw(port, data, read_timeout=5.0):
    """Sends bytes, returns everything the server sends until it closes or goes quiet."""
    s = socket.create_connection(("127.0.0.1", port), timeout=read_timeout)
    try:
        s.sendall(data)
        out = b""
        while True:
            try:
                chunk = s.recv(65536)
            except socket.timeout:
                break
            if not chunk:
                break
            out += chunk
        return out
    finally:
        s.close()
