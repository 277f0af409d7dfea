#!/usr/bin/python3
"""Long runs leak nothing (issue #47 item 5): many consecutive jobs through lspawn's three front
doors, many elastic rounds in one job, and workers SIGKILLed inside shm collectives, with every
figure the calling side keeps measured at the start, every --every jobs and at the end.

    python3 bench/soak/soak.py --build build            # full: 1,000 jobs per kind, 100 rounds, 10 kills
    python3 bench/soak/soak.py --build build --quick    # CI (ctest soak_quick): 20 (10 spawn()), 5, 1

Phases (each must leave nothing, and each figure must be as flat at its end as at its start):
  cli      `lspawn --nproc-per-node 2 lspawn_test_worker lines 1`, a new lspawn per job: the side
           that persists is the caller (this process).
  warm     `lspawn --warm` of the same program against one `lspawn daemon` kept running: the daemon
           and its warm forkserver.
  spawn    one Python process calling lspawn.spawn(fn, nprocs=2) N times (bench/soak/spawn_driver.py):
           that process and its guardian.
  elastic  one elastic job of two lspawn nodes on loopback (--nnodes 1:2, --rdzv-endpoint
           127.0.0.1:<free port>, --max-restarts R) whose rank 1 fails on purpose in every round
           until round R (bench/soak/elastic_worker.py): both lspawns and their guardians, measured
           at the same point of every round.
  kill     `lspawn --nproc-per-node 2 python3 shm_worker.py` (the shm engine, torch-free): once both
           ranks are in their all_reduce loop, one (rank 0, then 1, ...) is SIGKILLed; the job must
           end 137 and leave no segment in /dev/shm and no process.

  kill-construct rank 0 SIGKILLed inside the engine's construction, while it waits for a
           held-back rank 1 in the first barrier: the segment it had not unlinked yet must be
           removed (the Supervisor does it when it reaps rank 0: sys/shm_segments.hpp).
  kill-mp  `lspawn --nproc-per-node 2 python3 tests/e2e/fixtures/py_mp_names.py kill`: each rank makes
           a multiprocessing Queue (3 semaphore names in /dev/shm) and its temporary folder; rank 0
           SIGKILLs itself, lspawn stops rank 1. Neither may leave a name or a pymp-* folder
           (docs/python.md, "A killed worker leaves nothing"); as many jobs as --kills.

Figures: open fds (/proc/PID/fd) and VmRSS of each persistent process; entries under /tmp and
/dev/shm (files and directories, recursively: a run directory left inside a kept one counts);
the processes the soak started (its descendants, and any process carrying this run's
LSPAWN_SOAK_RUN marker in its environment, which reparented orphans keep). fds, entries and
processes must not change at all; RSS may grow by --rss-tolerance-kib (allocator noise: glibc's
free lists and arenas keep freed pages, and a process's first jobs fault in code and heap once).
Each phase compares its checkpoint after one warm-up job (or round) with its end; once a phase
has stopped what it started, /tmp, /dev/shm and the processes must be as before its first job.

As root, the soak runs in a mount namespace of its own with fresh tmpfs on /tmp and /dev/shm
(unshare(1)), so that other users of the machine cannot move those counts; otherwise it sets
TMPDIR to a private directory and counts that, and the /dev/shm entries named like lspawn's.
Exit status: 0 when every figure stayed flat, 1 naming each figure that grew or job that failed,
2 on a usage error. Standard library only."""
import argparse
import ctypes
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
MARKER = "LSPAWN_SOAK_RUN"
PR_SET_CHILD_SUBREAPER = 36


