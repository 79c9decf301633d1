"""A loopback imitation of the parts of the Hugging Face Hub HTTP API (and a little of ModelScope's)
that a model downloader uses, so the end-to-end tests can run `sextant pull` and
`huggingface_hub.snapshot_download` with no network.

    python3 tests/e2e/hub_mirror.py --root DIR [--port 0] [--port-file FILE]

or, in-process:

    from hub_mirror import Mirror
    m = Mirror(root); port = m.start(); ...; m.control({...}); m.stats(); m.stop()

Every directory ROOT/ORG/NAME holding files is the repository "ORG/NAME" at a single revision (its
commit is derived from the files' contents). Files ending in .safetensors, .gguf or .bin are "LFS"
files (ETag = sha256), the others plain git files (ETag = git blob sha1).

Hugging Face routes:
    GET  /api/models/ORG/NAME[/revision/REV]          repo info with siblings
    GET  /api/models/ORG/NAME/tree/REV[/SUB][?recursive=true]
    HEAD|GET /ORG/NAME/resolve/REV/PATH               file bytes (Range: bytes=A-, A-B, -N)
ModelScope routes:
    GET  /api/v1/models/ORG/NAME/repo/files?Revision=REV&Recursive=true
    GET  /api/v1/models/ORG/NAME/repo?Revision=REV&FilePath=PATH
Test routes:
    POST /_control   JSON body, see Mirror.control
    GET  /_stats     see Mirror.stats

Misbehaviours (Mirror.control) imitate a hostile or broken hub: dropped connections, corrupt bytes,
429, gated repositories, a slow link, a file sent past its listed size (no Content-Length, an
endless body, a gzip body the client never asked for), a listing that never ends (fast or a
trickle), a listing with any body, Range ignored, redirects to anywhere (ftp://, file://), any
revision accepted.

REV is "main" (Hugging Face) or "master" (ModelScope), or the commit hash.
"""
import argparse
import copy
import hashlib
import http.server
import json
import os
import re
import signal
import socket
import sys
import threading
import time
import urllib.parse
import zlib

CHUNK = 64 * 1024
LFS_SUFFIXES = (".safetensors", ".gguf", ".bin")
POINTER_SIZE = 134
TIMESTAMP = "2026-01-01T00:00:00.000Z"
VERBOSE = bool(os.environ.get("HUB_MIRROR_VERBOSE"))


class RepoFile:
    __slots__ = ("path", "abspath", "size", "sha256", "blob", "lfs")

    def __init__(self, path, abspath, size, sha256, blob):
        self.path = path
        self.abspath = abspath
        self.size = size
        self.sha256 = sha256
        self.blob = blob
        self.lfs = path.endswith(LFS_SUFFIXES)

    @property
    def etag(self):
        return self.sha256 if self.lfs else self.blob


class Repo:
    def __init__(self, repo_id, files):
        self.id = repo_id
        self.files = dict(sorted(files.items()))
        lines = "".join(f"{p}\0{f.sha256}\n" for p, f in self.files.items())
        self.commit = hashlib.sha1(lines.encode()).hexdigest()
        self.dirs = set()
        for p in self.files:
            parts = p.split("/")[:-1]
            for i in range(1, len(parts) + 1):
                self.dirs.add("/".join(parts[:i]))


def _hash_file(abspath):
    size = os.path.getsize(abspath)
    sha256 = hashlib.sha256()
    blob = hashlib.sha1(b"blob %d\0" % size)
    with open(abspath, "rb") as fh:
        while True:
            data = fh.read(1 << 20)
            if not data:
                break
            sha256.update(data)
            blob.update(data)
    return size, sha256.hexdigest(), blob.hexdigest()


def _parse_range(header, size):
    """None: serve the whole file; "unsatisfiable"; or (start, end) inclusive."""
    if not header:
        return None
    m = re.fullmatch(r"\s*bytes\s*=\s*(\d*)\s*-\s*(\d*)\s*", header)
    if not m or (m.group(1) == "" and m.group(2) == ""):
        return None  # malformed or multi-range: ignored, like many servers do
    if m.group(1) == "":
        n = int(m.group(2))
        if n == 0 or size == 0:
            return "unsatisfiable"
        return (max(0, size - n), size - 1)
    start = int(m.group(1))
    if start >= size:
        return "unsatisfiable"
    end = int(m.group(2)) if m.group(2) else size - 1
    if end < start:
        return None
    return (start, min(end, size - 1))


