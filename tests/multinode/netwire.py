#!/usr/bin/env python3
"""netwire.py: a slow and lossy wire between two hosts, in user space (netem's delay and loss).

The kernel here has no netem qdisc (and no iptables/nftables), so the multi-node tests make the
link themselves: two TUN devices, one moved into each network namespace host, joined by this
relay. Every IP packet one host sends into its TUN device is read here and written into the
other host's device after a fixed one-way delay, unless it is dropped at random. Real packets
are lost, so TCP's own retransmission has to recover them, as on a bad network.

    netwire.py relay --tun-a A --tun-b B --delay SECONDS --loss FRACTION [--seed N]
        Creates TUN devices A and B (in the caller's namespace: move them into the hosts with
        `ip link set A netns NS` once "ready" is printed; the open file keeps them attached),
        then relays A <-> B until SIGTERM or SIGINT, and prints what it did (per direction:
        packets read, dropped, forwarded) on stderr at exit and on SIGUSR1.
    netwire.py echo ADDR:PORT
        A UDP echo server (the far end of `probe`), until killed.
    netwire.py probe ADDR:PORT [--count N] [--interval S] [--wait S]
        Sends N numbered UDP datagrams to an echo server, one every S seconds, and prints the
        fraction that did not come back and their round-trip times:
        "probe: sent N, received M, lost F, rtt min A median B max C".

What it models, and what not:
  - Delay: every packet of a direction waits the same --delay (one way, so a round trip takes
    twice it); packets leave in the order they came (a FIFO per direction: no reordering).
  - Loss: each packet is dropped with probability --loss, independently (Bernoulli, no bursts),
    drawn from random.Random(seed) for A->B and random.Random(seed + 1) for B->A, so a
    direction's drops depend only on its own packet count.
  - No bandwidth limit, no jitter, no duplication, no corruption, no MTU change (the TUN
    devices' 1500). A queue of more than --limit packets in one direction drops the newcomer
    (netem's limit, default 1000 there; 100000 here) and counts it as an overflow.
  - Precision: Python's select() timeout, about a millisecond; at a few thousand packets per
    second the relay's own time adds to the delay. It is a test tool for the rates of a
    launcher's control traffic and small collectives, not for bulk transfers.
Python 3 standard library only (fcntl/ioctl TUNSETIFF, select). Needs CAP_NET_ADMIN.
"""
import argparse
import collections
import fcntl
import os
import random
import select
import signal
import socket
import statistics
import struct
import sys
import time

TUNSETIFF = 0x400454CA  # _IOW('T', 202, int)
IFF_TUN = 0x0001
IFF_NO_PI = 0x1000


def open_tun(name):
    """Creates (or attaches to) the TUN device `name`; returns its non-blocking file descriptor."""
    if len(name.encode()) > 15:
        sys.exit(f"netwire: TUN name '{name}' is longer than 15 bytes (IFNAMSIZ)")
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TUN | IFF_NO_PI))
    except OSError as e:
        os.close(fd)
        sys.exit(f"netwire: TUNSETIFF '{name}': {e.strerror} (needs CAP_NET_ADMIN and /dev/net/tun)")
    return fd


class Direction:
    """One direction of the wire: packets read from `src`, written to `dst` after `delay`."""

    def __init__(self, name, src, dst, delay, loss, seed, limit):
        self.name, self.src, self.dst = name, src, dst
        self.delay, self.loss, self.limit = delay, loss, limit
        self.rng = random.Random(seed)
        self.queue = collections.deque()  # (due time, packet): FIFO, a fixed delay keeps it sorted
        self.read = self.dropped = self.overflow = self.forwarded = self.write_errors = 0

    def take(self, now):
        """Reads every packet waiting on src; each is dropped or queued for now + delay."""
        while True:
            try:
                packet = os.read(self.src, 65536)
            except BlockingIOError:
                return
            except OSError as e:  # the device went away (its namespace deleted): nothing to relay
                sys.exit(f"netwire: read {self.name}: {e.strerror}")
            self.read += 1
            if self.rng.random() < self.loss:
                self.dropped += 1
            elif len(self.queue) >= self.limit:
                self.overflow += 1
            else:
                self.queue.append((now + self.delay, packet))

    def deliver(self, now):
        """Writes every queued packet whose time has come; returns the next due time, or None."""
        while self.queue and self.queue[0][0] <= now:
            _, packet = self.queue.popleft()
            try:
                os.write(self.dst, packet)
                self.forwarded += 1
            except OSError:  # the far device down or its queue full: lost, as on a wire
                self.write_errors += 1
        return self.queue[0][0] if self.queue else None

    def stats(self):
        return (f"{self.name}: read {self.read}, dropped {self.dropped}, overflow {self.overflow}, "
                f"forwarded {self.forwarded}, write errors {self.write_errors}, queued {len(self.queue)}")


