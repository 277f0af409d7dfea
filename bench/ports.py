"""Ports for the bench scripts, reserved rather than probed (the race a probe leaves: bind(0), close, and any
process may take the port before the job binds it).

reserve_port() returns a socket bound to a free 127.0.0.1 port with SO_REUSEADDR and never listening, held by
the caller: no other bind(0) gets the port while it is open, and lspawn or a TCPStore (both set SO_REUSEADDR)
can still bind and listen on it (supervisor/port.hpp does the same in C++). free_port() is the same, held until
the script exits, for scripts that pass a number around. Import it with the script's folder's parent on
sys.path: `sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))`.
"""
import socket

_held = []


def reserve_port():
    s = socket.socket()
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", 0))
    except BaseException:
        s.close()
        raise
    return s


def free_port():
    s = reserve_port()
    _held.append(s)
    return s.getsockname()[1]
