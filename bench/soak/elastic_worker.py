"""The worker of bench/soak/soak.py's elastic job (one rank per node, two lspawn nodes).

    elastic_worker.py DIR ROUNDS

Each round r (TORCHELASTIC_RESTART_COUNT) writes DIR/ready-<r>-<RANK> and waits for DIR/go-<r>,
so that the soak measures both lspawns at the same point of every round (it waits without
forking: no transient process to count). Until round ROUNDS, rank 1 then fails (exit 3) and
rank 0 waits to be stopped (SIGTERM, the default action); in round ROUNDS both exit 0.
It first writes the "rendezvous" marker (status/phase.hpp) a real worker's init_process_group
writes: a failure after it is restarted (one before it would end the job, as an ImportError's)."""
import os
import signal
import sys
import time

d, rounds = sys.argv[1], int(sys.argv[2])
r, rank = int(os.environ["TORCHELASTIC_RESTART_COUNT"]), os.environ["RANK"]
status = os.environ.get("LSPAWN_STATUS_DIR")
if status:
    marker = os.path.join(status, "rank-%s.rendezvous" % rank)
    with open(marker + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.rename(marker + ".tmp", marker)
open(os.path.join(d, "ready-%d-%s" % (r, rank)), "w").close()
while not os.path.exists(os.path.join(d, "go-%d" % r)):
    time.sleep(0.005)
if r >= rounds:
    sys.exit(0)
if rank == "1":
    sys.exit(3)
while True:
    signal.pause()
