"""The Python side of bench/soak/soak.py: one interpreter calling lspawn.spawn() N times.

    spawn_driver.py N CHECKPOINTS      (CHECKPOINTS: comma-separated job counts)

Before the job whose count is in CHECKPOINTS (and after the last one) it prints
"checkpoint <jobs done>" and waits for a line on stdin: the soak measures this process while it
does nothing. Each job is spawn(fn, nprocs=2) (start_method "spawn": a fresh interpreter per
process under the native launcher) and must return [0, 1]."""
import sys

import lspawn


def ident(i):
    return i


def checkpoint(done):
    sys.stdout.write("checkpoint %d\n" % done)
    sys.stdout.flush()
    if sys.stdin.readline().strip() != "go":
        sys.exit("spawn_driver: the soak went away")


if __name__ == "__main__":
    n = int(sys.argv[1])
    marks = {int(x) for x in sys.argv[2].split(",") if x}
    for done in range(n):
        if done in marks:
            checkpoint(done)
        got = lspawn.spawn(ident, nprocs=2)
        if got != [0, 1]:
            sys.exit("spawn_driver: job %d returned %r, expected [0, 1]" % (done + 1, got))
    checkpoint(n)
