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
                 popen_kwargs=None):
        self.sextant = sextant
        self.dir = tempfile.mkdtemp(prefix="sx-serve-")
        self.socket = os.path.join(self.dir, "admin.sock")
        self.log_path = os.path.join(self.dir, "serve.log")
        self.log = open(self.log_path, "w+b")
        args = [*prefix, sextant, "serve", "--model", model, "--port", "0", "--admin-socket", self.socket,
                *(["-t", str(threads)] if threads else []),
                "--max-num-seqs", str(max_num_seqs), "--max-model-len", "512", "--set", "http.header_timeout_ms=2000",
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


def post(port, path, body, headers=None, timeout=60):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    c.request("POST", path, body=json.dumps(body) if not isinstance(body, (bytes, str)) else body,
              headers={"Content-Type": "application/json", **(headers or {})})
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, data


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
