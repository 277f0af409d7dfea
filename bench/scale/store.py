#!/usr/bin/env python3
"""Rank 0's rendezvous store under W simulated ranks: TCPStore, TCPStore's libuv server (2.x) and
lspawn's gate in front of TCPStore, side by side (issue #35, docs/scale-store.md).

  bench/scale/store.py [options] BENCH[=LABEL] [BENCH[=LABEL] ...]

BENCH is a built lspawn_bench_store (build/bench/scale/lspawn_bench_store for LibTorch 1.13,
build-torch2/bench/scale/lspawn_bench_store for 2.15); several are run in turn for each W, so that
their numbers come from the same minutes of the same machine. Each runs every mode its LibTorch
has. This script builds nothing.

  --worlds 64,256,...   default 64,256,1024,4096,16384 (--quick: 256,1024)
  --repeat R            repetitions per (bench, mode, W); the table shows medians (default 3)
  --clients C --peers N passed on (defaults 16 and 8)
  --json PATH           the benches' JSON lines, all of them (default: a temporary file)
  --quick               W = 256 and 1024, then the growth checks below; exit 1 when one fails:
                          gate / TCPStore (the same server behind the gate) at W=1024 <= 1.5
                          (<= 2.0 where that server is libuv's, 2.x)
                          gate's time at W=1024 / at W=256 <= 8 (linear is 4)
                        ratios of one run, never an absolute time.

As root, each bench runs in a mount namespace of its own (unshare -m) whose /etc/resolv.conf names
only 127.0.0.1 (--keep-dns: not): LibTorch 2.x's TCPStore makes a reverse DNS query (PTR) for the
peer of each connection, at both ends, and a resolver that drops one costs glibc's 5 s timeout; on
the machine these numbers come from, W=64 took 10 s instead of 0.13 s. With no resolver the query
fails at once (port unreachable). 1.13 makes no such query.

As root, when W needs more connections per destination than the ephemeral port range holds, the
range is widened to 1024-65535 for the run (net.ipv4.ip_local_port_range, said on stdout) and put
back afterwards.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

PORT_RANGE = "/proc/sys/net/ipv4/ip_local_port_range"
# gate / TCPStore at the larger quick W, by the server behind the gate. The legacy server does
# O(W) work per wake itself (poll() over every socket), so an O(1) relay in front of it hides in
# that: 0.9-1.0 at W=1024 on 1.13 (the O(W) gate: 2.3-3.4). The libuv server does O(1) work per
# request, so the relay's own (twice the socket calls per request) shows: 1.1-1.8 on 2 loaded cores
# (the O(W) gate: 2.9). docs/scale-store.md.
QUICK_RATIO = {"legacy": 1.5, "libuv": 2.0}
QUICK_GROWTH = 8.0  # gate's time at 4W / at W


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("benches", nargs="+")
    p.add_argument("--worlds")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--peers", default="8")
    p.add_argument("--json")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--keep-dns", action="store_true", help="use the machine's resolver (see above)")
    p.add_argument("--timeout", type=int, default=600, help="per measurement, seconds")
    a = p.parse_args()
    default = "256,1024" if a.quick else "64,256,1024,4096,16384"
    a.worlds = [int(w) for w in (a.worlds or default).split(",")]
    return a


def widen_ports(wmax):
    """Widens the ephemeral range when 2 connections per rank (1.13's clients) need more."""
    try:
        with open(PORT_RANGE) as f:
            old = f.read().split()
    except OSError:
        return None
    if 2 * wmax + 2048 <= int(old[1]) - int(old[0]) + 1:
        return None
    try:
        with open(PORT_RANGE, "w") as f:
            f.write("1024 65535")
    except OSError as e:
        print(f"# cannot widen {PORT_RANGE} ({e}): W={wmax} may run out of ephemeral ports")
        return None
    print(f"# widened net.ipv4.ip_local_port_range {old[0]}-{old[1]} -> 1024-65535 for this run")
    return " ".join(old)


def main():
    a = parse()
    benches = []
    for b in a.benches:
        path, _, label = b.partition("=")
        if not os.access(path, os.X_OK):
            sys.exit(f"store.py: {path}: not an executable (build it: ninja -C BUILD lspawn_bench_store)")
        benches.append((path, label))
    out = a.json or tempfile.mktemp(prefix="lspawn-store-bench-", suffix=".jsonl")
    load = open("/proc/loadavg").read().split()[:3]
    print(f"# {time.strftime('%Y-%m-%dT%H:%M:%S')} {os.cpu_count()} CPUs, load {' '.join(load)}; "
          f"W {a.worlds}, {a.clients} client processes, peers {a.peers}, repeat {a.repeat}", flush=True)
    old_range = widen_ports(max(a.worlds)) if os.geteuid() == 0 else None
    rows = []
    try:
        with tempfile.TemporaryDirectory(prefix="lspawn-store-bench-") as tmp:
            wrap = no_resolver(tmp) if not a.keep_dns and os.geteuid() == 0 else []
            for w in a.worlds:
                for i, (path, label) in enumerate(benches):
                    part = os.path.join(tmp, f"{i}-{w}.jsonl")
                    cmd = [path, "--worlds", str(w), "--repeat", str(a.repeat), "--clients", str(a.clients),
                           "--peers", a.peers, "--timeout", str(a.timeout), "--json", part]
                    r = subprocess.run(wrap + cmd, capture_output=True, text=True)
                    new = [json.loads(l) for l in open(part)] if os.path.exists(part) else []
                    for row in new:
                        row["label"] = label or row["torch"]
                    rows += new
                    name = label or (new[0]["torch"] if new else path)
                    # c10d 2.x warns once per connection whose peer has no name (no resolver).
                    noname = "hostname of the client socket cannot be retrieved"
                    lines = r.stderr.splitlines()
                    for line in lines:
                        if noname not in line:
                            print(f"# {name}: {line}", flush=True)
                    if any(noname in line for line in lines):
                        print(f"# {name}: c10d: \"The {noname}\" x{sum(noname in l for l in lines)}")
                    if r.returncode != 0 and not new:
                        print(f"# {name}: W={w}: exit {r.returncode}: {r.stdout[-600:]}", flush=True)
    finally:
        if old_range:
            with open(PORT_RANGE, "w") as f:
                f.write(old_range)
            print(f"# put net.ipv4.ip_local_port_range back to {old_range}")
    with open(out, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    return report(a, rows, out)


def no_resolver(tmp):
    """The command prefix that runs a bench with /etc/resolv.conf naming only 127.0.0.1."""
    if not shutil.which("unshare"):
        print("# no unshare: the machine's resolver stays (2.x's reverse DNS queries, see --help)")
        return []
    conf = os.path.join(tmp, "resolv.conf")
    with open(conf, "w") as f:
        f.write("nameserver 127.0.0.1\n")
    probe = subprocess.run(["unshare", "-m", "sh", "-c", f"mount --bind {conf} /etc/resolv.conf"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        print(f"# cannot bind-mount a resolv.conf in a mount namespace ({probe.stderr.strip()}): "
              "the machine's resolver stays")
        return []
    print("# each bench runs with /etc/resolv.conf = nameserver 127.0.0.1 (unshare -m; --keep-dns: not)")
    return ["unshare", "-m", "sh", "-c", f'mount --bind {conf} /etc/resolv.conf && exec "$@"', "bench"]


def medians(rows):
    """(label, tool, W, metric) -> median over the repetitions."""
    acc = {}
    for r in rows:
        acc.setdefault((r["label"], r["tool"], r["W"], r["metric"]), []).append(r["value"])
    return {k: statistics.median(v) for k, v in acc.items()}


def report(a, rows, out):
    m = medians(rows)
    cols = []
    for lab in dict.fromkeys(r["label"] for r in rows):
        for tool in ("tcpstore", "tcpstore-libuv", "lspawn-gate"):
            if any(k[0] == lab and k[1] == tool for k in m):
                cols.append((lab, tool))
    servers = {(r["label"], r["tool"]): r.get("server", "") for r in rows}
    print()
    print("init_s (median; ops/s and server CPU s in the JSON lines)")
    head = f"{'W':>7}"
    for lab, tool in cols:
        name = f"{lab}:{tool}" + (f"({servers.get((lab, tool))})" if tool == "lspawn-gate" else "")
        head += f" | {name:>24}"
    labs = list(dict.fromkeys(lab for lab, _ in cols))
    for lab in labs:
        head += f" | {lab}:gate/same"
    print(head)
    for w in a.worlds:
        line = f"{w:>7}"
        for lab, tool in cols:
            v = m.get((lab, tool, w, "init_s"))
            line += f" | {('%.3f' % v) if v is not None else 'failed':>24}"
        for lab in labs:
            rat = gate_ratio(m, servers, lab, w)
            line += f" | {('%.2f' % rat) if rat else '-':>{len(lab) + 10}}"
        print(line)
    # Growth: slope of log(init_s) against log(W), per column, over the W measured.
    print()
    for lab, tool in cols:
        pts = [(w, m[(lab, tool, w, "init_s")]) for w in a.worlds if (lab, tool, w, "init_s") in m]
        if len(pts) >= 2:
            print(f"growth {lab}:{tool}: time ~ W^{slope(pts):.2f} over W={pts[0][0]}..{pts[-1][0]}")
    print(f"# JSON lines: {out}")
    if not a.quick:
        return 0
    return quick_checks(a, m, servers, labs)


def gate_ratio(m, servers, lab, w):
    same = "tcpstore-libuv" if servers.get((lab, "lspawn-gate")) == "libuv" else "tcpstore"
    g, t = m.get((lab, "lspawn-gate", w, "init_s")), m.get((lab, same, w, "init_s"))
    return g / t if g and t else None


def slope(pts):
    import math
    xs = [math.log(w) for w, _ in pts]
    ys = [math.log(t) for _, t in pts]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


def quick_checks(a, m, servers, labs):
    lo, hi = min(a.worlds), max(a.worlds)
    bad = []
    for lab in labs:
        rat = gate_ratio(m, servers, lab, hi)
        g_lo, g_hi = m.get((lab, "lspawn-gate", lo, "init_s")), m.get((lab, "lspawn-gate", hi, "init_s"))
        if rat is None or g_lo is None or g_hi is None:
            bad.append(f"{lab}: a measurement failed (above)")
            continue
        growth = g_hi / g_lo
        limit = QUICK_RATIO.get(servers.get((lab, "lspawn-gate")), 1.5)
        print(f"check {lab}: gate/TCPStore at W={hi}: {rat:.2f} (limit {limit}); "
              f"gate W={hi} / W={lo}: {growth:.2f} (limit {QUICK_GROWTH * (hi / lo) / 4:.1f}, linear {hi / lo:.0f})")
        if rat > limit:
            bad.append(f"{lab}: the gate takes {rat:.2f}x TCPStore's time at W={hi} (limit {limit})")
        if growth > QUICK_GROWTH * (hi / lo) / 4:
            bad.append(f"{lab}: the gate's time grows {growth:.2f}x from W={lo} to W={hi} "
                       f"(limit {QUICK_GROWTH * (hi / lo) / 4:.1f}, linear {hi / lo:.0f})")
    for b in bad:
        print(f"store.py --quick: FAILED: {b}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
