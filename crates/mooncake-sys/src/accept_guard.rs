//! Who may connect to Mooncake's listeners.
//!
//! Mooncake authenticates no peer: whoever opens a TCP connection to its
//! handshake daemon or its TCP transport can read and write the
//! registered memory. [`crate::bind_scope`] keeps the listeners on one
//! address; this module decides who may connect to them. It defines the
//! process's `accept` and `accept4`. For listeners registered with
//! [`guard`] (and only them), an accepted connection is kept when:
//!
//! - it comes from this host (loopback, or the listener's own address) and
//!   from a socket of this process's user (read from `/proc/net/tcp`):
//!   another user's process on the host is refused, even when a peer
//!   worker on the host proved the token (they share the address); a
//!   process of the same user could read this process's memory anyway;
//! - it comes from another host whose address was allowed with
//!   [`allow_peer`] (the server allows the addresses of peers that proved
//!   the cluster token, and of the peers it calls with it).
//!
//! A refused connection is closed at once and counted in [`refused`], and
//! `accept` goes on to the next connection in the queue (a non-blocking
//! listener then reports `EAGAIN`, which Mooncake's accept loops treat as
//! "nothing yet"), so that refused connections never fill the queue. The
//! owner of a local connection is its client socket's while a process holds
//! it: a client that wrote and closed at once leaves an orphan that the
//! kernel lists as root's, and is refused.

use std::collections::HashSet;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::RwLock;

use crate::socket_table::{proc_tcp_entries, read_addr};

static GUARDED: RwLock<Option<HashSet<(libc::c_int, SocketAddr)>>> = RwLock::new(None);
static ALLOWED: RwLock<Option<HashSet<IpAddr>>> = RwLock::new(None);
static REFUSED: AtomicU64 = AtomicU64::new(0);

/// The address of the socket `fd` (its own end when `peer` is false).
fn socket_addr(fd: libc::c_int, peer: bool) -> Option<SocketAddr> {
    // SAFETY: the buffer is a sockaddr_storage and its length is passed.
    unsafe {
        let mut ss: libc::sockaddr_storage = std::mem::zeroed();
        let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        let p = (&mut ss as *mut libc::sockaddr_storage).cast::<libc::sockaddr>();
        let rc = if peer { libc::getpeername(fd, p, &mut len) } else { libc::getsockname(fd, p, &mut len) };
        if rc != 0 {
            return None;
        }
        read_addr(p, len)
    }
}

/// Whether `fd` is a listening socket.
fn is_listening(fd: libc::c_int) -> bool {
    let mut v: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: an int option with its length.
    let rc = unsafe { libc::getsockopt(fd, libc::SOL_SOCKET, libc::SO_ACCEPTCONN, (&mut v as *mut libc::c_int).cast(), &mut len) };
    rc == 0 && v != 0
}

/// Puts the listeners among `fds` (those still listening on the address
/// they were bound to) under the guard and returns them; call [`unguard`]
/// with that list once they close.
pub fn guard(fds: &[(libc::c_int, SocketAddr)]) -> Vec<(libc::c_int, SocketAddr)> {
    let live: Vec<(libc::c_int, SocketAddr)> =
        fds.iter().copied().filter(|&(fd, addr)| is_listening(fd) && socket_addr(fd, false) == Some(addr)).collect();
    let mut g = GUARDED.write().unwrap_or_else(|e| e.into_inner());
    g.get_or_insert_with(HashSet::new).extend(live.iter().copied());
    live
}

/// Takes listeners out of the guard (their fds may be reused).
pub fn unguard(fds: &[(libc::c_int, SocketAddr)]) {
    if let Some(g) = GUARDED.write().unwrap_or_else(|e| e.into_inner()).as_mut() {
        for f in fds {
            g.remove(f);
        }
    }
}

/// Lets connections from `ip` in.
pub fn allow_peer(ip: IpAddr) {
    let ip = canonical(ip);
    if ALLOWED.read().unwrap_or_else(|e| e.into_inner()).as_ref().is_some_and(|a| a.contains(&ip)) {
        return;
    }
    ALLOWED.write().unwrap_or_else(|e| e.into_inner()).get_or_insert_with(HashSet::new).insert(ip);
}

/// Connections refused so far.
pub fn refused() -> u64 {
    REFUSED.load(Ordering::Relaxed)
}

/// An IPv4-mapped IPv6 address as IPv4.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// The listener `fd`'s address, if it is guarded (and still the socket
/// that was: bound there).
fn guarded(fd: libc::c_int) -> Option<SocketAddr> {
    let addr = {
        let g = GUARDED.read().unwrap_or_else(|e| e.into_inner());
        g.as_ref()?.iter().find(|(f, _)| *f == fd).map(|(_, a)| *a)?
    };
    (socket_addr(fd, false) == Some(addr)).then_some(addr)
}

