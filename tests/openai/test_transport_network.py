"""Where a P/D worker's KV transport listens (issue 18, item 1).

Mooncake binds its handshake daemon and its TCP transport to the wildcard
address and authenticates no peer. kvc moves those binds to
`--kv-transport-host` (default: loopback when `--host` is not one address)
and refuses a network address without `--allow-unauthenticated-kv-transport`.
The checks read the processes' own sockets (`/proc/<pid>/fd` and
`/proc/<pid>/net/tcp{,6}`), so they hold whatever Mooncake does inside.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import socket
import subprocess
from pathlib import Path

import pytest

from conftest import ROOT, _free_port as free_port, wait_for
from test_disagg import BS, TOKEN, both, complete, decode_flags, ids, prefill_flags, start_decode, text  # noqa: F401 (both: a fixture)

LOOPBACK = ipaddress.ip_address("127.0.0.1")


def socket_inodes(pid: int) -> set[str]:
    """The inodes of every socket process `pid` holds."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    return inodes


def listeners(pid: int) -> list[tuple[ipaddress._BaseAddress, int, str]]:
    """(address, port, inode) of every listening TCP socket in the network
    namespace of process `pid`, whichever process holds it."""
    out = []
    for table in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if f[3] != "0A":
                continue
            hexaddr, hexport = f[1].split(":")
            raw = b"".join(int(hexaddr[i:i + 8], 16).to_bytes(4, "little") for i in range(0, len(hexaddr), 8))
            addr = ipaddress.ip_address(raw)
            if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
                addr = addr.ipv4_mapped
            out.append((addr, int(hexport, 16), f[9]))
    return out


def listening(pid: int) -> list[tuple[ipaddress._BaseAddress, int]]:
    """(address, port) of every TCP socket process `pid` listens on."""
    inodes = socket_inodes(pid)
    return [(addr, port) for addr, port, inode in listeners(pid) if inode in inodes]


def answering_for(pid: int, addr, port: int) -> bool:
    """Whether a connection to addr:port reaches a listener of process
    `pid`: it connects, and the listener that takes it (one on addr or on
    the wildcard address, in this network namespace) is the process's.
    Another process may listen on the same port at another address (the
    other servers of this module do, on loopback), which says nothing of
    `pid`."""
    if refused(addr, port):
        return False
    mine = socket_inodes(pid)
    # No listener at all: a TCP self-connect (the client's ephemeral port
    # was `port`), which reaches nobody.
    takers = [inode for a, p, inode in listeners(pid) if p == port and (a == addr or a.is_unspecified)]
    return any(inode in mine for inode in takers)


def http_port(server) -> int:
    return int(server.base_url.rsplit(":", 1)[1])


def network_address() -> ipaddress.IPv4Address | None:
    """A non-loopback IPv4 address of this machine (the one its default
    route leaves from), or None if it has none."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.connect(("192.0.2.123", 9))  # TEST-NET-1: nothing is sent
        addr = ipaddress.ip_address(s.getsockname()[0])
        return None if addr.is_loopback or addr.is_unspecified else addr
    except OSError:
        return None
    finally:
        s.close()


def refused(addr, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(2)
        return s.connect_ex((str(addr), port)) in (errno.ECONNREFUSED, errno.EHOSTUNREACH, errno.ENETUNREACH)


def test_p_and_d_listen_only_on_loopback_and_are_unreachable_from_another_address(start_server):
    p = start_server(*prefill_flags())
    d = start_decode(start_server, p)
    # A remote prefill: the transport is in use, not only started.
    out = complete(d, ids(7, 200))
    assert out["kvc"]["path"] == "remote_prefill", out["kvc"]
    other = network_address()
    for srv in (p, d):
        socks = listening(srv.proc.pid)
        transport = [(a, port) for a, port in socks if port != http_port(srv)]
        assert len(transport) >= 2, f"the handshake daemon and the TCP transport: {socks}"
        wild = [(a, port) for a, port in socks if a.is_unspecified]
        assert not wild, f"listening on the wildcard address: {wild} (all: {socks})"
        assert all(a == LOOPBACK for a, _ in socks), socks
        # What the attacker did: reach the transport from another
        # address of the machine.
        if other is not None:
            for _, port in transport:
                assert not answering_for(srv.proc.pid, other, port), f"port {port} answers on {other}"
        text = srv.log_path.read_text(errors="replace")
        assert "kv_transport_unrestricted" not in text, "the listeners were not restricted"
    # The gauge says the same.
    assert p.metrics().get('kvc_kv_transport_listeners{exposure="loopback",bound="wildcard"}') == 0.0
    assert p.metrics().get('kvc_kv_transport_listeners{exposure="loopback",bound="restricted"}', 0) >= 2


def run_to_exit(*flags: str, timeout_s: float = 120) -> subprocess.CompletedProcess:
    binary = Path(os.environ.get("KVC_SERVER_BIN", ROOT / "target" / "debug" / "kvc-server"))
    return subprocess.run([str(binary), "--port", str(free_port()), *flags], capture_output=True, text=True, timeout=timeout_s,
                          stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("host", ["192.0.2.77", "0.0.0.0"])
def test_a_network_or_wildcard_transport_address_is_refused_without_acknowledgment(host):
    r = run_to_exit("--host", "127.0.0.1", *prefill_flags("--kv-transport-host", host))
    assert r.returncode != 0
    err = r.stdout + r.stderr
    if host == "0.0.0.0":
        assert "every address of this host" in err, err[-2000:]
    else:
        assert "--allow-unauthenticated-kv-transport" in err and "no authentication" in err, err[-2000:]


def test_an_acknowledged_network_address_is_the_only_one_the_transport_listens_on(start_server):
    other = network_address()
    if other is None:
        pytest.fail("this test needs a non-loopback IPv4 address on the machine (none found)")
    p = start_server(*prefill_flags("--kv-transport-host", str(other), "--allow-unauthenticated-kv-transport"))
    socks = listening(p.proc.pid)
    transport = [(a, port) for a, port in socks if port != http_port(p)]
    assert len(transport) >= 2 and all(a == other for a, _ in transport), socks
    # Not on loopback either: only the configured address.
    for _, port in transport:
        assert not answering_for(p.proc.pid, LOOPBACK, port), f"port {port} answers on 127.0.0.1"
    assert p.metrics().get('kvc_kv_transport_listeners{exposure="network_acknowledged",bound="wildcard"}') == 0.0


# A client that connects, sends a line and reports what came back: "closed"
# (the server hung up at once) or "open" (the connection was kept, waiting
# for a well-formed request).
PROBE = r"""
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=5)
s.settimeout(float(sys.argv[2]))
try:
    s.sendall(b"{}\n")
    print("closed" if s.recv(1) == b"" else "open")
