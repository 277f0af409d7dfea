"""`import lspawn as mp`: CUDA tensors in spawn's args, as torch.multiprocessing shares them (CUDA IPC handles).

Needs a GPU: exits 77 (skipped) where torch sees none (every CI machine of this project). On a GPU machine
(scripts/gpu-python-check.sh), each case in a fresh interpreter (a parent that initialised CUDA cannot fork):

- spawn, forkserver and preload: the parent's CUDA tensor reaches 3 ranks as a CUDA IPC handle; each rank writes
  its element on the device; the parent reads the ranks' writes in its own tensor afterwards. The same program
  with torch.multiprocessing.spawn first, which must give the same (the anchor). Each rank returns a CUDA tensor
  of its own: the parent gets its value, on the same device (a copy: the rank is gone by then).
- fork: refused before any process starts, naming CUDA (a forked CUDA context is unusable), as _fork.py says.
"""
import os
import subprocess
import sys
import tempfile
import textwrap

SKIP = 77

CASE = textwrap.dedent("""
    import sys
    import torch
    import {module} as mp

    def write(i, t):
        t[i] = i + 1
        torch.cuda.synchronize()
        return t[i:i + 1] * 10  # a CUDA tensor of this rank's: reaches the parent by value

    if __name__ == "__main__":
        t = torch.zeros(3, device="cuda")
        kwargs = {kwargs}
        try:
            values = mp.spawn(write, args=(t,), nprocs=3, **kwargs)
        except RuntimeError as e:
            print("refused:", str(e).splitlines()[0])
            sys.exit(0)
        if values is not None:  # lspawn: each rank's return value (torch.multiprocessing: None)
            print("returned", [(v.tolist(), str(v.device)) for v in values])
        print("parent sees", t.tolist(), "on", t.device)
""")


def run(module, kwargs):
    # A script file, not `python -c`: torch.multiprocessing's spawn children import the parent's __main__ by
    # its path to find `write`, and a `-c` program has none (its anchor failed so on the first GPU run).
    code = CASE.format(module=module, kwargs=kwargs)
    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, "cuda_case.py")
        with open(script, "w") as f:
            f.write(code)
        proc = subprocess.run([sys.executable, script], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              timeout=180, env=os.environ)
    out = proc.stdout.strip()
    print("[%s %s] exit %d: %s" % (module, kwargs, proc.returncode, out.splitlines()[-1] if out else ""))
    if proc.returncode != 0:
        raise SystemExit("FAILED: %s %s exited %d:\n%s" % (module, kwargs, proc.returncode, out[-3000:]))
    return out


def main():
    import torch
    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        print("no CUDA device: skipped (scripts/gpu-python-check.sh runs it on a GPU machine)")
        sys.exit(SKIP)
    want = "parent sees [1.0, 2.0, 3.0] on cuda:0"
    anchor = run("torch.multiprocessing", "{}")
    if want not in anchor:
        raise SystemExit("FAILED: torch.multiprocessing itself: %s (expected %s)" % (anchor, want))
    returned = "returned [([10.0], 'cuda:0'), ([20.0], 'cuda:0'), ([30.0], 'cuda:0')]"
    for kwargs in ('{"start_method": "spawn"}', '{"start_method": "forkserver"}',
                   '{"start_method": "spawn", "preload": ["torch"]}'):
        out = run("lspawn", kwargs)
        if want not in out:
            raise SystemExit("FAILED: lspawn %s: %s (expected %s, as torch.multiprocessing)" % (kwargs, out, want))
        if returned not in out:
            raise SystemExit("FAILED: lspawn %s: the ranks' CUDA return values: %s (expected %s)" % (kwargs, out, returned))
    out = run("lspawn", '{"start_method": "fork"}')
    if "refused" not in out or "CUDA" not in out:
        raise SystemExit("FAILED: fork with CUDA initialised was not refused naming CUDA: %s" % out)
    print("CUDA tensors in args: as torch.multiprocessing; fork refused")


if __name__ == "__main__":
    main()
