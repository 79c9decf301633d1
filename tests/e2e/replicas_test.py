#!/usr/bin/env python3
"""Replicas behind the built-in router, and warm reloads (issue 19), end to end on CPU replicas:
two replicas serving concurrent streams with the memorised text; reloads to another model file, to
another config and by SIGHUP, and a binary upgrade, while 8 streaming clients run, with no request
failed; an upgrade to a binary that does not start changing nothing; reloads that
cannot work (a missing file, a truncated file, a config that does not fit, a listener change)
changing nothing; a replica that fails mid-run, whose unstarted requests finish on the other;
prefix affinity with 4 replicas against the same traffic without it.
Usage: replicas_test.py SEXTANT_BINARY MODELS_DIR. Prints "N passed, N failed".
$SX_RELOAD_LOAD_SECONDS sets how long the clients of the reload case run (default 60)."""
import http.client
import json
import subprocess
import os
import random
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import daemon_harness  # noqa: E402

SEXTANT, MODELS = sys.argv[1], sys.argv[2]
REF = json.load(open(os.path.join(MODELS, "reference.json")))
MODEL = os.path.join(MODELS, "memorise-q8_0.gguf")
NAME = "memorise-q8_0"
case = daemon_harness.case


def Daemon(*extra, **kwargs):
    return daemon_harness.Daemon(SEXTANT, MODEL, *extra, **kwargs)


def stream(port, prompt, max_tokens, model=NAME):
    return daemon_harness.stream(port, prompt, max_tokens, model)


def complete(port, prompt, max_tokens):
    st, data = daemon_harness.post(port, "/v1/completions", {"model": NAME, "prompt": prompt,
                                                               "max_tokens": max_tokens, "temperature": 0,
                                                               "ignore_eos": True})
    if st != 200:
        raise AssertionError(f"status {st}: {data[:300]!r}")
    return json.loads(data)


def refused_and_still_serving(d, ctl_args, cause):
    """`sextant ctl ctl_args...` exits 1 naming `cause`; the daemon still answers with the
    memorised text. Returns the error text."""
    p = d.ctl(*ctl_args, check=False)
    err = p.stderr.decode()
    assert p.returncode == 1 and cause in err, (ctl_args, p.returncode, err)
    assert d.proc.poll() is None and d.status()["state"] == "ready"
    r = complete(d.port, REF["prompt_text"], 8)
    assert REF["continuation_text"].startswith(r["choices"][0]["text"]), r
    return err.strip()


def replica_status(d):
    return {r["replica"]: r for r in d.status()["replicas"]}


@case
def two_replicas_serve_sixteen_streams_with_the_memorised_text():
    d = Daemon("--replicas", "2", max_num_seqs=16)
    try:
        reps = replica_status(d)
        assert sorted(reps) == ["1.0", "1.1"], reps
        assert reps["1.0"]["devices"] == "cpu:0 (1 threads)" and reps["1.1"]["devices"] == "cpu:1 (1 threads)", reps
        want = stream(d.port, REF["prompt_text"], 24)[0]
        assert REF["continuation_text"].startswith(want) and len(want) > 40, want
        got, errors = [], []

        def client(i):
            try:
                got.append(stream(d.port, REF["prompt_text"], 24)[0])
            except Exception as e:  # noqa: BLE001
                errors.append(repr(e))
        threads = [threading.Thread(target=client, args=(i,)) for i in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        assert got == [want] * 16, got
        reps = replica_status(d)
        # The same prompt follows its prefix, but not onto a replica much busier than the other.
        served = [reps[r]["tokens"]["generated"] for r in ("1.0", "1.1")]
        assert all(n > 24 for n in served), served
        print(f"  16 streams on 2 replicas: generated tokens per replica {served}")
        text = d.text()
        assert "replica 1.1: phase warm-up: ok" in text and "(2 replica(s);" in text, text[-2000:]
    finally:
        rc, _ = d.stop()
    assert rc == 0, rc


def Load(port, n):
    return daemon_harness.Load(port, n, lambda i: REF["prompt_text"][: 20 + 7 * i], NAME)


wait_generation = daemon_harness.wait_generation


@case
def placement_from_a_saved_topology_keeps_sys_links_out_of_tp_groups():
    """Issue 22 item 3: with model.topology (a saved `nvidia-smi topo -m` of an 8-GPU dual-socket server standing
    for the 8 CPU devices) the replicas' TP groups are placed from the links, the choice and why logged at start;
    each replica serves the memorised text. TP 3 x 2 replicas on the seed's 4 + 2 box cannot avoid a SYS link:
    the log says what would."""
    topo_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "topology")
    dual = os.path.join(topo_dir, "dual-socket-8x-pcie.txt")
    d = Daemon("--replicas", "2", "--tp", "4", "--topology", dual, max_num_seqs=4)
    try:
        text = d.text()
        assert "serve: placement from " in text and "2 replicas of TP 4: [0, 1, 2, 3] [4, 5, 6, 7]" in text, text[-3000:]
        assert "TP traffic through a CPU's root complex (NODE between GPU" in text, text[-3000:]
        outs = [stream(d.port, "Alice was beginning to get", 16)[0] for _ in range(4)]
        assert len(set(outs)) == 1 and outs[0], outs
    finally:
        d.stop()
    # The CPU backend lists 8 devices; a 6-GPU topology does not describe them.
    p = subprocess.run([SEXTANT, "serve", "--model", MODEL, "--port", "0", "--admin-socket",
                        os.path.join(tempfile.mkdtemp(), "a.sock"), "--replicas", "2", "--tp", "3", "--topology",
                        os.path.join(topo_dir, "pcie-4+2-sys.txt")], capture_output=True, timeout=60)
    err = p.stderr.decode()
    assert p.returncode == 1 and "describes 6 GPUs but backend cpu has 8 devices" in err, err


