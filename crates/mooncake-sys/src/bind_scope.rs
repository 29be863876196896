//! The addresses Mooncake's listeners bind.
//!
//! Mooncake 0.3.x binds its handshake daemon (`findAvailableTcpPort`:
//! `INADDR_ANY`, or `::` with `MC_USE_IPV6`) and its TCP transport's
//! acceptor (`TcpContext`: `[::]` dual-stack, else `0.0.0.0`) to the
//! wildcard address, whatever `local_server_name` names, and has no setting
//! for it (`MC_TCP_BIND_ADDRESS` only changes the address it advertises).
//! Both binds run on the thread that calls `createTransferEngine` and
//! `installTransport`.
//!
//! So this crate defines the process's `bind` symbol (the executable's
//! definition comes before the C library's for every shared library,
//! Mooncake's included). Outside a [`restrict_binds`] scope it is the
//! system call, unchanged. Inside one, on the calling thread only, a bind
//! to the wildcard address is rewritten to the scope's address (an IPv4
//! address on an IPv6 socket in its v4-mapped form), and every bind is
//! recorded so the caller can check that none stayed on the wildcard.
//! No Mooncake code is changed.

use std::cell::RefCell;
use std::net::{IpAddr, SocketAddr};

pub use crate::socket_table::listening_sockets;
use crate::socket_table::read_addr;

/// One bind seen inside a scope.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BindRecord {
    /// The socket.
    pub fd: i32,
    /// The address Mooncake asked for.
    pub requested: SocketAddr,
    /// The address bound (`requested` unless rewritten).
    pub bound: SocketAddr,
    /// Whether the system call succeeded.
    pub ok: bool,
}

impl BindRecord {
    /// Still on a wildcard address after the rewrite (nothing could be done).
    pub fn is_wildcard(&self) -> bool {
        self.bound.ip().is_unspecified()
    }
}

struct Scope {
    addr: IpAddr,
    seen: Vec<BindRecord>,
}

thread_local! {
    static SCOPE: RefCell<Option<Scope>> = const { RefCell::new(None) };
}

/// Runs `f` with this thread's wildcard binds moved to `addr`; returns
/// what `f` returned and every bind it made (empty when this build cannot
/// interpose `bind`, which the caller must treat as "not restricted").
pub fn restrict_binds<R>(addr: IpAddr, f: impl FnOnce() -> R) -> (R, Vec<BindRecord>) {
    // Keeps the definitions of `bind` and `accept` linked into every
    // binary using this.
    std::hint::black_box(bind as unsafe extern "C" fn(_, _, _) -> _);
    crate::accept_guard::keep_linked();
    let previous = SCOPE.with(|s| s.borrow_mut().replace(Scope { addr, seen: Vec::new() }));
    let out = f();
    let seen = SCOPE.with(|s| std::mem::replace(&mut *s.borrow_mut(), previous)).map(|s| s.seen).unwrap_or_default();
    (out, seen)
}

/// The system call itself.
unsafe fn sys_bind(fd: libc::c_int, addr: *const libc::sockaddr, len: libc::socklen_t) -> libc::c_int {
    libc::syscall(libc::SYS_bind, fd, addr, len) as libc::c_int
}

/// `bind(2)` for the whole process (see the module documentation).
///
/// # Safety
/// As `bind(2)`.
#[no_mangle]
pub unsafe extern "C" fn bind(fd: libc::c_int, addr: *const libc::sockaddr, len: libc::socklen_t) -> libc::c_int {
    let Some(requested) = read_addr(addr, len) else {
        return sys_bind(fd, addr, len);
    };
    // `try_with`: a bind during thread teardown sees no scope.
    let target = SCOPE.try_with(|s| s.borrow().as_ref().map(|s| s.addr)).ok().flatten();
    let Some(target) = target else {
        return sys_bind(fd, addr, len);
    };
    let mut bound = requested;
    let rc = if requested.ip().is_unspecified() {
        match (requested, target) {
            (SocketAddr::V4(r), IpAddr::V4(t)) => {
                let mut a = *(addr as *const libc::sockaddr_in);
                a.sin_addr.s_addr = u32::from(t).to_be();
                bound = SocketAddr::new(IpAddr::V4(t), r.port());
                sys_bind(fd, (&a as *const libc::sockaddr_in).cast(), std::mem::size_of::<libc::sockaddr_in>() as _)
            }
            (SocketAddr::V6(r), t) => {
                let t6 = match t {
                    IpAddr::V4(v4) => v4.to_ipv6_mapped(),
                    IpAddr::V6(v6) => v6,
                };
                let mut a = *(addr as *const libc::sockaddr_in6);
                a.sin6_addr.s6_addr = t6.octets();
                bound = SocketAddr::new(IpAddr::V6(t6), r.port());
                sys_bind(fd, (&a as *const libc::sockaddr_in6).cast(), std::mem::size_of::<libc::sockaddr_in6>() as _)
            }
            // An IPv4 socket cannot take an IPv6 address: left as asked,
            // and recorded as still on the wildcard.
            (SocketAddr::V4(_), IpAddr::V6(_)) => sys_bind(fd, addr, len),
        }
    } else {
        sys_bind(fd, addr, len)
    };
    let record = BindRecord { fd, requested, bound, ok: rc == 0 };
    let _ = SCOPE.try_with(|s| {
        if let Some(s) = s.borrow_mut().as_mut() {
            s.seen.push(record);
        }
    });
    rc
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;
    use std::net::TcpListener;

    #[test]
    fn wildcard_binds_move_to_the_scope_address_on_this_thread_only() {
        let lo = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let (listener, seen) = restrict_binds(lo, || TcpListener::bind("0.0.0.0:0").unwrap());
        assert_eq!(listener.local_addr().unwrap().ip(), lo, "the bind was rewritten");
        assert_eq!(seen.len(), 1);
        assert!(seen[0].requested.ip().is_unspecified() && seen[0].bound.ip() == lo && seen[0].ok && !seen[0].is_wildcard());
        // IPv6 socket, IPv4 target: the v4-mapped address.
        // (Where the machine has IPv6.)
        if let (Ok(l), seen) = restrict_binds(lo, || TcpListener::bind("[::]:0")) {
            assert_eq!(l.local_addr().unwrap().ip(), IpAddr::V6(Ipv4Addr::LOCALHOST.to_ipv6_mapped()));
            assert!(!seen[0].is_wildcard());
        }
        // Outside the scope, and on another thread inside it: unchanged.
        let outside = TcpListener::bind("0.0.0.0:0").unwrap();
        assert!(outside.local_addr().unwrap().ip().is_unspecified());
        // The socket listing agrees with the sockets' own addresses.
        let listening = listening_sockets(None).unwrap();
        for l in [&listener, &outside] {
            assert!(listening.contains(&l.local_addr().unwrap()), "{:?} not in {listening:?}", l.local_addr());
        }
        let ((), seen) = restrict_binds(lo, || {
            let other = std::thread::spawn(|| TcpListener::bind("0.0.0.0:0").unwrap().local_addr().unwrap()).join().unwrap();
            assert!(other.ip().is_unspecified(), "another thread's bind is not touched");
        });
        assert!(seen.is_empty());
    }

    #[test]
    fn failed_binds_are_recorded_with_the_system_error() {
        let lo = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let taken = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = taken.local_addr().unwrap().port();
        let (err, seen) = restrict_binds(lo, || TcpListener::bind(("0.0.0.0", port)).unwrap_err());
        assert_eq!(err.kind(), std::io::ErrorKind::AddrInUse);
        assert_eq!(seen.len(), 1);
        assert!(!seen[0].ok);
    }
}