def relay(args):
    if not 0.0 <= args.loss < 1.0:
        sys.exit(f"netwire: --loss {args.loss} is not a fraction in [0, 1)")
    if args.delay < 0:
        sys.exit(f"netwire: --delay {args.delay} is negative")
    a, b = open_tun(args.tun_a), open_tun(args.tun_b)
    ab = Direction(f"{args.tun_a}->{args.tun_b}", a, b, args.delay, args.loss, args.seed, args.limit)
    ba = Direction(f"{args.tun_b}->{args.tun_a}", b, a, args.delay, args.loss, args.seed + 1, args.limit)
    by_fd = {a: ab, b: ba}

    def report(*_):
        print(f"netwire: delay {args.delay} s, loss {args.loss}, seed {args.seed}", file=sys.stderr)
        for d in (ab, ba):
            print(f"netwire: {d.stats()}", file=sys.stderr, flush=True)

    class Stop(Exception):
        pass

    def stop(*_):  # raised out of select(), which PEP 475 would otherwise resume, blocking
        raise Stop()

    signal.signal(signal.SIGUSR1, report)
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(f"ready {args.tun_a} {args.tun_b}", flush=True)
    next_due = None
    try:
        while True:
            timeout = None if next_due is None else max(0.0, next_due - time.monotonic())
            readable, _, _ = select.select([a, b], [], [], timeout)
            now = time.monotonic()
            for fd in readable:
                by_fd[fd].take(now)
            dues = [d for d in (ab.deliver(now), ba.deliver(time.monotonic())) if d is not None]
            next_due = min(dues) if dues else None
    except Stop:
        pass
    report()


def parse_addr(text):
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        sys.exit(f"netwire: '{text}' is not ADDR:PORT")
    return host, int(port)


def echo(args):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(parse_addr(args.addr))
    print("echo ready", flush=True)
    while True:
        data, peer = s.recvfrom(2048)
        s.sendto(data, peer)


def probe(args):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.connect(parse_addr(args.addr))
    s.setblocking(False)
    sent, rtts = {}, {}
    start = time.monotonic()
    end = start + args.count * args.interval + args.wait
    while True:
        now = time.monotonic()
        if now >= end or (len(sent) == args.count and len(rtts) == args.count):
            break
        if len(sent) < args.count and now >= start + len(sent) * args.interval:
            seq = len(sent)
            sent[seq] = now
            s.send(struct.pack("!I", seq) + b"\0" * 60)
            continue
        due = start + len(sent) * args.interval if len(sent) < args.count else end
        select.select([s], [], [], max(0.0, min(due, end) - now))
        while True:
            try:
                data = s.recv(2048)
            except BlockingIOError:
                break
            seq = struct.unpack("!I", data[:4])[0]
            if seq in sent and seq not in rtts:
                rtts[seq] = time.monotonic() - sent[seq]
    n, m = len(sent), len(rtts)
    if m == 0:
        print(f"probe: sent {n}, received 0, lost 1.000", flush=True)
        return 1
    r = sorted(rtts.values())
    print(f"probe: sent {n}, received {m}, lost {(n - m) / n:.3f}, rtt min {r[0]:.3f} "
          f"median {statistics.median(r):.3f} max {r[-1]:.3f}", flush=True)
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("relay", help="relay packets between two TUN devices with delay and loss")
    r.add_argument("--tun-a", required=True)
    r.add_argument("--tun-b", required=True)
    r.add_argument("--delay", type=float, default=0.0, help="one-way delay, seconds")
    r.add_argument("--loss", type=float, default=0.0, help="fraction of packets dropped, each way")
    r.add_argument("--seed", type=int, default=1)
    r.add_argument("--limit", type=int, default=100000, help="most packets queued per direction")
    e = sub.add_parser("echo", help="UDP echo server")
    e.add_argument("addr")
    q = sub.add_parser("probe", help="UDP round trips to an echo server")
    q.add_argument("addr")
    q.add_argument("--count", type=int, default=300)
    q.add_argument("--interval", type=float, default=0.005)
    q.add_argument("--wait", type=float, default=2.0, help="seconds to wait after the last send")
    args = p.parse_args()
    return {"relay": relay, "echo": echo, "probe": probe}[args.cmd](args) or 0


if __name__ == "__main__":
    sys.exit(main())
