#!/usr/bin/env python3
"""torchrun 2.15's c10d rendezvous at K simulated nodes, on one machine (issue #35).

Run with the torch venv's python:

    /work/main/.deps/torch2/bin/python bench/scale/torchrun_rdzv.py \
        --ks 16,64,256,1024,4096 --json /tmp/torchrun_rdzv.jsonl

What it simulates, per K:

* ONE TCPStore server (libuv, torch's default), hosted in its own process
  (``--_serve``) so that its CPU and RSS can be read from /proc.  In torchrun the
  agent on the first node hosts it (``c10d_rendezvous_backend._create_tcp_store``
  with is_host true: ``TCPStore(host, port, is_master=True, multi_tenant=True,
  timeout=read_timeout)``); here the process hosts nothing else.
* K DynamicRendezvousHandlers, made exactly as torchrun makes them for
  ``--rdzv-backend c10d``: ``registry.get_rendezvous_handler(RendezvousParameters(
  backend="c10d", endpoint=127.0.0.1:PORT, min_nodes=K, max_nodes=K, ...))``
  -> ``create_backend`` (one TCPStore client per handler, as one per agent)
  -> ``create_handler``.  They live in P worker processes (``--procs``, default 1:
  all K handlers are threads of one process), K/P handlers each.
* Each handler gets one thread that plays its agent's main thread: it calls
  ``next_rendezvous()`` (the join), then loops as ``SimpleElasticAgent._invoke_run``
  does while its workers are healthy: ``sleep(monitor_interval)``;
  ``num_nodes_waiting()``.  The keep-alive is the handler's own
  ``_PeriodicTimer`` thread (started by next_rendezvous), untouched.

Measurements (times from CLOCK_MONOTONIC, shared by all processes):

* formation_s: the last handler's call of next_rendezvous() -> the last handler
  returns its RendezvousInfo (also first call -> last return, in the note).
* steady_cpu_pct / steady_rss_mb: the store server process's CPU (utime+stime,
  % of one core) over a window while the K handlers keep alive and the K
  simulated agents poll num_nodes_waiting(); its VmRSS at the end.
* loss_detect_s: one handler stops heart-beating and its agent loop stops (as a
  SIGKILLed agent: its TCP connection stays open, which is kinder than a real
  kill; torchrun does not use the connection for liveness anyway).  Measured:
  kill -> the first surviving handler whose synced state no longer lists the
  node (the keep-alive expiry, keep_alive_interval * keep_alive_max_attempt,
  seen by ``_sanitize`` on a sync) and -> the last survivor.  The survivors'
  num_nodes_waiting() is watched too: it counts the wait list, not the dead, so
  it stays 0 and no agent acts on the loss (see docs/scale-torchrun.md).

Settings are torchrun 2.15's defaults unless named here: min_nodes = max_nodes = K
(``--nnodes=K``), join_timeout 600, last_call 30 (unused when min = max),
close 30, heartbeat 5, keep_alive_interval 5, keep_alive_max_attempt 3,
read_timeout 60, cas_backoff_max_seconds 0, monitor_interval 0.1,
TORCH_DISABLE_SHARE_RDZV_TCP_STORE unset (rank 0 starts the shared TCPStore),
local_addr unset (socket.getfqdn()), is_host=False for every handler (the store
is hosted by the separate server process).

The machine's DNS: every TCPStore connection makes both ends reverse-resolve
::ffff:127.0.0.1, which /etc/hosts does not list, and this VM's resolver drops
some queries (5 s stalls).  Unless --no-hosts-fix, the script re-runs itself in
a private mount namespace (unshare -m) with /etc/hosts bind-mounted from a copy
that adds "::ffff:127.0.0.1 localhost"; nothing outside that namespace changes.
"""

import argparse
import json
import math
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.abspath(__file__)
PY = sys.executable
TICK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")
RUN_ID = "bench_rdzv"


# --------------------------------------------------------------------- /proc

def proc_cpu_s(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime + stime


def proc_rss_mb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


def proc_threads(pid):
    return len(os.listdir(f"/proc/{pid}/task"))


def raise_nofile(want):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = max(hard, want)
    if target > hard:
        with open("/proc/sys/fs/nr_open") as f:
            target = min(target, int(f.read()))
        try:  # root may raise the hard limit up to fs.nr_open
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, target))
            return target
        except (ValueError, OSError):
            target = hard
    resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return target


