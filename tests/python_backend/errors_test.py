"""The backend's refusals: an op it does not do, a torch it has no build for, a bad setting.

- all_reduce with ReduceOp.AVG on an int64 tensor: refused, naming the op, the reduction and what to use.
- ReduceOp.PREMUL_SUM (torch 2.x): refused, naming the op and the backend to use (nccl).
- LSPAWN_BACKEND_SHM=2: refused, naming the variable and its values; LSPAWN_SHM_CUDA_IPC=yes and
  LSPAWN_SHM_CUDA_IPC_MIN_BYTES=2MiB alike, at init (not at a first CUDA tensor, which a CPU machine never has).
- No shim for this torch (an empty shim folder, a cache elsewhere, no package shims): init_process_group fails
  with an error that names the torch release, the releases this install has, and the command that builds one;
  then that very command (`python -m lspawn.distributed build --out DIR`) is run, and the backend works.
  The build takes 20-50 s; LSPAWN_TEST_SKIP_BUILD=1 skips that last part.
- A shim built from another lspawn's source (before an upgrade; another environment's), in a folder looked in
  first, is not loaded: the error names it and the build command.
- Registering twice is harmless.
- destroy_process_group() and init_process_group() again, three times in one process on one store (as elastic
  recovery does; torch 2.x): each generation's world and subgroup run on shm (the second used to read the
  first's gloo addresses and time out).
- Loading the shim does not import torch.utils.cpp_extension (only a build needs it: ~120 ms per rank, and a
  CUDA torch on a machine without CUDA prints "No CUDA runtime is found" on every rank when it is imported).
"""
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402


def worker():
    import torch
    mode = sys.argv[sys.argv.index("--worker") + 1]
    if mode == "bad-setting":  # read at init (the CUDA ones too: a CPU machine never meets a CUDA tensor)
        name, value = os.environ["BAD_SETTING"], os.environ[os.environ["BAD_SETTING"]]
        try:
            harness.init()
        except Exception as e:
            print("refused: %s" % e)
            sys.exit(0 if "%s='%s'" % (name, value) in str(e) and "expected" in str(e) else 3)
        sys.exit(4)
    if mode == "reinit":  # destroy_process_group, then init again in the same process (elastic recovery's way)
        import torch.distributed as dist
        import lspawn.distributed as ld
        n = int(os.environ["WORLD_SIZE"])
        for generation in range(3):
            harness.init()
            sub = dist.new_group(list(range(n)))  # named again from 1 after each destroy, as the world from 0
            for group in (None, sub):
                t = torch.ones(4)
                dist.all_reduce(t, group=group)
                if not torch.equal(t, torch.full((4,), float(n))) or ld.transport(group) != "shm":
                    print("generation %d: all_reduce %s on %s" % (generation, t.tolist(), ld.transport(group)))
                    sys.exit(3)
            dist.destroy_process_group()
        print("three generations of the world and a subgroup on one store: shm, right")
        sys.exit(0)
    if mode == "noshim":
        try:
            harness.init()
        except Exception as e:
            print("refused: %s" % e)
            sys.exit(0 if "python -m lspawn.distributed build" in str(e).replace(sys.executable, "python")
                     and torch.__version__ in str(e) else 3)
        sys.exit(4)
    if mode == "stale":  # the folder holds this torch's shim built from other sources only: none may load
        try:
            harness.init()
        except Exception as e:
            text = str(e).replace(sys.executable, "python")
            print("refused: %s" % text)
            stale = os.environ["STALE_SHIMS"].split(os.pathsep)
            sys.exit(0 if "another lspawn's source" in text and all(p in text for p in stale)
                     and "python -m lspawn.distributed build" in text else 3)
        sys.exit(4)
    dist = harness.init()
    import lspawn.distributed as ld
    ld.register()
    ld.register()  # harmless
    failures = []
    if "torch.utils.cpp_extension" in sys.modules:  # only building a shim needs it (~120 ms a rank, and a warning)
        failures.append("init_process_group imported torch.utils.cpp_extension: a CUDA torch without CUDA warns "
                        "'No CUDA runtime is found' on every rank")
    try:
        dist.all_reduce(torch.ones(4, dtype=torch.int64), op=dist.ReduceOp.AVG)
        failures.append("AVG on int64 was not refused")
    except RuntimeError as e:
        text = str(e)
        print("AVG int64: %s" % text.splitlines()[0])
        if not ("all_reduce" in text and "AVG" in text and "SUM" in text):
            failures.append("AVG's error does not name the op and the alternative: %s" % text)
    maker = getattr(dist, "_make_nccl_premul_sum", None)
    if maker is not None:
        try:
            dist.all_reduce(torch.ones(4), op=maker(2.0))
            failures.append("PREMUL_SUM was not refused")
        except RuntimeError as e:
            text = str(e)
            print("PREMUL_SUM: %s" % text.splitlines()[0])
            if not ("all_reduce" in text and "PREMUL_SUM" in text and "nccl" in text):
                failures.append("PREMUL_SUM's error does not name the op and the backend to use: %s" % text)
    t = torch.ones(4)
    dist.all_reduce(t)  # still works after the refusals
    if not torch.equal(t, torch.full((4,), float(dist.get_world_size()))):
        failures.append("all_reduce after the refusals: %s" % t.tolist())
    if failures:
        print("\n".join(failures))
        sys.exit(1)
    print("refusals right")