except (ConnectionResetError, BrokenPipeError):
    print("closed")
except socket.timeout:
    print("open")
"""


def probe(port: int, user: str | None, wait_s: float = 1.5) -> str:
    # The system Python: another user may not be able to read the venv.
    r = subprocess.run(["/usr/bin/python3", "-c", PROBE, str(port), str(wait_s)], capture_output=True, text=True, timeout=30,
                       user=user)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def test_another_users_process_cannot_connect_to_the_transport(start_server):
    """The accept guard: on this host only this user's processes (and
    peers that proved the cluster token) get a connection to the KV
    transport; another user's process is hung up on at once."""
    if os.geteuid() != 0:
        pytest.fail("this test starts a client as user `nobody` and must run as root (CI does)")
    p = start_server(*prefill_flags())
    # With D polling P and a remote prefill done, both have allowed their
    # peer's address (127.0.0.1): that must not let a local stranger in.
    d = start_decode(start_server, p)
    assert complete(d, ids(8, 200))["kvc"]["path"] == "remote_prefill"
    for srv in (p, d):
        transport = [port for a, port in listening(srv.proc.pid) if port != http_port(srv)]
        assert len(transport) >= 2
        before = srv.metrics().get("kvc_kv_transport_connections_refused_total", 0.0)
        for port in transport:
            # A refusal comes at once; the long wait covers Mooncake's handshake
            # daemon, which serves one connection at a time (up to 5 s each).
            assert probe(port, "nobody", wait_s=12) == "closed", f"another user's process kept a connection to port {port}"
            assert probe(port, None) == "open", f"this user's own process was refused on port {port}"
        assert srv.metrics().get("kvc_kv_transport_connections_refused_total", 0.0) >= before + len(transport)


# A stranger that writes a request's worth of bytes and closes at once,
# `n` times: its client socket is an orphan (listed as root's) by the
# time the guard looks.
FLOOD = r"""
import socket, sys
port, n = int(sys.argv[1]), int(sys.argv[2])
for _ in range(n):
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.sendall(b"\x00" * 64)
    s.close()
"""


def test_a_stranger_that_writes_and_closes_at_once_is_refused_every_time(start_server):
    """The accept-guard race (issue 31): `nobody` connects, writes and
    closes before the guard checks; its socket is then an orphan the kernel
    lists with uid 0, which passed for root's. Every such connection is
    refused now (counted), refused connections do not fill the accept
    queue, and the workers' own transfers go on."""
    if os.geteuid() != 0:
        pytest.fail("this test starts a client as user `nobody` and must run as root (CI does)")
    p = start_server(*prefill_flags())
    d = start_decode(start_server, p)
    assert complete(d, ids(9, 200))["kvc"]["path"] == "remote_prefill"
    n = 500
    for srv in (p, d):
        transport = [port for a, port in listening(srv.proc.pid) if port != http_port(srv)]
        before = srv.metrics().get("kvc_kv_transport_connections_refused_total", 0.0)
        for port in transport:
            r = subprocess.run(["/usr/bin/python3", "-c", FLOOD, str(port), str(n)], capture_output=True, text=True, timeout=120,
                               user="nobody")
            assert r.returncode == 0, r.stderr
        want = before + n * len(transport)
        got = wait_for(lambda: (v := srv.metrics().get("kvc_kv_transport_connections_refused_total", 0.0)) >= want and v, 60,
                       f"{n} refusals on each of {transport}")
        assert got == want, f"{want - before:.0f} stranger connections, {got - before:.0f} refused"
    # The transport still serves its own cluster, after the flood.
    assert complete(d, ids(10, 200))["kvc"]["path"] == "remote_prefill"