# -------------------------------------------------------------- store server

def serve_main():
    from datetime import timedelta
    from torch.distributed import TCPStore

    raise_nofile(65536)
    # As c10d_rendezvous_backend._create_tcp_store on the hosting agent, but on
    # an ephemeral port (torchrun's default is 29400).
    store = TCPStore("127.0.0.1", 0, is_master=True, multi_tenant=True,
                     timeout=timedelta(seconds=60))
    print(json.dumps({"port": store.port, "pid": os.getpid(),
                      "libuv": bool(store.libuvBackend)}), flush=True)
    sys.stdin.read()  # until the parent closes our stdin
    os._exit(0)


# ------------------------------------------------------------------- worker

def worker_main(a):
    raise_nofile(65536)
    threading.stack_size(512 * 1024)  # applies to the keep-alive timers too

    from torch.distributed.elastic.rendezvous import RendezvousParameters
    from torch.distributed.elastic.rendezvous import registry
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import (
        C10dRendezvousBackend,
    )

    out_lock = threading.Lock()

    def emit(obj):
        with out_lock:
            sys.stdout.write(json.dumps(obj) + "\n")
            sys.stdout.flush()

    # Count the backend's store operations (a thin wrapper; behaviour unchanged).
    st_lock = threading.Lock()
    stats = {"get": 0, "compare_set": 0, "cas_fail": 0, "bytes_tx": 0, "bytes_rx": 0,
             "nnw_calls": 0}
    orig_call = C10dRendezvousBackend._call_store
    orig_set = C10dRendezvousBackend.set_state

    def _call_store(self, op, *args, **kw):
        r = orig_call(self, op, *args, **kw)
        tx = sum(len(x) for x in args if isinstance(x, (str, bytes)))
        rx = len(r) if isinstance(r, (str, bytes)) else 0
        with st_lock:
            stats[op] = stats.get(op, 0) + 1
            stats["bytes_tx"] += tx
            stats["bytes_rx"] += rx
        return r

    def set_state(self, state, token=None):
        r = orig_set(self, state, token)
        if r is not None and not r[2]:
            with st_lock:
                stats["cas_fail"] += 1
        return r

    C10dRendezvousBackend._call_store = _call_store
    C10dRendezvousBackend.set_state = set_state

    n = a.n
    handlers = []
    t0 = time.monotonic()
    for _ in range(n):
        params = RendezvousParameters(
            backend="c10d", endpoint=f"127.0.0.1:{a.port}", run_id=RUN_ID,
            min_nodes=a.k, max_nodes=a.k, local_addr=None,
            is_host=False, timeout=900)  # "timeout": launcher/api.py's default rdzv_configs
        handlers.append(registry.get_rendezvous_handler(params))
    emit({"ev": "ready", "n": n, "create_s": time.monotonic() - t0,
          "nodes": [repr(h._this_node) for h in handlers[:1]]})

    t_call = [None] * n
    t_ret = [None] * n
    ranks = [None] * n
    errors = []
    dead = [False] * n
    stop = threading.Event()
    done = {"n": 0}
    formed = threading.Event()
    loss = {"victim": None, "t_kill": None, "seen": {}, "nnw_max": 0}
    profiles = []

    def agent(i):
        h = handlers[i]
        prof = None
        if a.profile and i < a.profile:
            import cProfile
            prof = cProfile.Profile(time.thread_time)
            with st_lock:
                profiles.append(prof)  # read by "profile", joined or not
            prof.enable()
        t_call[i] = time.monotonic()
        try:
            info = h.next_rendezvous()
            ranks[i] = info.rank
        except Exception as e:  # noqa: BLE001 - reported, not hidden
            with st_lock:
                errors.append(f"{i}: {type(e).__name__}: {e}")
        t_ret[i] = time.monotonic()
        if prof is not None:
            prof.disable()
        with st_lock:
            done["n"] += 1
            if done["n"] == n:
                formed.set()
        # SimpleElasticAgent._invoke_run while the worker group is HEALTHY.
        while not stop.is_set():
            time.sleep(a.monitor_interval)
            if dead[i]:
                return
            try:
                w = h.num_nodes_waiting()
            except Exception as e:  # noqa: BLE001
                with st_lock:
                    errors.append(f"{i} nnw: {type(e).__name__}: {e}")
                continue
            with st_lock:
                stats["nnw_calls"] += 1
            v = loss["victim"]
            if v is not None:
                if w > loss["nnw_max"]:
                    loss["nnw_max"] = w
                if i not in loss["seen"] and v not in h._state_holder.state.participants:
                    loss["seen"][i] = time.monotonic()

    def reporter():
        formed.wait()
        calls = [x for x in t_call if x is not None]
        rets = [x for x in t_ret if x is not None]
        emit({"ev": "formed", "first_call": min(calls), "last_call": max(calls),
              "first_ret": min(rets), "last_ret": max(rets),
              "ranks_ok": sorted(r for r in ranks if r is not None) == sorted(set(
                  r for r in ranks if r is not None)),
              "errors": errors[:5], "n_errors": len(errors)})

    threads = []
    for line in sys.stdin:
        cmd = line.split()
        if not cmd:
            continue
        if cmd[0] == "go":
            threading.Thread(target=reporter, daemon=True).start()
            for i in range(n):
                t = threading.Thread(target=agent, args=(i,), daemon=True,
                                     name=f"agent{i}")
                t.start()
                threads.append(t)
        elif cmd[0] == "stats":
            with st_lock:
                s = dict(stats)
                s["n_errors"] = len(errors)
                s["errors"] = errors[:3]
            s.update(ev="stats", t=time.monotonic(), returned=done["n"],
                     parts=max(len(h._state_holder.state.participants) for h in handlers),
                     cpu_s=proc_cpu_s(os.getpid()), rss_mb=proc_rss_mb(os.getpid()),
                     threads=proc_threads(os.getpid()))
            if loss["victim"] is not None:
                seen = list(loss["seen"].values())
                s.update(seen=len(seen), seen_first=min(seen) if seen else None,
                         seen_last=max(seen) if seen else None,
                         nnw_max=loss["nnw_max"])
            emit(s)
        elif cmd[0] == "heartbeats":
            # Ages of every node's last heartbeat in one handler's synced view.
            from datetime import datetime, timezone
            h = handlers[int(cmd[1]) if len(cmd) > 1 else 0]
            with h._heartbeat_lock:
                h._state_holder._last_sync_time = -1  # force a fresh get
                h._state_holder.sync()
                hb = dict(h._state_holder.state.last_heartbeats)
                nparts = len(h._state_holder.state.participants)
            now = datetime.now(timezone.utc)
            ages = sorted((now - t).total_seconds() for t in hb.values())
            emit({"ev": "heartbeats", "n": len(ages), "participants": nparts,
                  "age_max": ages[-1] if ages else None,
                  "age_med": ages[len(ages) // 2] if ages else None})
        elif cmd[0] == "kill":
            i = int(cmd[1])
            from datetime import datetime, timezone
            h = handlers[i]
            h._stop_heartbeats()       # no more keep-alives ...
            dead[i] = True             # ... and its agent loop stops
            mine = h._state_holder.state.last_heartbeats.get(h._this_node)
            age = (datetime.now(timezone.utc) - mine).total_seconds() if mine else None
            loss["seen"] = {}
            loss["t_kill"] = time.monotonic()
            loss["victim"] = h._this_node
            nd = h._this_node
            emit({"ev": "killed", "t": loss["t_kill"],
                  "node": f"{nd.addr} {nd.pid} {nd.local_id}", "last_hb_age_s": age})
        elif cmd[0] == "victim":
            # Another worker killed a node: watch for it here too.
            from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _NodeDesc
            loss["seen"] = {}
            loss["t_kill"] = float(cmd[4])
            loss["victim"] = _NodeDesc(cmd[1], int(cmd[2]), int(cmd[3]))
            emit({"ev": "watching"})
        elif cmd[0] == "profile":
            import io
            import pstats
            buf = io.StringIO()
            with st_lock:
                profs = list(profiles)
            if profs:
                ps = pstats.Stats(profs[0], stream=buf)
                for p in profs[1:]:
                    ps.add(p)
                ps.sort_stats("tottime").print_stats(int(cmd[1]) if len(cmd) > 1 else 25)
            emit({"ev": "profile", "n": len(profs), "text": buf.getvalue()})
        elif cmd[0] == "quit":
            break
    stop.set()
    sys.stdout.flush()
    os._exit(0)  # no shutdown(): a killed agent does not close the rendezvous


# ------------------------------------------------------------- orchestrator

class Proc:
    """A child speaking JSON lines on stdout, commands on stdin."""

    def __init__(self, argv):
        self.p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  text=True, bufsize=1)
        self.lines = []
        self.cv = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.p.stdout:
            try:
                obj = json.loads(line)
            except ValueError:
                sys.stderr.write(line)
                continue
            with self.cv:
                self.lines.append(obj)
                self.cv.notify_all()
        with self.cv:
            self.lines.append({"ev": "eof"})
            self.cv.notify_all()

    def send(self, s):
        try:
            self.p.stdin.write(s + "\n")
            self.p.stdin.flush()
        except (BrokenPipeError, OSError):
            pass

    def wait_ev(self, ev, timeout):
        end = time.monotonic() + timeout
        with self.cv:
            while True:
                for j, o in enumerate(self.lines):
                    if o.get("ev") in (ev, "eof"):
                        del self.lines[j]
                        return o if o.get("ev") == ev else None
                left = end - time.monotonic()
                if left <= 0:
                    return None
                self.cv.wait(left)

    def close(self):
        try:
            self.p.stdin.close()
        except OSError:
            pass
        try:
            self.p.wait(5)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()


def fmt(v, nd=2):
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{nd}f}"
    return str(v)


def run_k(k, a, log):
    """One K: formation, steady state, node loss.  Returns (rows, stop_reason)."""
    res = {"K": k}
    notes = {}
    srv = Proc([PY, HERE, "--_serve"])
    hello = srv.wait_ev(None, 30)  # its one line has no "ev"
    if hello is None:
        srv.close()
        return res, notes, "store server did not start"
    port, spid = hello["port"], hello["pid"]
    res["libuv"] = hello["libuv"]
    res["server_rss0_mb"] = proc_rss_mb(spid)  # python + torch + an empty store

    P = max(1, min(a.procs, k))
    sizes = [k // P + (1 if j < k % P else 0) for j in range(P)]
    workers = [Proc([PY, HERE, "--_worker", "--port", str(port), "--k", str(k),
                     "--n", str(sizes[j]), "--monitor-interval", str(a.monitor_interval),
                     "--profile", str(a.profile if k == a.profile_k else 0)])
               for j in range(P)]
    stop_reason = None
    try:
        t0 = time.monotonic()
        for w in workers:
            r = w.wait_ev("ready", a.cap)
            if r is None:
                return res, notes, "handlers could not be created"
        res["create_s"] = time.monotonic() - t0
        log(f"  K={k}: {k} handlers created in {res['create_s']:.1f} s "
            f"({P} process(es)); store server pid {spid}, libuv={hello['libuv']}")

        # ---- formation
        cpu0, tf0 = proc_cpu_s(spid), time.monotonic()
        for w in workers:
            w.send("go")
        formed = []
        deadline = tf0 + a.cap
        for w in workers:
            r = None
            while r is None and time.monotonic() < deadline:
                r = w.wait_ev("formed", min(10.0, deadline - time.monotonic()))
                if r is None:
                    w.send("stats")
                    s = w.wait_ev("stats", 30)
                    if s:
                        log(f"    ... {time.monotonic() - tf0:.0f} s: {s['returned']} returned "
                            f"in this worker, largest participant list seen {s['parts']}, "
                            f"{s['compare_set']} compare_set "
                            f"({s['cas_fail']} failed), {s['get']} get, "
                            f"worker rss {s['rss_mb']:.0f} MB")
                        if s["rss_mb"] > a.max_worker_mb:
                            stop_reason = (f"worker RSS {s['rss_mb']:.0f} MB over "
                                           f"--max-worker-mb {a.max_worker_mb}")
                            break
                if stop_reason:
                    break
            if r is None:
                break
            formed.append(r)
        fcpu = proc_cpu_s(spid) - cpu0
        if len(formed) < P:
            tot = 0
            for w in workers:
                w.send("stats")
                s = w.wait_ev("stats", 30)
                tot += s["returned"] if s else 0
            stop_reason = stop_reason or (
                f"not formed within the {a.cap:.0f} s cap: {tot} of {k} handlers returned")
            if a.profile and k == a.profile_k:
                workers[0].send(f"profile {a.profile_lines}")
                pr = workers[0].wait_ev("profile", 120)
                if pr:
                    log(f"  K={k}: cProfile (thread CPU time) of {pr['n']} joining threads "
                        f"(still joining):\n" + pr["text"])
            res["formation_s"] = None
            notes["formation_s"] = stop_reason
            return res, notes, stop_reason
        last_call = max(f["last_call"] for f in formed)
        first_call = min(f["first_call"] for f in formed)
        last_ret = max(f["last_ret"] for f in formed)
        nerr = sum(f["n_errors"] for f in formed)
        res["formation_s"] = last_ret - last_call
        res["first_call_to_last_ret_s"] = last_ret - first_call
        res["formation_server_cpu_s"] = fcpu
        stats = []
        for w in workers:
            w.send("stats")
            stats.append(w.wait_ev("stats", 60))
        cs = sum(s["compare_set"] for s in stats)
        cf = sum(s["cas_fail"] for s in stats)
        gets = sum(s["get"] for s in stats)
        mb = sum(s["bytes_tx"] + s["bytes_rx"] for s in stats) / 1e6
        res.update(form_cas=cs, form_cas_fail=cf, form_get=gets, form_mb=mb)
        notes["formation_s"] = (
            f"last call->last return; first call->last return "
            f"{res['first_call_to_last_ret_s']:.2f} s; {cs} compare_set ({cf} failed), "
            f"{gets} get, {mb:.1f} MB through the store; server CPU {fcpu:.2f} s; "
            f"{P} process(es) x {sizes[0]} threads; errors {nerr}")
        log(f"  K={k}: formed in {res['formation_s']:.2f} s (first call -> last return "
            f"{res['first_call_to_last_ret_s']:.2f} s); {cs} CAS, {cf} failed, {gets} get, "
            f"{mb:.1f} MB; server CPU {fcpu:.2f} s; errors {nerr}")
        if nerr:
            log(f"    errors: {formed[0]['errors']}")

        # ---- steady state
        time.sleep(a.settle)
        s0 = []
        for w in workers:
            w.send("stats")
            s0.append(w.wait_ev("stats", 60))
        c0, t0 = proc_cpu_s(spid), time.monotonic()
        time.sleep(a.window)
        c1, t1 = proc_cpu_s(spid), time.monotonic()
        s1 = []
        for w in workers:
            w.send("stats")
            s1.append(w.wait_ev("stats", 60))
        dt = t1 - t0
        res["steady_cpu_pct"] = 100.0 * (c1 - c0) / dt
        res["steady_rss_mb"] = proc_rss_mb(spid)
        wcpu = sum(b["cpu_s"] - x["cpu_s"] for x, b in zip(s0, s1)) / dt * 100
        g = sum(b["get"] - x["get"] for x, b in zip(s0, s1)) / dt
        c = sum(b["compare_set"] - x["compare_set"] for x, b in zip(s0, s1)) / dt
        cfail = sum(b["cas_fail"] - x["cas_fail"] for x, b in zip(s0, s1)) / dt
        byt = sum(b["bytes_tx"] + b["bytes_rx"] - x["bytes_tx"] - x["bytes_rx"]
                  for x, b in zip(s0, s1)) / dt / 1e6
        nnw = sum(b["nnw_calls"] - x["nnw_calls"] for x, b in zip(s0, s1)) / dt
        workers[0].send("heartbeats 0")
        hb = workers[0].wait_ev("heartbeats", 60) or {}
        res.update(steady_get_per_s=g, steady_cas_per_s=c, steady_cas_fail_per_s=cfail,
                   steady_mb_per_s=byt, steady_worker_cpu_pct=wcpu, steady_nnw_per_s=nnw,
                   hb_age_max=hb.get("age_max"), hb_age_med=hb.get("age_med"),
                   worker_rss_mb=sum(b["rss_mb"] for b in s1),
                   worker_threads=sum(b["threads"] for b in s1))
        common = (f"{dt:.0f} s window {a.settle:.0f} s after formation; store ops/s: "
                  f"{g:.0f} get, {c:.1f} compare_set ({cfail:.1f} failed), {byt:.1f} MB/s; "
                  f"num_nodes_waiting calls/s {nnw:.0f} (nominal {k / a.monitor_interval:.0f}); "
                  f"simulating process(es) CPU {wcpu:.0f}% ; heartbeat age in state: "
                  f"median {fmt(hb.get('age_med'), 1)} s, max {fmt(hb.get('age_max'), 1)} s")
        notes["steady_cpu_pct"] = "% of one core; " + common
        notes["steady_rss_mb"] = (
            f"VmRSS of the store server process at the window's end; "
            f"{res['server_rss0_mb']:.0f} MB of it before any client (python + torch)")
        log(f"  K={k}: steady: server CPU {res['steady_cpu_pct']:.1f}%, RSS "
            f"{res['steady_rss_mb']:.0f} MB; {common}")

        # ---- node loss
        vw = len(workers) - 1
        vi = sizes[vw] - 1  # the last handler of the last worker
        workers[vw].send(f"kill {vi}")
        kr = workers[vw].wait_ev("killed", 60)
        for j, w in enumerate(workers):
            if j != vw:
                w.send(f"victim {kr['node']} {kr['t']}")
                w.wait_ev("watching", 60)
        t_kill = kr["t"]
        survivors = k - 1
        end = time.monotonic() + a.loss_window
        last = None
        while time.monotonic() < end:
            time.sleep(0.5)
            ss = []
            for w in workers:
                w.send("stats")
                ss.append(w.wait_ev("stats", 60))
            seen = sum(s.get("seen", 0) for s in ss)
            last = ss
            if seen >= survivors:
                break
        seen = sum(s.get("seen", 0) for s in last)
        firsts = [s["seen_first"] for s in last if s.get("seen_first")]
        lasts = [s["seen_last"] for s in last if s.get("seen_last")]
        nnw_max = max(s.get("nnw_max", 0) for s in last)
        res["loss_detect_s"] = (min(firsts) - t_kill) if firsts else None
        res["loss_all_s"] = (max(lasts) - t_kill) if seen >= survivors and lasts else None
        res["loss_nnw_max"] = nnw_max
        res["victim_hb_age_at_kill"] = kr.get("last_hb_age_s")
        notes["loss_detect_s"] = (
            f"kill -> first survivor's synced state drops the node (keep-alive expiry "
            f"5 s x 3 = 15 s after its last heartbeat, which was "
            f"{fmt(kr.get('last_hb_age_s'), 1)} s old at the kill); all {survivors} "
            f"survivors: {fmt(res['loss_all_s'])} s ({seen} saw it within "
            f"{a.loss_window:.0f} s); survivors' num_nodes_waiting() max {nnw_max}: "
            f"no agent acts on it (torchrun learns of a lost node from the workers' "
            f"collective failing)")
        log(f"  K={k}: loss: first survivor {fmt(res['loss_detect_s'])} s, all "
            f"{fmt(res['loss_all_s'])} s after the kill (victim's heartbeat was "
            f"{fmt(kr.get('last_hb_age_s'), 1)} s old); num_nodes_waiting max {nnw_max}")
        if a.profile and k == a.profile_k:
            workers[0].send(f"profile {a.profile_lines}")
            pr = workers[0].wait_ev("profile", 120)
            if pr:
                res["profile"] = pr["text"]
                log(f"  K={k}: cProfile (thread CPU time) of {pr['n']} joining threads:\n"
                    + pr["text"])
        return res, notes, None
    finally:
        for w in workers:
            w.send("quit")
        for w in workers:
            w.close()
        srv.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ks", default="16,64,256,1024,4096")
    ap.add_argument("--quick", action="store_true", help="K = 16, 64 only (< 60 s)")
    ap.add_argument("--json", help="append one JSON object per measurement here")
    ap.add_argument("--procs", type=int, default=1,
                    help="worker processes holding the K handlers (K/P threads each)")
    ap.add_argument("--cap", type=float, default=300.0, help="formation cap per K, s")
    ap.add_argument("--settle", type=float, default=5.0)
    ap.add_argument("--window", type=float, default=20.0, help="steady-state window, s")
    ap.add_argument("--loss-window", type=float, default=40.0)
    ap.add_argument("--monitor-interval", type=float, default=0.1,
                    help="the agent's monitor_interval (torchrun 2.15 default 0.1 s)")
    ap.add_argument("--max-worker-mb", type=float, default=12000.0,
                    help="stop a K whose simulating process grows past this RSS")
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="cProfile (thread CPU time) the first N joining threads ...")
    ap.add_argument("--profile-k", type=int, default=0, help="... at this K")
    ap.add_argument("--profile-lines", type=int, default=25)
    ap.add_argument("--no-hosts-fix", action="store_true")
    ap.add_argument("--_serve", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--_worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--_in_ns", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--k", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--n", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a._serve:
        return serve_main()
    if a._worker:
        return worker_main(a)

    if not a.no_hosts_fix and not a._in_ns and shutil.which("unshare"):
        tmp = tempfile.mkdtemp(prefix="trz_")
        hosts = os.path.join(tmp, "hosts")
        with open("/etc/hosts") as f, open(hosts, "w") as g:
            g.write(f.read().rstrip("\n") + "\n::ffff:127.0.0.1 localhost\n")
        argv = [PY, HERE, "--_in_ns"] + sys.argv[1:]
        cmd = ("mount --bind \"$0\" /etc/hosts && exec \"$@\"")
        r = subprocess.run(["unshare", "-m", "sh", "-c", cmd, hosts] + argv)
        shutil.rmtree(tmp, ignore_errors=True)
        if r.returncode != 126:  # 126: could not enter; fall through
            sys.exit(r.returncode)

    nofile = raise_nofile(65536)
    ks = [16, 64] if a.quick else [int(x) for x in a.ks.split(",") if x]
    if a.quick:
        a.window, a.settle = min(a.window, 4.0), min(a.settle, 0.5)
        a.loss_window = min(a.loss_window, 20.0)
    import torch

    def log(msg):
        print(msg, flush=True)

    log(f"torchrun c10d rendezvous bench: torch {torch.__version__}, python "
        f"{sys.version.split()[0]}, {os.cpu_count()} CPUs, RLIMIT_NOFILE {nofile}, "
        f"Ks {ks}, {a.procs} worker process(es), cap {a.cap:.0f} s/K, hosts fix "
        f"{'off' if a.no_hosts_fix else 'on'}")
    results = []
    jf = open(a.json, "a") if a.json else None
    for k in ks:
        t = time.monotonic()
        res, notes, stop = run_k(k, a, log)
        res["wall_s"] = time.monotonic() - t
        results.append(res)
        if jf:
            for m in ("formation_s", "steady_cpu_pct", "steady_rss_mb", "loss_detect_s"):
                if m in res or m in notes:
                    jf.write(json.dumps({
                        "bench": "rdzv", "tool": "torchrun-c10d", "K": k, "metric": m,
                        "value": res.get(m), "note": notes.get(m, stop or "")}) + "\n")
            jf.flush()
        if stop:
            log(f"  K={k}: stopped: {stop}")
            break

    log("")
    hdr = (f"{'K':>6} {'formation_s':>11} {'1st->last_s':>11} {'CAS':>8} {'CASfail':>8} "
           f"{'srvCPU%':>8} {'srvRSS_MB':>9} {'get/s':>7} {'MB/s':>7} {'hbAgeMax':>8} "
           f"{'loss_s':>7} {'lossAll_s':>9} {'nnwMax':>6}")
    log(hdr)
    for r in results:
        log(f"{r['K']:>6} {fmt(r.get('formation_s')):>11} "
            f"{fmt(r.get('first_call_to_last_ret_s')):>11} {fmt(r.get('form_cas')):>8} "
            f"{fmt(r.get('form_cas_fail')):>8} {fmt(r.get('steady_cpu_pct'), 1):>8} "
            f"{fmt(r.get('steady_rss_mb'), 0):>9} {fmt(r.get('steady_get_per_s'), 0):>7} "
            f"{fmt(r.get('steady_mb_per_s'), 1):>7} {fmt(r.get('hb_age_max'), 1):>8} "
            f"{fmt(r.get('loss_detect_s')):>7} {fmt(r.get('loss_all_s')):>9} "
            f"{fmt(r.get('loss_nnw_max')):>6}")
    for name, key in (("formation_s", "formation_s"), ("steady_cpu_pct", "steady_cpu_pct")):
        pts = [(r["K"], r[key]) for r in results if r.get(key)]
        if len(pts) >= 2:
            xs = [math.log(x) for x, _ in pts]
            ys = [math.log(y) for _, y in pts]
            mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
            slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / \
                sum((x - mx) ** 2 for x in xs)
            log(f"fit: {name} ~ K^{slope:.2f} (least squares of log vs log K, "
                f"K = {[p[0] for p in pts]})")
    if jf:
        jf.close()


if __name__ == "__main__":
    main()