def _as_list(value):
    if value is None:
        return []
    return value if isinstance(value, list) else [value]


class Mirror:
    """The mirror's state (repositories, test behaviours, statistics) and its server."""

    def __init__(self, root, port=0, host="127.0.0.1"):
        self.root = os.path.abspath(root)
        self.host = host
        self.port = port
        self._lock = threading.Lock()
        self._hash_cache = {}  # abspath -> ((size, mtime_ns), (size, sha256, blob))
        self._repos = {}
        self._server = None
        self._thread = None
        self._conns = set()
        self._reset_locked()
        self.rescan()

    # ---- repositories -------------------------------------------------------------------------
    def rescan(self):
        repos = {}
        cache = {}
        if os.path.isdir(self.root):
            for org in sorted(os.listdir(self.root)):
                org_dir = os.path.join(self.root, org)
                if not os.path.isdir(org_dir):
                    continue
                for name in sorted(os.listdir(org_dir)):
                    repo_dir = os.path.join(org_dir, name)
                    if not os.path.isdir(repo_dir):
                        continue
                    files = {}
                    for dirpath, dirnames, filenames in os.walk(repo_dir):
                        dirnames.sort()
                        for fn in filenames:
                            abspath = os.path.join(dirpath, fn)
                            if not os.path.isfile(abspath):
                                continue
                            rel = os.path.relpath(abspath, repo_dir).replace(os.sep, "/")
                            st = os.stat(abspath)
                            key = (st.st_size, st.st_mtime_ns)
                            old = self._hash_cache.get(abspath)
                            info = old[1] if old and old[0] == key else _hash_file(abspath)
                            cache[abspath] = (key, info)
                            files[rel] = RepoFile(rel, abspath, *info)
                    if files:
                        repo_id = f"{org}/{name}"
                        repos[repo_id] = Repo(repo_id, files)
        with self._lock:
            self._hash_cache = cache
            self._repos = repos
        return sorted(repos)

    def repo(self, repo_id):
        with self._lock:
            return self._repos.get(repo_id)

    def repos(self):
        """{repo_id: commit} for every repository served."""
        with self._lock:
            return {rid: r.commit for rid, r in self._repos.items()}

    # ---- behaviours and statistics ------------------------------------------------------------
    def _reset_locked(self):
        self._drops = {}  # "ORG/NAME/FILE" -> [times_left, after_bytes]
        self._corrupts = {}  # "ORG/NAME/FILE" -> times_left (-1: always)
        self._too_many = [0, 1]  # [count_left, retry_after]
        self._gated = {}  # repo_id -> token
        self._throttle = 0
        self._bytes = {}
        self._file_gets = {}
        self._requests = []
        self._too_many_times = []
        self._oversize = {}  # "ORG/NAME/FILE" -> {"extra_bytes", "content_length", "encoding"}
        self._listings = {}  # "ORG/NAME" -> {"body"} or {"endless", "bytes_per_second"}
        self._ignore_range = set()  # "ORG/NAME/FILE"; "*": every file
        self._redirects = {}  # "ORG/NAME/FILE" or "ORG/NAME" (its listing) -> Location
        self._any_revision = False

    def control(self, body):
        """Applies a /_control body (a dict); returns {"ok": True} or raises ValueError.

        {"drop": {"path": "ORG/NAME/FILE", "times": K, "after_bytes": B}}   (or a list, or null)
        {"corrupt": {"path": "ORG/NAME/FILE", "times": K}}                  (K = -1: always)
        {"too_many": {"count": K, "retry_after": S}}
        {"gated": {"repo": "ORG/NAME", "token": "TOKEN"}}                   (or a list; null: none)
        {"throttle": {"bytes_per_second": N}}                               (0 / null: unthrottled)
        {"oversize": {"path": "ORG/NAME/FILE", "extra_bytes": N, "content_length": false,
                      "encoding": "gzip"}}
            the file followed by N more bytes (-1: a body that never ends), announced with a
            Content-Length (of the whole body, when true) or none (the connection closes at the end);
            with "encoding": "gzip" the body is a gzip stream (of the file, then zeros) sent as
            Content-Encoding: gzip, though the client asked for identity        (or a list)
        {"listing": {"repo": "ORG/NAME", "body": "TEXT"}}                   any listing body
        {"listing": {"repo": "ORG/NAME", "endless": true, "bytes_per_second": N}}
            a listing that never ends (no Content-Length), as fast as it goes or N bytes a second
        {"ignore_range": true | ["ORG/NAME/FILE", ...]}                     a 200 with everything
        {"redirect": {"path": "ORG/NAME/FILE" | "ORG/NAME", "location": "ftp://..."}}
            a 302 to that location for the file (or the repository's listing)  (or a list)
        {"any_revision": true}    the listing answers for any revision (as the commit)
        {"reset": true}    {"rescan": true}
        """
        if not isinstance(body, dict):
            raise ValueError("control body must be a JSON object")
        known = {"drop", "corrupt", "too_many", "gated", "throttle", "reset", "rescan", "oversize", "listing",
                 "ignore_range", "redirect", "any_revision"}
        unknown = set(body) - known
        if unknown:
            raise ValueError(f"unknown control keys: {sorted(unknown)}")
        try:
            drops = {d["path"]: [int(d.get("times", 1)), int(d.get("after_bytes", 0))]
                     for d in _as_list(body.get("drop"))}
            corrupts = {c["path"]: int(c.get("times", 1)) for c in _as_list(body.get("corrupt"))}
            gated = {g["repo"]: str(g["token"]) for g in _as_list(body.get("gated"))}
            tm = body.get("too_many") or {}
            too_many = [int(tm.get("count", 1)) if tm else 0, tm.get("retry_after", 1)]
            th = body.get("throttle")
            throttle = int((th.get("bytes_per_second") if isinstance(th, dict) else th) or 0)
            oversize = {o["path"]: {"extra_bytes": int(o.get("extra_bytes", -1)),
                                    "content_length": bool(o.get("content_length", False)),
                                    "encoding": o.get("encoding")}
                        for o in _as_list(body.get("oversize"))}
            listings = {}
            for l in _as_list(body.get("listing")):
                if "body" in l:
                    listings[l["repo"]] = {"body": str(l["body"]).encode()}
                else:
                    listings[l["repo"]] = {"endless": True, "bytes_per_second": int(l.get("bytes_per_second") or 0)}
            ir = body.get("ignore_range")
            ignore_range = {"*"} if ir is True else set(_as_list(ir or None))
            redirects = {r["path"]: str(r["location"]) for r in _as_list(body.get("redirect"))}
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise ValueError(f"bad control body: {e!r}") from None
        if body.get("rescan"):
            self.rescan()
        with self._lock:
            if body.get("reset"):
                self._reset_locked()
            if "drop" in body:
                self._drops = drops
            if "corrupt" in body:
                self._corrupts = corrupts
            if "gated" in body:
                self._gated = gated
            if "too_many" in body:
                self._too_many = too_many
            if "throttle" in body:
                self._throttle = max(0, throttle)
            if "oversize" in body:
                self._oversize = oversize
            if "listing" in body:
                self._listings = listings
            if "ignore_range" in body:
                self._ignore_range = ignore_range
            if "redirect" in body:
                self._redirects = redirects
            if "any_revision" in body:
                self._any_revision = bool(body["any_revision"])
        return {"ok": True}

    def stats(self):
        """{"bytes": {file: n}, "file_gets": {file: n}, "requests": [...], "too_many_times": [...]}"""
        with self._lock:
            return copy.deepcopy({"bytes": self._bytes, "file_gets": self._file_gets,
                                  "requests": self._requests, "too_many_times": self._too_many_times})

    # internal helpers used by the handler (all under the lock)
    def _take_too_many(self):
        with self._lock:
            if self._too_many[0] > 0:
                self._too_many[0] -= 1
                self._too_many_times.append(time.time())
                return self._too_many[1]
            return None

    def _gate_token(self, repo_id):
        with self._lock:
            return self._gated.get(repo_id)

    def _take_file_behaviours(self, key):
        """(drop_after_bytes or None, corrupt?) for one GET serving a body of file `key`."""
        with self._lock:
            drop = None
            d = self._drops.get(key)
            if d and d[0] > 0:
                d[0] -= 1
                drop = d[1]
            corrupt = False
            c = self._corrupts.get(key)
            if c is not None and c != 0:
                corrupt = True
                if c > 0:
                    self._corrupts[key] = c - 1
            return drop, corrupt

    def _count_get(self, key):
        with self._lock:
            self._file_gets[key] = self._file_gets.get(key, 0) + 1
            self._bytes.setdefault(key, 0)

    def _count_bytes(self, key, n):
        with self._lock:
            self._bytes[key] = self._bytes.get(key, 0) + n

    def _misbehaviours(self, key):
        """(oversize or None, ignore Range?, redirect location or None) for a file or listing `key`."""
        with self._lock:
            return (self._oversize.get(key), "*" in self._ignore_range or key in self._ignore_range,
                    self._redirects.get(key))

    def _listing_override(self, repo_id):
        with self._lock:
            return self._listings.get(repo_id), self._any_revision

    def _throttle_rate(self):
        with self._lock:
            return self._throttle

    def _record(self, entry):
        with self._lock:
            self._requests.append(entry)

    # ---- server -------------------------------------------------------------------------------
    def start(self):
        """Starts serving in a background thread; returns the port."""
        self._server = _Server((self.host, self.port), _Handler)
        self._server.mirror = self
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.1},
                                        name="hub_mirror", daemon=True)
        self._thread.start()
        return self.port

    @property
    def url(self):
        return f"http://{self.host}:{self.port}"

    def stop(self):
        if self._server is None:
            return
        self._server.shutdown()
        with self._lock:
            conns = list(self._conns)
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._server.server_close()
        self._thread.join(timeout=5)
        self._server = None

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def handle_error(self, request, client_address):
        if isinstance(sys.exc_info()[1], OSError):
            return  # client went away
        super().handle_error(request, client_address)


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "hub_mirror/1"

    def log_message(self, fmt, *args):
        if VERBOSE:
            sys.stderr.write("hub_mirror: %s - %s\n" % (self.address_string(), fmt % args))

    def setup(self):
        super().setup()
        with self.server.mirror._lock:
            self.server.mirror._conns.add(self.connection)

    def finish(self):
        try:
            super().finish()
        except OSError:
            pass
        with self.server.mirror._lock:
            self.server.mirror._conns.discard(self.connection)

    def handle(self):
        try:
            super().handle()
        except OSError:  # BrokenPipeError, ConnectionResetError, a socket shut by stop()
            self.close_connection = True

    def do_GET(self):
        self._dispatch("GET")

    def do_HEAD(self):
        self._dispatch("HEAD")

    def do_POST(self):
        self._dispatch("POST")

    def do_PUT(self):
        self._dispatch("PUT")

    def do_DELETE(self):
        self._dispatch("DELETE")

    # ---- replies ------------------------------------------------------------------------------
    def _start(self, status, headers):
        """Sends the status line and headers, recording the request in the statistics."""
        if self._entry is not None:
            self._entry["status"] = status
            self._entry["time"] = time.time()
            self.server.mirror._record(self._entry)
            self._entry = None
        self.send_response(status)
        for k, v in headers:
            self.send_header(k, v)
        self.end_headers()

    def _json(self, status, obj, headers=()):
        body = json.dumps(obj).encode()
        self._start(status, [("Content-Type", "application/json; charset=utf-8"),
                             ("Content-Length", str(len(body)))] + list(headers))
        if self._method != "HEAD":
            self.wfile.write(body)

    def _error(self, status, message, code=None):
        headers = [("X-Error-Message", message)]
        if code:
            headers.append(("X-Error-Code", code))
        if self._route_kind == "ms":
            body = {"Code": status, "Success": False, "Message": message, "error": message}
        else:
            body = {"error": message}
        self._json(status, body, headers)

    # ---- dispatch -----------------------------------------------------------------------------
    def _dispatch(self, method):
        self._method = method
        self._entry = None
        self._route_kind = None
        mirror = self.server.mirror
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length > 0 else b""
        split = urllib.parse.urlsplit(self.path)
        raw_path, query = split.path, split.query

        if raw_path == "/_control":
            if method != "POST":
                return self._json(405, {"ok": False, "error": "POST a JSON body"})
            try:
                return self._json(200, mirror.control(json.loads(body or b"{}")))
            except ValueError as e:  # json.JSONDecodeError is a ValueError
                return self._json(400, {"ok": False, "error": str(e)})
        if raw_path == "/_stats":
            return self._json(200, mirror.stats())

        self._entry = {"method": method, "path": raw_path, "query": query,
                       "range": self.headers.get("Range"), "auth": self.headers.get("Authorization"),
                       "status": None, "time": None}
        segs = [urllib.parse.unquote(s) for s in raw_path.split("/")[1:]]
        params = {k.lower(): v for k, v in urllib.parse.parse_qsl(query, keep_blank_values=True)}

        route = None
        if len(segs) >= 6 and segs[:3] == ["api", "v1", "models"] and segs[5] == "repo":
            self._route_kind = "ms"
            repo_id = f"{segs[3]}/{segs[4]}"
            if len(segs) == 6:
                route = "ms_file"
            elif len(segs) == 7 and segs[6] == "files":
                route = "ms_files"
        elif len(segs) >= 4 and segs[:2] == ["api", "models"]:
            self._route_kind = "hf"
            repo_id = f"{segs[2]}/{segs[3]}"
            rest = segs[4:]
            if not rest or (len(rest) == 1 and rest[0] == ""):
                route, rev = "info", "main"
            elif rest[0] == "revision" and len(rest) == 2:
                route, rev = "info", rest[1]
            elif rest[0] == "tree" and len(rest) >= 2:
                route, rev, sub = "tree", rest[1], "/".join(rest[2:]).strip("/")
        elif len(segs) >= 5 and segs[2] == "resolve":
            self._route_kind = "hf"
            repo_id = f"{segs[0]}/{segs[1]}"
            route, rev, fpath = "resolve", segs[3], "/".join(segs[4:])

        if self._route_kind or raw_path.startswith("/api/"):
            retry_after = mirror._take_too_many()
            if retry_after is not None:
                return self._json(429, {"error": "Too many requests, retry later."},
                                  [("Retry-After", str(retry_after))])
        if route is None:
            return self._error(404, f"No route for {raw_path}")

        token = mirror._gate_token(repo_id)
        if token is not None:
            auth = (self.headers.get("Authorization") or "").strip()
            msg = (f"Access to model {repo_id} is restricted. You must have access to it and be "
                   "authenticated to access it.")
            if not auth:
                return self._error(401, msg, "GatedRepo")
            scheme, _, given = auth.partition(" ")
            if scheme.lower() != "bearer" or given.strip() != token:
                return self._error(403, msg, "GatedRepo")

        repo = mirror.repo(repo_id)
        if repo is None:
            if self._route_kind == "ms":
                return self._json(404, {"Code": 10010205001, "Success": False, "Message": "model not found"})
            return self._error(404, "Repository not found", "RepoNotFound")

        if route in ("info", "ms_files"):
            override, any_revision = mirror._listing_override(repo_id)
            location = mirror._misbehaviours(repo_id)[2]
            if location:
                return self._start(302, [("Location", location), ("Content-Length", "0")])
            if override and "body" in override:
                self._start(200, [("Content-Type", "application/json"), ("Content-Length", str(len(override["body"])))])
                return self.wfile.write(override["body"]) if self._method != "HEAD" else None
            if override:
                return self._endless_listing(override["bytes_per_second"])
            if any_revision and route == "info":
                rev = repo.commit

        if self._route_kind == "ms":
            rev = params.get("revision") or "master"
            if rev not in ("master", repo.commit):
                return self._json(404, {"Code": 10010205002, "Success": False,
                                        "Message": f"revision {rev} not found"},
                                  [("X-Error-Code", "RevisionNotFound")])
            if route == "ms_files":
                files = [{"Name": p.rsplit("/", 1)[-1], "Path": p, "Size": f.size, "Sha256": f.sha256,
                          "Type": "blob", "Revision": repo.commit} for p, f in repo.files.items()]
                return self._json(200, {"Code": 200, "Success": True, "Message": "success",
                                        "Data": {"Files": files}})
            fpath = params.get("filepath", "")
            f = repo.files.get(fpath)
            if f is None:
                return self._json(404, {"Code": 10010205003, "Success": False,
                                        "Message": f"file {fpath} not found"},
                                  [("X-Error-Code", "EntryNotFound")])
            return self._serve_file(repo, f)

        if rev not in ("main", repo.commit):
            return self._error(404, f"Invalid rev id: {rev}", "RevisionNotFound")
        if route == "info":
            return self._json(200, self._info(repo, token is not None))
        if route == "tree":
            recursive = params.get("recursive", "").lower() in ("1", "true", "yes")
            return self._tree(repo, sub, recursive)
        f = repo.files.get(fpath)
        if f is None:
            return self._error(404, "Entry not found", "EntryNotFound")
        return self._serve_file(repo, f)

    def _endless_listing(self, rate):
        """A listing that never ends: the start of a valid one, then siblings for ever (no length)."""
        self._start(200, [("Content-Type", "application/json"), ("Connection", "close")])
        self.close_connection = True
        item = b'{"rfilename": "f.bin", "size": 1, "blobId": "' + b"0" * 40 + b'"},'
        chunk = item * (CHUNK // len(item))
        self.wfile.write(b'{"sha": "' + b"0" * 40 + b'", "siblings": [')
        while True:  # until the client goes away (OSError, handled by handle())
            if rate:
                self.wfile.write(chunk[:max(1, rate // 20)])
                self.wfile.flush()
                time.sleep(0.05)
            else:
                self.wfile.write(chunk)

    def _oversize_body(self, key, f, o, headers):
        """The file and more: `extra_bytes` more (-1: for ever), raw or gzip-encoded."""
        data = open(f.abspath, "rb").read()
        extra = o["extra_bytes"]
        gz = zlib.compressobj(9, zlib.DEFLATED, 31) if o["encoding"] == "gzip" else None
        if gz is not None:
            headers.append(("Content-Encoding", "gzip"))
        if o["content_length"] and extra >= 0 and gz is None:
            headers.append(("Content-Length", str(len(data) + extra)))
        else:
            headers.append(("Connection", "close"))
            self.close_connection = True
        self._start(200, headers)
        mirror = self.server.mirror

        def send(raw):
            out = gz.compress(raw) + gz.flush(zlib.Z_SYNC_FLUSH) if gz is not None else raw
            self.wfile.write(out)
            mirror._count_bytes(key, len(out))

        send(data)
        zeros = b"\0" * CHUNK
        left = extra
        while left != 0:  # until the client goes away (OSError) when endless
            n = CHUNK if left < 0 else min(CHUNK, left)
            send(zeros[:n])
            left = left - n if left > 0 else left
        if gz is not None:
            self.wfile.write(gz.flush())

    def _info(self, repo, gated):
        siblings = []
        for p, f in repo.files.items():
            s = {"rfilename": p, "size": f.size, "blobId": f.blob}
            if f.lfs:
                s["lfs"] = {"sha256": f.sha256, "size": f.size, "pointerSize": POINTER_SIZE}
            siblings.append(s)
        org = repo.id.split("/")[0]
        return {"_id": hashlib.sha1(repo.id.encode()).hexdigest()[:24], "id": repo.id, "modelId": repo.id,
                "author": org, "sha": repo.commit, "private": False, "disabled": False,
                "gated": "manual" if gated else False, "downloads": 0, "likes": 0, "tags": [],
                "lastModified": TIMESTAMP, "createdAt": TIMESTAMP, "siblings": siblings}

    def _tree(self, repo, sub, recursive):
        if sub and sub not in repo.dirs:
            return self._error(404, f"{sub} does not exist on \"{repo.commit}\"", "EntryNotFound")
        prefix = sub + "/" if sub else ""
        entries = []
        for d in sorted(repo.dirs):
            if d.startswith(prefix) and (recursive or "/" not in d[len(prefix):]):
                oid = hashlib.sha1(f"tree {repo.commit} {d}".encode()).hexdigest()
                entries.append({"type": "directory", "oid": oid, "size": 0, "path": d})
        for p, f in repo.files.items():
            if p.startswith(prefix) and (recursive or "/" not in p[len(prefix):]):
                e = {"type": "file", "oid": f.blob, "size": f.size, "path": p}
                if f.lfs:
                    e["lfs"] = {"oid": f.sha256, "size": f.size, "pointerSize": POINTER_SIZE}
                entries.append(e)
        entries.sort(key=lambda e: e["path"])
        return self._json(200, entries)

    def _serve_file(self, repo, f):
        mirror = self.server.mirror
        key = f"{repo.id}/{f.path}"
        headers = [("Content-Type", "application/octet-stream"), ("Accept-Ranges", "bytes"),
                   ("X-Repo-Commit", repo.commit), ("ETag", f'"{f.etag}"')]
        if f.lfs:
            headers += [("X-Linked-Etag", f'"{f.sha256}"'), ("X-Linked-Size", str(f.size))]
        if self._method not in ("GET", "HEAD"):
            return self._error(405, f"{self._method} not allowed")
        if self._method == "GET":
            mirror._count_get(key)
        oversize, ignore_range, location = mirror._misbehaviours(key)
        if location:
            return self._start(302, [("Location", location), ("Content-Length", "0")])
        rng = None if ignore_range else _parse_range(self.headers.get("Range"), f.size)
        if oversize and self._method == "GET":
            return self._oversize_body(key, f, oversize, headers)  # a 200 from the start, whatever the Range
        if rng == "unsatisfiable":
            return self._start(416, headers + [("Content-Range", f"bytes */{f.size}"), ("Content-Length", "0")])
        if rng is None:
            status, start, end = 200, 0, f.size - 1
        else:
            status, (start, end) = 206, rng
            headers.append(("Content-Range", f"bytes {start}-{end}/{f.size}"))
        length = end - start + 1
        headers.append(("Content-Length", str(length)))
        if self._method == "HEAD":
            return self._start(status, headers)

        drop_after, corrupt = mirror._take_file_behaviours(key)
        mid = f.size // 2
        fh = open(f.abspath, "rb")
        try:
            self._start(status, headers)
            fh.seek(start)
            pos, sent, remaining = start, 0, length
            rate, t0, paced = 0, 0.0, 0
            while remaining > 0:
                n = min(CHUNK, remaining)
                if drop_after is not None:
                    n = min(n, drop_after - sent)
                    if n <= 0:
                        break
                new_rate = mirror._throttle_rate()
                if new_rate != rate:
                    rate, t0, paced = new_rate, time.monotonic(), 0
                if rate:
                    n = min(n, max(256, rate // 20))
                data = fh.read(n)
                if not data:  # file shrank on disk: end the connection short
                    break
                if corrupt and pos <= mid < pos + len(data):
                    b = bytearray(data)
                    b[mid - pos] ^= 0xFF
                    data = bytes(b)
                if rate:
                    paced += len(data)
                    delay = t0 + paced / rate - time.monotonic()
                    if delay > 0:
                        time.sleep(delay)
                self.wfile.write(data)
                mirror._count_bytes(key, len(data))
                pos += len(data)
                sent += len(data)
                remaining -= len(data)
        finally:
            fh.close()
        if remaining > 0:  # dropped (or short file): cut the connection so the client sees a short read
            self.close_connection = True
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self.connection.close()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", required=True, help="directory holding ORG/NAME repositories")
    ap.add_argument("--port", type=int, default=0, help="port to bind (0: any free port)")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port-file", help="write the chosen port here (atomically)")
    args = ap.parse_args(argv)

    mirror = Mirror(args.root, port=args.port, host=args.host)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    port = mirror.start()
    if args.port_file:
        tmp = args.port_file + ".tmp"
        with open(tmp, "w") as fh:
            fh.write(f"{port}\n")
        os.replace(tmp, args.port_file)
    print(f"hub_mirror: serving {mirror.root} on http://{args.host}:{port}", flush=True)
    while not stop.wait(0.5):
        pass
    mirror.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