def build_refusals(tmp, env):
    """The build command's failures: no compiler, a compiler that fails. Each names what failed, exits 1,
    and leaves nothing in --out (no half-written shim, no object file)."""
    out = os.path.join(tmp, "refused")
    cases = [({"CXX": os.path.join(tmp, "no-such-c++")}, "no C++ compiler %r" % os.path.join(tmp, "no-such-c++")),
             ({"CXX": "false"}, "building the backend's shim failed (exit 1):\nfalse -c")]
    for extra, expected in cases:
        proc = subprocess.run([sys.executable, "-m", "lspawn.distributed", "build", "--out", out],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env=dict(os.environ, **env, **extra))
        left = sorted(os.listdir(out)) if os.path.isdir(out) else []
        print("build with CXX=%s: exit %d: %s" % (extra["CXX"], proc.returncode, proc.stdout.strip().splitlines()[-1:]))
        if proc.returncode != 1 or expected not in proc.stdout or left:
            raise SystemExit("FAILED: the build with CXX=%s: exit %d (want 1), %r not in its output, left %s:\n%s"
                             % (extra["CXX"], proc.returncode, expected, left, proc.stdout[-2000:]))


def stale_shims(tmp, env):
    """A shim built from another lspawn's source (its digest in the name differs; an older lspawn's name has none)
    is not loaded: init_process_group refuses, naming those files and the build command. The shim is the one
    this test's build made (LSPAWN_BACKEND_SHIM_DIR), copied under those names."""
    from lspawn.distributed import _build
    import shutil
    built = os.path.join(os.environ["LSPAWN_BACKEND_SHIM_DIR"], _build.shim_filename())
    stale_dir = os.path.join(tmp, "stale")
    os.mkdir(stale_dir)
    stale = [os.path.join(stale_dir, _build.shim_stem() + suffix) for suffix in ("-000000000000.so", ".so")]
    for path in stale:
        shutil.copy(built, path)
    results = harness.run_ranks(os.path.abspath(__file__), 2, ["stale"],
                                env=dict(env, LSPAWN_BACKEND_SHIM_DIR=stale_dir, STALE_SHIMS=os.pathsep.join(stale)))
    print(results[0][2].strip()[:800])


def main():
    here = os.path.abspath(__file__)
    harness.run_ranks(here, 2, ["ops"])
    if harness.torch_major() >= 2:  # 1.13's own store-based barrier counts across inits: a second init on one
        harness.run_ranks(here, 2, ["reinit"], timeout=120)  # store times out in torch, whatever the backend
    else:
        print("reinit: not on torch 1.13 (its store-based barrier fails a second init on one store, gloo's too)")
    for name, value in (("LSPAWN_BACKEND_SHM", "2"), ("LSPAWN_SHM_CUDA_IPC", "yes"),
                        ("LSPAWN_SHM_CUDA_IPC_MIN_BYTES", "2MiB")):
        harness.run_ranks(here, 2, ["bad-setting"], env={"BAD_SETTING": name, name: value})
    with tempfile.TemporaryDirectory() as tmp:
        empty = os.path.join(tmp, "empty")
        os.mkdir(empty)
        env = {"LSPAWN_BACKEND_SHIM_DIR": empty, "XDG_CACHE_HOME": os.path.join(tmp, "cache")}
        results = harness.run_ranks(here, 2, ["noshim"], env=env)
        print(results[0][2].strip()[:600])
        build_refusals(tmp, env)
        stale_shims(tmp, env)
        if os.environ.get("LSPAWN_TEST_SKIP_BUILD") == "1":
            return
        out = os.path.join(tmp, "built")
        proc = subprocess.run([sys.executable, "-m", "lspawn.distributed", "build", "--out", out],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=dict(os.environ, **env))
        if proc.returncode != 0:
            raise SystemExit("FAILED: the build command failed:\n" + proc.stdout[-4000:])
        print("built %s" % proc.stdout.strip().splitlines()[-1])
        env["LSPAWN_BACKEND_SHIM_DIR"] = out
        harness.run_ranks(here, 2, ["ops"], env=env)
        print("the freshly built shim works")


if __name__ == "__main__":
    if "--worker" in sys.argv:
        worker()
    else:
        main()
