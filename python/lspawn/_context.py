"""ProcessContext: what spawn(join=False) returns; the files a run's processes leave in its directory."""
import json
import os
import shutil


class ProcessContext:
    """The processes of one spawn() call (torch.multiprocessing.ProcessContext's contract).

    join(timeout=None) waits for them: True once every process ended successfully, False when
    `timeout` seconds passed with some still running; when one fails, the others are stopped
    (SIGTERM, SIGKILL after the grace period) and the root cause is raised as
    ProcessRaisedException (it raised an exception) or ProcessExitedException (an exit code or a
    signal). A later join() raises the same exception again. pids() lists the processes' pids
    by index.
    """

    def join(self, timeout=None):
        raise NotImplementedError

    def pids(self):
        raise NotImplementedError


def read_error(directory, index):
    """(time, traceback text) that process `index` wrote when its function raised, or None."""
    try:
        with open(os.path.join(directory, "error.%d" % index)) as f:
            report = json.load(f)
        return float(report["time"]), str(report["traceback"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def remove_dir(directory):
    shutil.rmtree(directory, ignore_errors=True)
