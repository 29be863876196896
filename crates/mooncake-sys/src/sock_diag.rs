//! One TCP socket, looked up by its address pair through the kernel's
//! `sock_diag` netlink interface (what `ss` uses), for the accept guard.
//!
//! Reading `/proc/net/tcp` costs time in the number of sockets the host
//! holds, and a flood of connections leaves one TIME_WAIT entry each for a
//! minute: a stranger connecting in a loop grew the table faster than the
//! guard could read it once per connection, so the accept queue stayed full
//! and the workers' own transfers waited for the flood to end. The exact
//! lookup here (`SOCK_DIAG_BY_FAMILY` without `NLM_F_DUMP`) finds one
//! socket by hash whatever the table's size.
//!
//! The kernel answers "no such socket" and "no TCP diagnostics here" with
//! the same `ENOENT`, so [`available`] first looks up a connection of its
//! own; where that fails, callers read `/proc/net/tcp` as before.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::OnceLock;

/// `linux/sock_diag.h` (libc does not have it).
const SOCK_DIAG_BY_FAMILY: u16 = 20;
/// `TCP_LISTEN` of the kernel's TCP states (libc does not have it).
const TCP_LISTEN: u8 = 10;
/// `inet_diag_sockid`: ports, two 16-byte addresses, interface, cookie.
const SOCKID_LEN: usize = 48;
const NLMSG_HDR: usize = size_of::<libc::nlmsghdr>();
/// `inet_diag_req_v2`: family, protocol, ext, pad, states, sockid.
const REQ_LEN: usize = 8 + SOCKID_LEN;
/// `inet_diag_msg` up to its inode.
const MSG_LEN: usize = 72;

/// What the kernel holds for one address pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Socket {
    pub state: u8,
    pub uid: u32,
    /// 0 for a socket no process holds (TIME_WAIT, an orphan).
    pub inode: u32,
}

/// The socket whose own end is `local` and whose peer is `remote`: `Ok(None)`
/// when there is none, `Err` when the lookup itself failed.
pub(crate) fn lookup(local: SocketAddr, remote: SocketAddr) -> std::io::Result<Option<Socket>> {
    let (family, src, dst) = match (canonical(local.ip()), canonical(remote.ip())) {
        (IpAddr::V4(a), IpAddr::V4(b)) => (libc::AF_INET, v4_words(a), v4_words(b)),
        (a, b) => (libc::AF_INET6, v6_words(a), v6_words(b)),
    };
    let mut req = [0u8; NLMSG_HDR + REQ_LEN];
    req[0..4].copy_from_slice(&((NLMSG_HDR + REQ_LEN) as u32).to_ne_bytes());
    req[4..6].copy_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
    req[6..8].copy_from_slice(&(libc::NLM_F_REQUEST as u16).to_ne_bytes());
    req[8..12].copy_from_slice(&1u32.to_ne_bytes()); // seq
    let r = &mut req[NLMSG_HDR..];
    r[0] = family as u8;
    r[1] = libc::IPPROTO_TCP as u8;
    r[4..8].copy_from_slice(&u32::MAX.to_ne_bytes()); // every state
    let id = sockid(local.port(), remote.port(), &src, &dst);
    r[8..8 + SOCKID_LEN].copy_from_slice(&id);

    // SAFETY: plain socket calls on a descriptor this function owns and
    // closes; the buffers outlive the calls and their lengths are theirs.
    unsafe {
        let fd = libc::socket(libc::AF_NETLINK, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, libc::NETLINK_SOCK_DIAG);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let close = Close(fd);
        // The kernel answers at once; the timeout only bounds a broken one.
        let tv = libc::timeval { tv_sec: 1, tv_usec: 0 };
        libc::setsockopt(fd, libc::SOL_SOCKET, libc::SO_RCVTIMEO, (&tv as *const libc::timeval).cast(), size_of::<libc::timeval>() as u32);
        let mut kernel: libc::sockaddr_nl = std::mem::zeroed();
        kernel.nl_family = libc::AF_NETLINK as u16;
        let sent = libc::sendto(
            fd,
            req.as_ptr().cast(),
            req.len(),
            0,
            (&kernel as *const libc::sockaddr_nl).cast(),
            size_of::<libc::sockaddr_nl>() as u32,
        );
        if sent < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let mut buf = [0u8; 1024];
        let n = libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), 0);
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        drop(close);
        parse_reply(&buf[..n as usize], &id)
    }
}

struct Close(libc::c_int);

impl Drop for Close {
    fn drop(&mut self) {
        // SAFETY: the descriptor is this guard's to close, once.
        unsafe { libc::close(self.0) };
    }
}

