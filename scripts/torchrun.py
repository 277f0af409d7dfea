#!/usr/bin/python3
"""torchrun for Debian's torch 1.13.1 on Python 3.11 (run it with /usr/bin/python3).

Debian's torchrun crashes at start on Python 3.11 ("'NoneType' object has no attribute 'get'"
in to_map): iterating an IntFlag no longer yields its 0-valued member, so
Std.from_str("0") returns None. This wrapper replaces Std.from_str with a version that parses
the value form ("0".."3") and the mapping form ("0:3,1:0") directly, then runs torchrun's
main() unchanged otherwise:

    /usr/bin/python3 scripts/torchrun.py --nproc_per_node 2 --no_python build/examples/hello_allreduce

(torchrun 1.13 spells its flags with underscores: --nproc_per_node, --master_port, ...)

Under torch 2.x (e.g. scripts/setup-torch2.sh's venv) the patch is not applied: the script is
then torchrun itself, so the same test runs an lspawn worker under either line's torchrun.
"""
import re
import sys

from torch.distributed.elastic.multiprocessing import api

_VALUE = re.compile(r"^[0-3]$")
_MAPPING = re.compile(r"^([0-9]+:[0-3],)*[0-9]+:[0-3]$")


def _from_str(vm):
    if _VALUE.match(vm):
        return api.Std(int(vm))
    if _MAPPING.match(vm):
        return {int(i): api.Std(int(v)) for i, v in (m.split(":") for m in vm.split(","))}
    raise ValueError(f"{vm} does not match: <{_VALUE.pattern}> or <{_MAPPING.pattern}>")


import torch

if torch.__version__.split(".")[0] == "1":  # fixed in torch 2.x: leave its torchrun as it is
    api.Std.from_str = staticmethod(_from_str)

if __name__ == "__main__":
    from torch.distributed.run import main

    sys.exit(main())