@case
def reloads_under_load_fail_no_request():
    seconds = float(os.environ.get("SX_RELOAD_LOAD_SECONDS", "60"))
    tmp = tempfile.mkdtemp(prefix="sx-reload-")
    config = os.path.join(tmp, "sextant.yaml")
    with open(config, "w") as f:
        f.write("engine:\n  max_num_seqs: 12\n")
    d = Daemon("--replicas", "2", "--config", config, max_num_seqs=16)
    try:
        start = time.time()
        load = Load(d.port, 8)
        gen = d.status()["generation"]
        steps = []

        def at(fraction):
            time.sleep(max(0.0, start + seconds * fraction - time.time()))

        at(0.2)  # another model file: the served name stays
        p = d.ctl("reload", "--model", os.path.join(MODELS, "memorise-f16.gguf"))
        gen += 1
        st = wait_generation(d, gen)
        assert st["model"] == NAME and st["model_path"].endswith("memorise-f16.gguf"), st
        steps.append(f"model reload -> generation {gen}")
        at(0.45)  # another config: the file changed on disk, re-read (flags still win)
        with open(config, "w") as f:
            f.write("engine:\n  max_num_seqs: 8\nlimits:\n  max_tokens_default: 100\n")
        d.ctl("reload")
        gen += 1
        st = wait_generation(d, gen)
        cfg = d.ctl("--json", "config").stdout.decode()
        assert "max_tokens_default: 100" in cfg and "max_num_seqs: 16" in cfg, cfg  # --max-num-seqs wins
        steps.append(f"config reload -> generation {gen}")
        at(0.7)  # SIGHUP: the same
        d.proc.send_signal(signal.SIGHUP)
        gen += 1
        wait_generation(d, gen)
        steps.append(f"SIGHUP -> generation {gen}")
        at(0.85)  # a binary upgrade to a copy of the binary: the sockets pass to the new process
        copy = os.path.join(tmp, "sextant-upgraded")
        shutil.copy2(SEXTANT, copy)
        up = json.loads(d.ctl("--json", "upgrade", "--binary", copy).stdout)
        old_rc = d.proc.wait(timeout=120)
        assert old_rc == 0, old_rc
        new_pid = up["pid"]
        steps.append(f"upgrade -> pid {new_pid}, the old process exited {old_rc}")
        at(1.0)
        ok, failures = load.finish()
        assert not failures, failures[:5]
        assert ok > 8, ok
        st = d.status()  # the new process answers on the same admin socket
        assert st["state"] == "ready" and [r["replica"] for r in st["replicas"]] == ["1.0", "1.1"], st
        print(f"  8 streaming clients for {time.time() - start:.0f} s: {ok} complete streams, 0 failed; "
              f"{', '.join(steps)}")
        d.ctl("shutdown")
        deadline = time.time() + 60
        while os.path.exists(f"/proc/{new_pid}") and time.time() < deadline:
            try:  # reaped by init, or a zombie of this process's (it was started by the old daemon)
                if open(f"/proc/{new_pid}/stat").read().split()[2] == "Z":
                    break
            except OSError:
                break
            time.sleep(0.1)
        text = d.text()
        assert text.count("serve: stopped (exit status 0)") == 2, text[-3000:]
    finally:
        if d.proc.poll() is None:
            d.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    assert "still had open handles" not in text, text[-3000:]
    assert text.count("stopped (drained after the reload)") == 6, text[-3000:]