class Soak:
    def __init__(self, args):
        self.args = args
        self.failures = []
        self.run_id = os.environ.get(MARKER) or secrets.token_hex(6)
        self.namespace = os.environ.get("SOAK_IN_NAMESPACE") == "1"
        # The soak's own scratch (daemon socket, stores, ready files): not counted.
        self.work = tempfile.mkdtemp(prefix="soak-work-", dir="/tmp")
        if self.namespace:
            self.tmp = "/tmp"  # a tmpfs of this namespace alone
        else:
            self.tmp = tempfile.mkdtemp(prefix="soak-tmpdir-", dir="/tmp")
        self.env = dict(os.environ)  # the segments' label (SOAK_LABEL) carries run_id: cleanup finds them
        self.env.update({MARKER: self.run_id, "TMPDIR": self.tmp, "OMP_NUM_THREADS": "1",
                         "PYTHONPATH": os.path.join(REPO, "python"), "LSPAWN_BIN": args.lspawn,
                         "LSPAWN_GUARDIAN": args.guardian, "SOAK_ENGINE": args.engine,
                         "SOAK_LABEL": "soak" + self.run_id})
        self.env.pop("LSPAWN_E2E_START_METHOD", None)
        self.shm_at_start = set(os.listdir("/dev/shm"))

    # ---- figures -------------------------------------------------------------------------------
    @staticmethod
    def walk(top, skip=()):
        """Every file and directory under top, recursively (paths relative to it)."""
        found = []
        for root, dirs, files in os.walk(top):
            if root == top:
                dirs[:] = [d for d in dirs if d not in skip]
                files = [f for f in files if f not in skip]
            rel = os.path.relpath(root, top)
            found += [os.path.normpath(os.path.join(rel, n)) for n in dirs + files]
        return sorted(found)

    def tmp_entries(self):
        return self.walk(self.tmp, skip={os.path.basename(self.work)})

    def shm_entries(self):
        if self.namespace:
            return self.walk("/dev/shm")
        # Shared /dev/shm: what is new and named like lspawn's, or carries this run's label.
        return sorted(e for e in os.listdir("/dev/shm") if e not in self.shm_at_start
                      and ("lspawn" in e or self.run_id in e))

    @staticmethod
    def proc_table():
        table = {}
        for p in os.listdir("/proc"):
            if not p.isdigit():
                continue
            try:
                with open("/proc/%s/stat" % p) as f:
                    stat = f.read()
            except OSError:
                continue
            comm = stat[stat.index("(") + 1:stat.rindex(")")]
            rest = stat[stat.rindex(")") + 2:].split()
            table[int(p)] = (comm, rest[0], int(rest[1]))  # name, state, ppid
        return table

    def ours(self):
        """{pid: "name(state)"} of every process the soak started, itself excluded."""
        table = self.proc_table()
        me = os.getpid()
        found = {}
        for pid, (comm, state, _) in table.items():
            if pid == me:
                continue
            p, hops = pid, 0
            while p in table and p > 1 and hops < 64:
                p, hops = table[p][2], hops + 1
                if p == me:
                    found[pid] = "%s(%s)" % (comm, state)
                    break
            if pid in found:
                continue
            try:
                with open("/proc/%d/environ" % pid, "rb") as f:
                    if (MARKER + "=" + self.run_id).encode() in f.read().split(b"\0"):
                        found[pid] = "%s(%s)" % (comm, state)
            except OSError:
                pass
        return found

    @staticmethod
    def fds(pid):
        return len(os.listdir("/proc/%d/fd" % pid))

    @staticmethod
    def rss_kib(pid):
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return 0

    def children(self, pid, name=None):
        return sorted(p for p, (comm, _, ppid) in self.proc_table().items()
                      if ppid == pid and (name is None or comm == name))

    def figures(self, watched):
        """watched: {label: pid}. Returns {figure name: value}."""
        fig = {}
        for label, pid in watched.items():
            fig[label + " open fds"] = self.fds(pid)
            fig[label + " RSS KiB"] = self.rss_kib(pid)
        fig["/tmp entries"] = len(self.tmp_entries())
        fig["/dev/shm entries"] = len(self.shm_entries())
        procs = self.ours()
        names = {}
        for v in procs.values():
            names[v] = names.get(v, 0) + 1
        fig["processes"] = len(procs)
        fig["_process names"] = ", ".join("%s x%d" % kv for kv in sorted(names.items())) or "none"
        return fig

    # ---- reporting -----------------------------------------------------------------------------
    def show(self, phase, point, fig):
        parts = ["%s %s" % (k, v) for k, v in fig.items() if not k.startswith("_")]
        print("[%s] %s: %s (%s)" % (phase, point, ", ".join(parts), fig["_process names"]), flush=True)

    def fail(self, text):
        print("FAIL: " + text, flush=True)
        self.failures.append(text)

    def compare(self, phase, start, end):
        """start: after the warm-up job (or round); end: after the last."""
        tol = self.args.rss_tolerance_kib
        if set(start) != set(end):
            self.fail("%s: the persistent processes changed: %s at the start, %s at the end"
                      % (phase, sorted(k for k in start if not k.startswith("_")),
                         sorted(k for k in end if not k.startswith("_"))))
            return
        for k, v in end.items():
            if k.startswith("_"):
                continue
            if k.endswith("RSS KiB"):
                if v - start[k] > tol:
                    self.fail("%s: %s grew from %d to %d KiB (+%d KiB, tolerance %d KiB)"
                              % (phase, k, start[k], v, v - start[k], tol))
            elif v != start[k]:
                self.fail("%s: %s went from %d to %d%s" % (phase, k, start[k], v, self.detail(k)))

    def detail(self, figure):
        if figure == "/tmp entries":
            return ": " + " ".join(self.tmp_entries()[:10])
        if figure == "/dev/shm entries":
            return ": " + " ".join(self.shm_entries()[:10])
        if figure == "processes":
            return ": " + " ".join("%d %s" % kv for kv in sorted(self.ours().items())[:10])
        return ""

    def left_after(self, phase, before):
        """After a phase has stopped everything it started: nothing of it may be left."""
        deadline = time.monotonic() + 5  # a process that was stopped may still be exiting
        while True:
            now = self.figures({})
            if all(now[k] == before[k] for k in ("/tmp entries", "/dev/shm entries", "processes")):
                break
            if time.monotonic() > deadline:
                break
            self.reap()
            time.sleep(0.05)
        self.show(phase, "after it stopped", now)
        for k in ("/tmp entries", "/dev/shm entries", "processes"):
            if now[k] != before[k]:
                self.fail("%s: after it stopped, %s is %d, was %d before it%s"
                          % (phase, k, now[k], before[k], self.detail(k)))

    def reap(self):
        """Orphans reparented to this subreaper: collect their zombies (they were counted)."""
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return

    def checkpoints(self, n, every=None):
        every = every or self.args.every
        marks = {0, 1, n}
        marks.update(range(every, n, every))
        return sorted(m for m in marks if m <= n)

    def run_job(self, phase, i, cmd, want=0, **kw):
        r = subprocess.run(cmd, env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                           timeout=120, **kw)
        if r.returncode != want:
            tail = r.stderr.decode(errors="replace").strip().splitlines()[-5:]
            self.fail("%s: job %d exited %d, expected %d: %s" % (phase, i, r.returncode, want,
                                                                 " | ".join(tail)))
            return False
        return True

    # ---- phases --------------------------------------------------------------------------------
    def sequence(self, phase, n, job, watched):
        """Runs job(i) for i = 1..n, measuring `watched()` at each checkpoint."""
        marks = set(self.checkpoints(n))
        before = start = None
        for done in range(n + 1):
            if done in marks:
                fig = self.figures(watched())
                self.show(phase, "%d/%d jobs" % (done, n), fig)
                if done == 0:
                    before = fig
                if done == 1:
                    start = fig
            if done == n:
                break
            if not job(done + 1):
                return before  # named by run_job; what it left is still checked
        self.compare(phase, start, fig)
        return before

    def phase_cli(self):
        cmd = [self.args.lspawn, "--nproc-per-node", "2", self.args.worker, "lines", "1"]
        inject = set(x for x in self.args.inject.split(",") if x)
        self.injected = []

        def job(i):
            ok = self.run_job("cli", i, cmd)
            if i == 2:  # leaks made on purpose (--inject): after the start figure, before the end's
                if "fd" in inject:
                    self.injected.append(open(os.devnull))
                if "tmp" in inject:
                    open(os.path.join(self.tmp, "soak-injected"), "w").close()
                if "shm" in inject:
                    open("/dev/shm/lspawn-soak%s-injected" % self.run_id, "w").close()
                if "proc" in inject:
                    subprocess.Popen(["sleep", "30"], env=self.env, start_new_session=True)
            return ok

        before = self.sequence("cli", self.args.jobs, job, lambda: {"caller (soak)": os.getpid()})
        if before:
            self.left_after("cli", before)

    def phase_warm(self):
        sockdir = os.path.join(self.work, "daemon")
        os.mkdir(sockdir, 0o700)
        sock = os.path.join(sockdir, "daemon.sock")
        before = self.figures({})
        log = open(os.path.join(self.work, "daemon.log"), "wb")
        daemon = subprocess.Popen([self.args.lspawn, "daemon", "--socket", sock], env=self.env,
                                  stdout=log, stderr=log)
        deadline = time.monotonic() + 10
        while not os.path.exists(sock) and time.monotonic() < deadline:
            time.sleep(0.01)
        cmd = [self.args.lspawn, "--warm", "--daemon-socket", sock, "--nproc-per-node", "2",
               self.args.worker, "lines", "1"]

        def watched():
            w = {"daemon": daemon.pid}
            kids = self.children(daemon.pid)
            for k, pid in enumerate(kids):
                w["daemon's forkserver" + (" %d" % k if len(kids) > 1 else "")] = pid
            return w

        marks = set(self.checkpoints(self.args.jobs))
        start = fig = None
        n = self.args.jobs
        for done in range(n + 1):
            if done in marks:
                fig = self.figures(watched())
                self.show("warm", "%d/%d jobs" % (done, n), fig)
                if done == 1:
                    start = fig
            if done == n or not self.run_job("warm", done + 1, cmd):
                break
        if start and done == n:
            self.compare("warm", start, fig)
        daemon.send_signal(signal.SIGTERM)
        try:
            rc = daemon.wait(timeout=15)
        except subprocess.TimeoutExpired:
            daemon.kill()
            rc = daemon.wait()
        log.close()
        if rc != 0:
            self.fail("warm: the daemon exited %d after SIGTERM" % rc)
        self.left_after("warm", before)

    def phase_spawn(self):
        n = self.args.spawn_jobs
        marks = [m for m in self.checkpoints(n) if m < n]
        before = self.figures({})
        drv = subprocess.Popen([sys.executable, os.path.join(HERE, "spawn_driver.py"), str(n),
                                ",".join(map(str, marks))], env=self.env, stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        start = fig = None
        last = -1
        for line in drv.stdout:
            if not line.startswith("checkpoint "):
                continue
            last = done = int(line.split()[1])
            w = {"spawn() caller (python3)": drv.pid}
            for k, pid in enumerate(self.children(drv.pid, "lspawn-guardian")):
                w["its guardian" + (" %d" % k if k else "")] = pid
            fig = self.figures(w)
            self.show("spawn", "%d/%d jobs" % (done, n), fig)
            if done == 1:
                start = fig
            drv.stdin.write("go\n")
            drv.stdin.flush()
        drv.stdin.close()
        err = drv.stderr.read()
        rc = drv.wait()
        if rc != 0 or last != n:
            self.fail("spawn: the driver exited %d after %d of %d jobs: %s"
                      % (rc, max(last, 0), n, " | ".join(err.strip().splitlines()[-5:])))
        else:
            self.compare("spawn", start, fig)
        self.left_after("spawn", before)

    def phase_elastic(self):
        rounds = self.args.rounds
        d = os.path.join(self.work, "elastic")
        os.mkdir(d)
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        cmd = [self.args.lspawn, "--nnodes", "1:2", "--nproc-per-node", "1", "--rdzv-endpoint",
               "127.0.0.1:%d" % port, "--max-restarts", str(rounds), "--node-timeout", "30",
               sys.executable, os.path.join(HERE, "elastic_worker.py"), d, str(rounds)]
        before = self.figures({})
        logs = [open(os.path.join(self.work, "elastic-node%d.log" % k), "wb") for k in (0, 1)]
        nodes = [subprocess.Popen(cmd, env=self.env, stdout=logs[k], stderr=logs[k]) for k in (0, 1)]
        marks = set(self.checkpoints(rounds, max(1, self.args.every // 10)))  # rounds: 10x as often
        start = fig = None
        ok = True
        for r in range(rounds + 1):
            deadline = time.monotonic() + 60
            while not all(os.path.exists(os.path.join(d, "ready-%d-%d" % (r, k))) for k in (0, 1)):
                if time.monotonic() > deadline or any(n.poll() is not None for n in nodes):
                    self.fail("elastic: round %d did not start within 60 s (node exits %s)"
                              % (r, [n.poll() for n in nodes]))
                    ok = False
                    break
                time.sleep(0.005)
            if not ok:
                break
            if r in marks or r == rounds:
                w = {}
                for k, n in enumerate(nodes):
                    w["lspawn %s" % "ab"[k]] = n.pid
                    for g in self.children(n.pid, "lspawn-guardian"):
                        w["lspawn %s's guardian" % "ab"[k]] = g
                fig = self.figures(w)
                self.show("elastic", "round %d/%d" % (r, rounds), fig)
                if r == 1 or rounds == 0:
                    start = fig
            open(os.path.join(d, "go-%d" % r), "w").close()
        rcs = []
        for n in nodes:
            try:
                rcs.append(n.wait(timeout=60))
            except subprocess.TimeoutExpired:
                n.kill()
                rcs.append(n.wait())
        for f in logs:
            f.close()
        if ok and rcs != [0, 0]:
            self.fail("elastic: the nodes exited %s after %d rounds, expected [0, 0] (logs: %s)"
                      % (rcs, rounds, d))
        elif ok and start is not None:
            self.compare("elastic", start, fig)
        self.left_after("elastic", before)

    def phase_kill_construct(self):
        self.phase_kill(construct=True)

    def phase_kill(self, construct=False):
        """construct: rank 0 is SIGKILLed inside lspawn_engine_create, while it waits in the
        segment's first barrier for rank 1 (held back), i.e. after shm_open and before its unlink."""
        phase = "kill-construct" if construct else "kill"
        before = self.figures({})
        cmd = [self.args.lspawn, "--nproc-per-node", "2", sys.executable,
               os.path.join(HERE, "shm_worker.py")]
        for i in range(self.args.kills):
            store = os.path.join(self.work, "store-%d" % i)
            os.mkdir(store)
            env = dict(self.env, SOAK_STORE=store)
            if construct:
                env["SOAK_LATE_PEERS"] = "1"
            log = open(os.path.join(self.work, "%s-%d.log" % (phase, i)), "wb")
            job = subprocess.Popen(cmd, env=env, stdout=log, stderr=log)
            victim = 0 if construct else i % 2
            deadline = time.monotonic() + 60
            if construct:  # rank 0 in its create (its segment in /dev/shm), rank 1 held back
                paths = [os.path.join(store, "creating-0"), os.path.join(store, "late-1")]
                label = self.env["SOAK_LABEL"]
                ready = lambda: all(map(os.path.exists, paths)) and any(
                    label in e for e in os.listdir("/dev/shm"))
            else:
                paths = [os.path.join(store, "inloop-%d" % k) for k in (0, 1)]
                ready = lambda: all(map(os.path.exists, paths))
            while not ready():
                if time.monotonic() > deadline or job.poll() is not None:
                    break
                time.sleep(0.005)
            if not ready():
                job.kill()
                job.wait()
                log.close()
                self.fail("%s %d: the shm workers did not get there (lspawn exit %s, log %s)"
                          % (phase, i + 1, job.returncode, log.name))
                continue
            time.sleep(0.01 * (i % 5))  # vary the moment inside the loop
            with open(paths[victim]) as f:
                pid = int(f.read())
            os.kill(pid, signal.SIGKILL)
            try:
                rc = job.wait(timeout=60)
            except subprocess.TimeoutExpired:
                job.kill()
                rc = job.wait()
                self.fail(phase + " %d: lspawn did not end within 60 s after rank %d was SIGKILLed"
                          % (i + 1, victim))
            log.close()
            fig = self.figures({})
            where = "in the segment's first barrier" if construct else "mid-all_reduce"
            self.show(phase, "job %d/%d, rank %d (pid %d) SIGKILLed %s, lspawn exit %d"
                      % (i + 1, self.args.kills, victim, pid, where, rc), fig)
            if rc != 137:
                self.fail(phase + " %d: lspawn exited %d after rank %d was SIGKILLed, expected 137 "
                          "(log %s)"
                          % (i + 1, rc, victim, log.name))
            with open(log.name, errors="replace") as f:
                text = f.read()
            if "SIGKILL" not in text:
                self.fail(phase + " %d: lspawn's output does not name the SIGKILL (log %s)"
                          % (i + 1, log.name))
            shutil.rmtree(store, ignore_errors=True)
        self.left_after(phase, before)

    def phase_kill_mp(self):
        before = self.figures({})
        cmd = [self.args.lspawn, "--nproc-per-node", "2", sys.executable,
               os.path.join(REPO, "tests", "e2e", "fixtures", "py_mp_names.py"), "kill"]
        for i in range(self.args.kills):
            if self.run_job("kill-mp", i + 1, cmd, want=128 + signal.SIGKILL):
                self.show("kill-mp", "job %d/%d: rank 0 SIGKILLed itself, lspawn exit %d"
                          % (i + 1, self.args.kills, 128 + signal.SIGKILL), self.figures({}))
        self.left_after("kill-mp", before)  # the ranks' resource trackers end just after lspawn: waited for


def under(path, folder):
    path = os.path.realpath(path)
    return path == folder or path.startswith(folder + "/")


def enter_namespace(argv, needed):
    """As root: re-run inside a private mount namespace with fresh /tmp and /dev/shm. Returns
    the exit status of that run, or None when it cannot (then the soak runs here, shared): also
    when a path it needs (`needed`: this script, the binaries, the Python package) lies under
    /tmp or /dev/shm, which the fresh mounts would hide (a clone under /tmp, as a CI's may be)."""
    if os.environ.get("SOAK_IN_NAMESPACE") is not None or os.geteuid() != 0 \
            or not shutil.which("unshare") or not shutil.which("mount"):
        return None
    hidden = [p for p in needed if under(p, "/tmp") or under(p, "/dev/shm")]
    if hidden:
        print("soak: not in a private mount namespace: %s would be hidden by its fresh /tmp "
              "(the shared /tmp is used, with a private TMPDIR)" % hidden[0])
        return None
    probe = subprocess.run(["unshare", "--mount", "--propagation", "private", "mount", "-t", "tmpfs",
                            "-o", "size=1m", "soakprobe", "/dev/shm"], stderr=subprocess.DEVNULL)
    if probe.returncode != 0:
        return None
    script = ('mount -t tmpfs -o mode=1777,size=512m soak-tmp /tmp && '
              'mount -t tmpfs -o mode=1777,size=512m soak-shm /dev/shm && exec "$@"')
    env = dict(os.environ, SOAK_IN_NAMESPACE="1")
    return subprocess.call(["unshare", "--mount", "--propagation", "private", "sh", "-c", script,
                            "soak", sys.executable, os.path.abspath(__file__)] + argv, env=env)


def main():
    default_build = os.environ.get("LSPAWN_BUILD_DIR", os.path.join(REPO, "build"))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=default_build, help="the build directory (default %(default)s)")
    ap.add_argument("--lspawn", help="lspawn (default BUILD/launcher/lspawn)")
    ap.add_argument("--guardian", help="lspawn-guardian (default BUILD/supervisor/lspawn-guardian)")
    ap.add_argument("--worker", help="the e2e worker (default BUILD/tests/e2e/lspawn_test_worker)")
    ap.add_argument("--engine", help="liblspawn_engine.so (default BUILD/shm/liblspawn_engine.so)")
    ap.add_argument("--quick", action="store_true",
                    help="CI: 20 jobs per kind (10 spawn() calls), 5 rounds, 1 kill")
    ap.add_argument("--jobs", type=int, help="jobs per kind (default 1000, --quick 20)")
    ap.add_argument("--spawn-jobs", type=int,
                    help="spawn() calls (default --jobs; --quick 10: each call starts two interpreters)")
    ap.add_argument("--rounds", type=int, help="elastic rounds (default 100, --quick 5)")
    ap.add_argument("--kills", type=int, help="SIGKILLs mid-collective (default 10, --quick 1)")
    ap.add_argument("--every", type=int,
                    help="report every N jobs, every N/10 rounds (default 100, --quick 10)")
    ap.add_argument("--rss-tolerance-kib", type=int, default=1024,
                    help="RSS growth allowed per process, start to end (default %(default)s KiB)")
    ap.add_argument("--phases", default="cli,warm,spawn,elastic,kill,kill-construct,kill-mp",
                    help="which phases, comma-separated (default %(default)s)")
    ap.add_argument("--inject", default="",
                    help="check the soak itself: leaks to make in the cli phase, comma-separated: "
                         "fd (an fd of the caller per job), tmp (a /tmp entry), shm (a /dev/shm "
                         "entry), proc (a stray process); the run must then fail naming each")
    ap.add_argument("--no-namespace", action="store_true",
                    help="do not use a private mount namespace even as root")
    args = ap.parse_args()
    q = args.quick
    args.jobs = args.jobs if args.jobs is not None else (20 if q else 1000)
    args.spawn_jobs = args.spawn_jobs if args.spawn_jobs is not None else (
        10 if q and args.jobs == 20 else args.jobs)
    args.rounds = args.rounds if args.rounds is not None else (5 if q else 100)
    args.kills = args.kills if args.kills is not None else (1 if q else 10)
    args.every = args.every if args.every is not None else (10 if q else 100)
    b = args.build
    args.lspawn = os.path.abspath(args.lspawn or os.path.join(b, "launcher", "lspawn"))
    args.guardian = os.path.abspath(args.guardian or os.path.join(b, "supervisor", "lspawn-guardian"))
    args.worker = os.path.abspath(args.worker or os.path.join(b, "tests", "e2e", "lspawn_test_worker"))
    args.engine = os.path.abspath(args.engine or os.path.join(b, "shm", "liblspawn_engine.so"))
    phases = [p for p in args.phases.split(",") if p]
    known = ("cli", "warm", "spawn", "elastic", "kill", "kill-construct", "kill-mp")
    for p in phases:
        if p not in known:
            ap.error("--phases: unknown phase %r (%s)" % (p, ", ".join(known)))
    if args.jobs < 2 or args.spawn_jobs < 2 or args.rounds < 1 or args.kills < 0 or args.every < 1:
        ap.error("--jobs must be >= 2, --rounds >= 1, --kills >= 0, --every >= 1")
    for what in ("lspawn", "guardian", "worker", "engine"):
        if not os.path.exists(getattr(args, what)):
            ap.error("--%s: %s does not exist (build it, or give --build)" % (what, getattr(args, what)))

    if not args.no_namespace:
        rc = enter_namespace(sys.argv[1:], [os.path.abspath(__file__), REPO, args.lspawn, args.guardian,
                                            args.worker, args.engine])
        if rc is not None:
            return rc

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)  # orphans of the jobs come back here: counted
    soak = Soak(args)
    print("soak %s: %d jobs per kind (%d spawn() calls), %d elastic rounds, %d SIGKILLs "
          "mid-collective; lspawn %s; RSS tolerance %d KiB per process (allocator noise), "
          "fds, entries and processes exact; %s"
          % (soak.run_id, args.jobs, args.spawn_jobs, args.rounds, args.kills, args.lspawn,
             args.rss_tolerance_kib,
             "private /tmp and /dev/shm (mount namespace)" if soak.namespace else
             "shared machine: TMPDIR=%s counted, /dev/shm entries new and named lspawn" % soak.tmp),
          flush=True)
    t0 = time.monotonic()
    for p in phases:
        t = time.monotonic()
        getattr(soak, "phase_" + p.replace("-", "_"))()
        print("[%s] %.1f s" % (p, time.monotonic() - t), flush=True)
    for pid in soak.ours():  # what a failed phase left (counted above): this run's alone
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    soak.reap()
    shutil.rmtree(soak.work, ignore_errors=True)
    for e in os.listdir("/dev/shm"):  # segments of this run a failed phase left (counted above)
        if ("soak" + soak.run_id) in e:
            try:
                os.unlink(os.path.join("/dev/shm", e))
            except OSError:
                pass
    if not soak.namespace:
        shutil.rmtree(soak.tmp, ignore_errors=True)
    print("soak: %.1f s in all" % (time.monotonic() - t0))
    if soak.failures:
        print("soak: %d figure(s) or job(s) not flat:" % len(soak.failures))
        for f in soak.failures:
            print("  " + f)
        return 1
    print("soak: every figure flat")
    return 0


if __name__ == "__main__":
    sys.exit(main())