/// The decision for a connection from `peer` to a listener on `local`.
/// A connection from this host is judged by its owner only: every local
/// process shares the host's addresses, so a peer worker on the same host
/// having proved the token says nothing about another process there.
fn admit(peer: SocketAddr, local: SocketAddr) -> bool {
    let ip = canonical(peer.ip());
    if ip.is_loopback() || ip == canonical(local.ip()) {
        // SAFETY: no arguments.
        return socket_owner(peer, local) == Some(unsafe { libc::geteuid() });
    }
    ALLOWED.read().unwrap_or_else(|e| e.into_inner()).as_ref().is_some_and(|a| a.contains(&ip))
}

/// The user owning the client end, on this host, of the connection from
/// `peer` to `local`: a live socket a process holds (a nonzero inode),
/// found by the whole address pair. The client's address alone may
/// also be another connection's (a port is reused toward another
/// destination); a TIME_WAIT entry, or the orphan a client leaves when it
/// closes at once (FIN_WAIT1/2), is listed with uid 0 whoever opened it, so
/// under root it would pass for root's: a stranger could write and close
/// before the check and have Mooncake read what it wrote. None for those.
fn socket_owner(peer: SocketAddr, local: SocketAddr) -> Option<u32> {
    // One lookup by the pair (crate::sock_diag) where the kernel offers it:
    // its cost does not grow with the host's sockets, as a flood's
    // TIME_WAIT entries make /proc/net/tcp's.
    if crate::sock_diag::available() {
        if let Ok(found) = crate::sock_diag::lookup(peer, local) {
            return found.filter(|s| s.inode != 0).map(|s| s.uid);
        }
    }
    proc_owner(peer, local)
}

/// [`socket_owner`] from `/proc/net/tcp`, where sock_diag is not offered.
fn proc_owner(peer: SocketAddr, local: SocketAddr) -> Option<u32> {
    proc_tcp_entries("/proc/self")
        .into_iter()
        .find(|e| same(e.local, peer) && same(e.remote, local))
        .filter(|e| !e.time_wait && e.inode != 0)
        .map(|e| e.uid)
}

fn same(a: SocketAddr, b: SocketAddr) -> bool {
    a.port() == b.port() && canonical(a.ip()) == canonical(b.ip())
}

unsafe fn sys_accept4(fd: libc::c_int, addr: *mut libc::sockaddr, len: *mut libc::socklen_t, flags: libc::c_int) -> libc::c_int {
    libc::syscall(libc::SYS_accept4, fd, addr, len, flags) as libc::c_int
}

/// `accept4(2)` for the whole process (see the module documentation).
///
/// # Safety
/// As `accept4(2)`.
#[no_mangle]
pub unsafe extern "C" fn accept4(fd: libc::c_int, addr: *mut libc::sockaddr, len: *mut libc::socklen_t, flags: libc::c_int) -> libc::c_int {
    // What the caller's address buffer holds, for each try.
    let cap = if len.is_null() { 0 } else { *len };
    loop {
        let conn = sys_accept4(fd, addr, len, flags);
        if conn < 0 {
            return conn;
        }
        let Some(local) = guarded(fd) else {
            return conn;
        };
        // The connection's own end: the listener's address (it is bound to one).
        let own = socket_addr(conn, false).unwrap_or(local);
        if socket_addr(conn, true).is_some_and(|peer| admit(peer, own)) {
            return conn;
        }
        libc::close(conn);
        REFUSED.fetch_add(1, Ordering::Relaxed);
        // The next connection in the queue, so that refused ones never
        // leave it full: Mooncake's loops read EAGAIN as "nothing yet" and
        // may wait for a readiness that queued connections do not signal
        // again. A blocking listener waits for the next, as accept does; a
        // non-blocking one says EAGAIN once the queue is empty.
        if !len.is_null() {
            *len = cap;
        }
    }
}

/// `accept(2)`: [`accept4`] without flags.
///
/// # Safety
/// As `accept(2)`.
#[no_mangle]
pub unsafe extern "C" fn accept(fd: libc::c_int, addr: *mut libc::sockaddr, len: *mut libc::socklen_t) -> libc::c_int {
    accept4(fd, addr, len, 0)
}

