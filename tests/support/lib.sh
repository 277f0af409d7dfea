# Shell helpers of the test drivers (tests/**/*.sh), sourced:
#   source "$(dirname "${BASH_SOURCE[0]}")/../support/lib.sh"
# Defines functions only; sets no option and no variable.

# free_ports N: N TCP ports on 127.0.0.1 that were free a moment ago (each bound with port 0 at
# once, so they differ, then released), on one line.
free_ports() {
  python3 - "$1" <<'PY'
import socket, sys
socks = []
for _ in range(int(sys.argv[1])):
    s = socket.socket(); s.bind(("127.0.0.1", 0)); socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
PY
}

# free_port: one such port.
free_port() { free_ports 1; }