# A stranger flooding every given port for a while: connect, write a
# request's worth of marked bytes, close at once. Prints how many
# connections it made (each one the guard must refuse).
FLOOD_FOR = r"""
import socket, sys, time
ports = [int(p) for p in sys.argv[1].split(",")]
until = time.monotonic() + float(sys.argv[2])
made = 0
while time.monotonic() < until:
    for port in ports:
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
        except OSError:
            continue
        made += 1
        try:
            s.sendall(b"\xa5" * 64)
        except OSError:
            pass
        s.close()
print(made)
"""


def test_the_workers_transfer_during_a_strangers_flood_and_none_of_its_bytes_land(start_server, both):
    """Issue 31: `nobody` floods every transport port of P and D for 15 s
    (connect, write, close). Meanwhile D's remote prefills go on, each one
    transferred and answering as a colocated worker does; every stranger
    connection is refused (the refusals counted equal the connections
    made, so Mooncake read none of their bytes); and a session whose KV
    sat in D's pool through the flood (the canary) continues exactly as on
    a worker nobody touched."""
    if os.geteuid() != 0:
        pytest.fail("this test starts a client as user `nobody` and must run as root (CI does)")
    p = start_server(*prefill_flags())
    d = start_decode(start_server, p)
    canary = [ids(40, 300), None]
    canary[1] = canary[0] + ids(41, 40)
    first = complete(d, canary[0], session="canary", max_tokens=16)
    assert first["kvc"]["path"] == "remote_prefill"
    assert text(first) == text(complete(both, canary[0], session="canary", max_tokens=16))
    ports = {srv: [port for a, port in listening(srv.proc.pid) if port != http_port(srv)] for srv in (p, d)}
    before = {srv: srv.metrics().get("kvc_kv_transport_connections_refused_total", 0.0) for srv in (p, d)}
    floods = {srv: subprocess.Popen(["/usr/bin/python3", "-c", FLOOD_FOR, ",".join(map(str, ports[srv])), "15"],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, user="nobody")
              for srv in (p, d)}
    during = 0
    while any(f.poll() is None for f in floods.values()):
        prompt = ids(100 + during, 200)
        out = complete(d, prompt)
        assert out["kvc"]["path"] == "remote_prefill", f"request {during} during the flood: {out['kvc']}"
        assert text(out) == text(complete(both, prompt)), f"request {during} during the flood answered differently"
        during += 1
    # Before the guard's lookup was by the pair (sock_diag), the one
    # request sent during the flood waited for its end (15.7 s): reading
    # /proc/net/tcp, which the flood's TIME_WAIT entries grew, per
    # connection was slower than the flood, and the queue stayed full.
    assert during >= 5, f"only {during} remote prefills finished during a 15 s flood"
    for srv, f in floods.items():
        out, err = f.communicate(timeout=60)
        assert f.returncode == 0, err
        made = int(out)
        print(f"flood: {made} connections to {ports[srv]}")
        assert made >= 200, f"the flood made only {made} connections to {ports[srv]}"
        want = before[srv] + made
        got = wait_for(lambda: (v := srv.metrics().get("kvc_kv_transport_connections_refused_total", 0.0)) >= want and v, 60,
                       f"{made} refusals on {ports[srv]}")
        assert got == want, f"{made} stranger connections, {got - before[srv]:.0f} refused"
    # The canary session's KV, resident on D through the flood, is intact:
    # its next turn reuses it and answers as the untouched worker does.
    second = complete(d, canary[1], session="canary", max_tokens=16)
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] >= len(canary[0]) // BS * BS, second["kvc"]
    assert text(second) == text(complete(both, canary[1], session="canary", max_tokens=16))
    # And after the flood.
    assert complete(d, ids(99, 200))["kvc"]["path"] == "remote_prefill"


def test_an_ipv6_transport_host_binds_every_listener_there_and_transfers(start_server):
    """`--kv-transport-host ::1` (issue 31): Mooncake's handshake daemon
    listened on IPv4's 0.0.0.0 (every IPv4 address of the host) and the pair
    could not transfer (remote prefills fell back to local). kvc now asks
    Mooncake for IPv6 listeners, every transport listener is on ::1, and
    the KV moves."""
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
    except OSError as e:
        pytest.fail(f"this host has no IPv6 loopback (::1: {e}); the test needs one")
    p = start_server(*prefill_flags("--kv-transport-host", "::1"))
    d = start_decode(start_server, p, "--kv-transport-host", "::1")
    for srv in (p, d):
        transport = [(a, port) for a, port in listening(srv.proc.pid) if port != http_port(srv)]
        assert len(transport) >= 2 and all(str(a) == "::1" for a, _ in transport), transport
    assert complete(d, ids(11, 200))["kvc"]["path"] == "remote_prefill"