/// Keeps the definitions above linked into every binary using the guard.
pub(crate) fn keep_linked() {
    std::hint::black_box(accept as unsafe extern "C" fn(_, _, _) -> _);
    std::hint::black_box(accept4 as unsafe extern "C" fn(_, _, _, _) -> _);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::ErrorKind;
    use std::net::{TcpListener, TcpStream};
    use std::os::fd::AsRawFd;

    #[test]
    fn a_guarded_listener_takes_this_users_local_connections_and_allowed_peers_only() {
        keep_linked();
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        // Unguarded: anything goes. Guarded: this process's own (same
        // user) loopback connection is let in.
        let _c = TcpStream::connect(addr).unwrap();
        l.accept().unwrap();
        let entry = [(l.as_raw_fd(), addr)];
        assert_eq!(guard(&entry), entry);
        let _c = TcpStream::connect(addr).unwrap();
        let (s, peer) = l.accept().unwrap();
        assert_eq!(s.peer_addr().unwrap(), peer);
        // An owner other than this user: refused (checked through the
        // decision itself; another user's process needs root to make).
        assert!(admit(peer, addr));
        let stranger = SocketAddr::new("192.0.2.200".parse().unwrap(), 5555);
        assert!(!admit(stranger, addr), "a remote address not allowed");
        allow_peer(stranger.ip());
        assert!(admit(stranger, addr), "an allowed peer");
        // Allowing this host's address changes nothing for local sockets:
        // an unknown owner (no such socket) is still refused.
        allow_peer(addr.ip());
        assert!(!admit(SocketAddr::new(addr.ip(), 1), addr), "a local socket that is not this user's");
        // A listener that is not listening, or not where it was bound, is not guarded.
        assert!(guard(&[(l.as_raw_fd(), SocketAddr::new(addr.ip(), addr.port().wrapping_add(1)))]).is_empty());
        unguard(&entry);
        assert!(guarded(l.as_raw_fd()).is_none());
        l.set_nonblocking(true).unwrap();
        assert_eq!(l.accept().unwrap_err().kind(), ErrorKind::WouldBlock);
    }

    /// The kernel lists a TIME_WAIT pair with uid 0; a stranger's client
    /// reusing that port toward a guarded listener must not pass for root's
    /// (CI runs as root). The owner is the live socket of the exact pair.
    #[test]
    fn the_owner_is_the_live_socket_of_the_exact_address_pair_never_a_time_wait_entry() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let server = l.local_addr().unwrap();
        let c = TcpStream::connect(server).unwrap();
        let client = c.local_addr().unwrap();
        let (s, _) = l.accept().unwrap();
        // SAFETY: no arguments.
        let me = unsafe { libc::geteuid() };
        assert_eq!(socket_owner(client, server), Some(me), "a live connection of this user");
        assert_eq!(proc_owner(client, server), Some(me), "the same from /proc/net/tcp");
        assert_eq!(socket_owner(client, SocketAddr::new(server.ip(), 1)), None, "the client's address toward another destination");
        // The client closes first: its end goes to TIME_WAIT once the
        // server's close is acknowledged (on loopback, by the time it returns;
        // the loop only bounds a slow kernel).
        drop(c);
        drop(s);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let time_wait =
            || proc_tcp_entries("/proc/self").into_iter().any(|e| e.time_wait && same(e.local, client) && same(e.remote, server));
        while !time_wait() {
            assert!(std::time::Instant::now() < deadline, "the client's end never reached TIME_WAIT");
            std::thread::yield_now();
        }
        assert_eq!(socket_owner(client, server), None, "a TIME_WAIT entry has no owner");
        assert_eq!(proc_owner(client, server), None, "nor from /proc/net/tcp");
        assert!(!admit(client, server), "a connection whose client socket is gone is refused");
    }

    /// A client that writes and closes before its connection is accepted
    /// leaves an orphan (no process holds it; the kernel lists it as root's).
    /// It is refused, and the queue is drained past it and its like: one
    /// accept returns the next live connection, and a non-blocking listener
    /// then reports WouldBlock instead of sitting on refused connections.
    #[test]
    fn clients_that_close_before_the_check_are_refused_and_the_queue_is_drained_past_them() {
        use std::io::Write;
        keep_linked();
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let entry = [(l.as_raw_fd(), addr)];
        assert_eq!(guard(&entry), entry);
        l.set_nonblocking(true).unwrap();
        let mut orphans = Vec::new();
        for _ in 0..5 {
            let mut c = TcpStream::connect(addr).unwrap();
            c.write_all(b"WRITE 16 bytes..").unwrap();
            orphans.push(c.local_addr().unwrap());
            drop(c);
        }
        // Closed by their process: no entry is a live socket any more.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while orphans.iter().any(|o| socket_owner(*o, addr).is_some() || proc_owner(*o, addr).is_some()) {
            assert!(std::time::Instant::now() < deadline, "a closed client still has an owner");
            std::thread::yield_now();
        }
        let live = TcpStream::connect(addr).unwrap();
        let before = refused();
        let (s, peer) = l.accept().expect("the live connection, past the refused ones");
        assert_eq!(peer, live.local_addr().unwrap());
        assert!(refused() >= before + 5, "the 5 orphans were refused");
        assert_eq!(l.accept().unwrap_err().kind(), ErrorKind::WouldBlock, "nothing left in the queue");
        drop(s);
        unguard(&entry);
    }
}