/// The reply to one exact lookup: an `inet_diag_msg` for the pair asked
/// about (a listener the kernel falls back to is not it), or an error.
fn parse_reply(buf: &[u8], asked: &[u8; SOCKID_LEN]) -> std::io::Result<Option<Socket>> {
    let bad = || std::io::Error::new(std::io::ErrorKind::InvalidData, "short sock_diag reply");
    if buf.len() < NLMSG_HDR {
        return Err(bad());
    }
    let kind = u16::from_ne_bytes([buf[4], buf[5]]);
    let body = &buf[NLMSG_HDR..];
    if kind == libc::NLMSG_ERROR as u16 {
        let code = i32::from_ne_bytes(body.get(0..4).ok_or_else(bad)?.try_into().unwrap());
        return match -code {
            libc::ENOENT => Ok(None),
            e => Err(std::io::Error::from_raw_os_error(e)),
        };
    }
    if kind != SOCK_DIAG_BY_FAMILY || body.len() < MSG_LEN {
        return Err(bad());
    }
    // Ports and addresses (the interface and cookie that follow are the
    // socket's, not what was asked with).
    if body[4..4 + 36] != asked[..36] || body[1] == TCP_LISTEN {
        return Ok(None);
    }
    let word = |at: usize| u32::from_ne_bytes(body[at..at + 4].try_into().unwrap());
    Ok(Some(Socket { state: body[1], uid: word(64), inode: word(68) }))
}

fn sockid(sport: u16, dport: u16, src: &[u8; 16], dst: &[u8; 16]) -> [u8; SOCKID_LEN] {
    let mut id = [0u8; SOCKID_LEN];
    id[0..2].copy_from_slice(&sport.to_be_bytes());
    id[2..4].copy_from_slice(&dport.to_be_bytes());
    id[4..20].copy_from_slice(src);
    id[20..36].copy_from_slice(dst);
    // interface 0 (any); cookie INET_DIAG_NOCOOKIE: match on the pair alone
    id[40..48].copy_from_slice(&[0xff; 8]);
    id
}

fn v4_words(a: Ipv4Addr) -> [u8; 16] {
    let mut w = [0u8; 16];
    w[..4].copy_from_slice(&a.octets());
    w
}

fn v6_words(a: IpAddr) -> [u8; 16] {
    match a {
        IpAddr::V6(a) => a.octets(),
        IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
    }
}

fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(IpAddr::V6(v6)),
        v4 => v4,
    }
}

/// Whether exact lookups work here: a loopback connection of this process
/// is found with its inode (once per process; false where the kernel has
/// no TCP diagnostics or netlink is not permitted).
pub(crate) fn available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        let probe = || -> std::io::Result<bool> {
            let l = std::net::TcpListener::bind("127.0.0.1:0")?;
            let c = std::net::TcpStream::connect(l.local_addr()?)?;
            let (_s, _) = l.accept()?;
            Ok(lookup(c.local_addr()?, c.peer_addr()?)?.is_some_and(|s| s.inode != 0))
        };
        probe().unwrap_or(false)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{TcpListener, TcpStream};

    #[test]
    fn a_live_connection_is_found_by_its_pair_and_nothing_else_is() {
        assert!(available(), "sock_diag exact lookups do not work on this kernel (the guard falls back to /proc/net/tcp)");
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let server = l.local_addr().unwrap();
        let c = TcpStream::connect(server).unwrap();
        let (s, _) = l.accept().unwrap();
        let client = c.local_addr().unwrap();
        let me = unsafe { libc::geteuid() };
        let found = lookup(client, server).unwrap().expect("the client's end");
        assert_eq!((found.uid, found.state), (me, 1), "this user's, ESTABLISHED");
        assert_ne!(found.inode, 0);
        // Both ends are sockets of their own.
        assert!(lookup(server, client).unwrap().is_some_and(|s| s.inode != 0 && s.inode != found.inode));
        // Another destination, or a port nobody uses: none; the listener
        // the kernel would fall back to is not taken for the pair.
        assert_eq!(lookup(client, SocketAddr::new(server.ip(), 1)).unwrap(), None);
        assert_eq!(lookup(SocketAddr::new(client.ip(), 1), server).unwrap(), None);
        assert_eq!(lookup(server, SocketAddr::new(client.ip(), 1)).unwrap(), None, "the listener itself");
        // The same through IPv4-mapped addresses.
        let mapped = |a: SocketAddr| match a.ip() {
            IpAddr::V4(v4) => SocketAddr::new(IpAddr::V6(v4.to_ipv6_mapped()), a.port()),
            _ => a,
        };
        assert_eq!(lookup(mapped(client), mapped(server)).unwrap(), Some(found));
        drop((c, s));
    }

    #[test]
    fn an_ipv6_connection_is_found_too() {
        let Ok(l) = TcpListener::bind("[::1]:0") else {
            panic!("this test needs IPv6 on loopback (::1)");
        };
        let server = l.local_addr().unwrap();
        let c = TcpStream::connect(server).unwrap();
        let (_s, _) = l.accept().unwrap();
        let found = lookup(c.local_addr().unwrap(), server).unwrap().expect("the client's end");
        assert_ne!(found.inode, 0);
    }
}