@case
def reloads_that_cannot_work_change_nothing():
    tmp = tempfile.mkdtemp(prefix="sx-badreload-")
    truncated = os.path.join(tmp, "truncated.gguf")
    with open(MODEL, "rb") as f:
        data = f.read()
    with open(truncated, "wb") as f:
        f.write(data[: len(data) // 2])
    too_big = os.path.join(tmp, "too_big.yaml")
    with open(too_big, "w") as f:
        f.write("engine:\n  memory_budget: 1MiB\n")
    port_change = os.path.join(tmp, "port.yaml")
    with open(port_change, "w") as f:
        f.write("http:\n  host: 127.0.0.2\n")
    d = Daemon("--replicas", "2")
    try:
        gen = d.status()["generation"]
        cases = [
            (("--model", os.path.join(tmp, "missing.gguf")), "missing.gguf"),
            (("--model", truncated), "truncated.gguf"),
            (("--config", too_big), "memory"),
            (("--config", port_change), "http.host"),
        ]
        for args, cause in cases:
            err = refused_and_still_serving(d, ("reload", *args), cause)
            assert "keep serving" in err or "http.host cannot change" in err, err
            st = d.status()
            assert st["generation"] == gen and st["model_path"] == MODEL, st
            print(f"  reload {' '.join(os.path.basename(a) for a in args)}: exit 1, {err[:150]}")
    finally:
        rc, _ = d.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    assert rc == 0, rc


@case
def an_upgrade_to_a_binary_that_does_not_start_changes_nothing():
    tmp = tempfile.mkdtemp(prefix="sx-badupgrade-")
    failing = os.path.join(tmp, "failing-sextant")
    with open(failing, "w") as f:  # reports an error on the ready pipe, as a sextant that fails does
        f.write('#!/bin/sh\necho "error serve: failed in phase model check: no such model" >&5\nexit 1\n')
    os.chmod(failing, 0o755)
    d = Daemon()
    try:
        for binary, cause in ((failing, "failed in phase model check: no such model"),
                              ("/bin/false", "closed its pipe before it was ready"),
                              (os.path.join(tmp, "missing"), "is not an executable file")):
            err = refused_and_still_serving(d, ("upgrade", "--binary", binary), cause)
            print(f"  upgrade --binary {os.path.basename(binary)}: exit 1, {err[:140]}")
    finally:
        rc, _ = d.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    assert rc == 0, rc


@case
def rolling_restart_script_reloads_upgrades_and_reports_failures():
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts", "rolling-restart")
    d = Daemon()
    env = dict(os.environ, SEXTANT=SEXTANT)
    try:
        def run(*args):
            return subprocess.run([script, "--socket", d.socket, *args], capture_output=True, timeout=300, env=env)
        p = run("reload")
        assert p.returncode == 0 and b"reload done; serving (generation 2" in p.stdout, (p.stdout, p.stderr)
        p = run("reload", "--model", "/nonexistent.gguf")
        assert p.returncode == 1 and b"/nonexistent.gguf" in p.stderr, (p.stdout, p.stderr)
        p = run("upgrade")  # to the same binary
        assert p.returncode == 0 and b"upgrade done" in p.stdout, (p.stdout, p.stderr)
        assert d.proc.wait(timeout=60) == 0
        new_pid = d.status()["pid"]
        assert new_pid != d.proc.pid, new_pid
        r = complete(d.port, REF["prompt_text"], 8)
        assert REF["continuation_text"].startswith(r["choices"][0]["text"]), r
    finally:
        if d.proc.poll() is None:
            d.stop()
        else:
            d.ctl("shutdown", check=False)
            time.sleep(0.5)
    assert "still had open handles" not in d.text()


@case
def systemd_socket_activation_serves_on_the_socket_it_is_given():
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    port = listener.getsockname()[1]
    fd = listener.fileno()
    # As systemd starts a service: the socket as descriptor 3, LISTEN_PID naming the process.
    prefix = ("sh", "-c", 'LISTEN_PID=$$ LISTEN_FDS=1 LISTEN_FDNAMES=http exec "$0" "$@"')
    d = daemon_harness.Daemon(SEXTANT, MODEL, prefix=prefix,
                              popen_kwargs={"pass_fds": [fd, 3], "preexec_fn": lambda: os.dup2(fd, 3)})
    listener.close()
    try:
        assert d.port == port and "(socket from systemd)" in d.text(), (d.port, port, d.text()[-1500:])
        r = complete(port, REF["prompt_text"], 8)
        assert REF["continuation_text"].startswith(r["choices"][0]["text"]), r
    finally:
        rc, _ = d.stop()
    assert rc == 0, rc


@case
def a_failed_replica_s_unstarted_requests_finish_on_the_other():
    # Replica 1 fails at its 600th device op (past its load and warm-up, in the requests below).
    env = dict(os.environ, SEXTANT_FAULT_REPLICA="1:600")
    d = Daemon("--replicas", "2", "--set", "engine.prefix_affinity=false", max_num_seqs=4, env=env)
    try:
        results, errors = [], []

        def client(i):
            try:
                results.append(complete(d.port, REF["prompt_text"][: 30 + i], 8))
            except Exception as e:  # noqa: BLE001
                errors.append(repr(e))
        threads = [threading.Thread(target=client, args=(i,)) for i in range(24)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        reps = replica_status(d)
        assert reps["1.1"]["state"] == "failed" and reps["1.0"]["state"] == "ready", reps
        assert not errors, errors
        assert len(results) == 24
        # The daemon keeps serving on the replica left.
        r = complete(d.port, REF["prompt_text"], 8)
        assert REF["continuation_text"].startswith(r["choices"][0]["text"]), r
        text = d.text()
        assert "replica 1.1 failed" in text and "moved from failed replica 1.1 to replica 1.0" in text, text[-3000:]
        print(f"  24 requests, replica 1.1 failed mid-run: 24 complete; moved: {text.count('moved from failed')}")
    finally:
        rc, _ = d.stop()
    assert rc == 0, rc


def conversations_hit_rate(affinity):
    """8 interleaved 10-turn chats over 4 replicas, their turns in a shuffled order each round: the share of turns after the first whose prompt
    found its conversation in the prefix cache (usage.prompt_tokens_details.cached_tokens covers the
    previous turn's prompt, whole blocks of 16 tokens; any cached token would not do, since all the
    chats share the first blocks of their system prompt), and the cached share of all prompt tokens."""
    d = Daemon("--replicas", "4", "--set", f"engine.prefix_affinity={'true' if affinity else 'false'}",
               max_num_seqs=8)
    try:
        chats = [[{"role": "system", "content": f"You are assistant number {i}, and you answer briefly."}]
                 for i in range(8)]
        hits = turns = cached = prompted = 0
        previous = [0] * len(chats)
        order = random.Random(7)  # the chats' turns arrive in a different order each round
        for turn in range(10):
            for i in order.sample(range(len(chats)), len(chats)):
                messages = chats[i]
                messages.append({"role": "user", "content": f"Question {turn} of chat {i}: where is Alice?"})
                st, data = daemon_harness.post(d.port, "/v1/chat/completions",
                                               {"model": NAME, "messages": messages, "max_tokens": 4,
                                                "temperature": 0})
                assert st == 200, data
                body = json.loads(data)
                messages.append({"role": "assistant", "content": body["choices"][0]["message"]["content"]})
                usage = body["usage"]
                if turn > 0:
                    turns += 1
                    hits += usage["prompt_tokens_details"]["cached_tokens"] >= previous[i] // 16 * 16
                cached += usage["prompt_tokens_details"]["cached_tokens"]
                prompted += usage["prompt_tokens"]
                previous[i] = usage["prompt_tokens"]
        return hits / turns, cached / prompted
    finally:
        d.stop()


@case
def prefix_affinity_keeps_conversations_on_the_replica_that_holds_them():
    with_affinity, tokens_with = conversations_hit_rate(True)
    without, tokens_without = conversations_hit_rate(False)
    print(f"  4 replicas, 8 chats x 10 turns: the conversation found in the prefix cache on {with_affinity:.0%} of "
          f"later turns with affinity ({tokens_with:.0%} of prompt tokens cached), {without:.0%} without "
          f"({tokens_without:.0%})")
    assert with_affinity >= 0.9, with_affinity
    assert without < with_affinity, (without, with_affinity)


daemon_harness.run_cases("SX_REPLICAS_ONLY")
daemon_harness.summary_exit()
