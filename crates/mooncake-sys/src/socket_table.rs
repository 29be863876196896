//! The TCP sockets as the kernel lists them (`/proc/<pid>/net/tcp{,6}`:
//! every socket of the network namespace, with its owner's uid and inode)
//! and socket addresses read from the C structures the system calls take.
//! Read by the bind scope (which listeners a process has) and the accept
//! guard (who holds a connection's client socket).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// The socket address at `addr`, if it is IPv4 or IPv6.
///
/// # Safety
/// `addr` points to `len` readable bytes.
pub(crate) unsafe fn read_addr(addr: *const libc::sockaddr, len: libc::socklen_t) -> Option<SocketAddr> {
    if addr.is_null() {
        return None;
    }
    match (*addr).sa_family as i32 {
        libc::AF_INET if len as usize >= std::mem::size_of::<libc::sockaddr_in>() => {
            let a = &*(addr as *const libc::sockaddr_in);
            Some(SocketAddr::new(IpAddr::V4(Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr))), u16::from_be(a.sin_port)))
        }
        libc::AF_INET6 if len as usize >= std::mem::size_of::<libc::sockaddr_in6>() => {
            let a = &*(addr as *const libc::sockaddr_in6);
            Some(SocketAddr::new(IpAddr::V6(Ipv6Addr::from(a.sin6_addr.s6_addr)), u16::from_be(a.sin6_port)))
        }
        _ => None,
    }
}

/// One row of `/proc/<pid>/net/tcp{,6}` (every TCP socket of the network
/// namespace, whoever owns it).
#[derive(Debug, Clone, Copy)]
pub(crate) struct TcpEntry {
    pub local: SocketAddr,
    pub remote: SocketAddr,
    pub listening: bool,
    /// In TIME_WAIT: the kernel keeps the address pair, not the socket; the
    /// entry's uid (0) and inode (0) belong to nobody.
    pub time_wait: bool,
    pub uid: u32,
    /// 0 for a socket no process holds: TIME_WAIT, and the orphan a client
    /// leaves when it closes (FIN_WAIT1/2, CLOSING, LAST_ACK), whose uid
    /// the kernel then lists as 0 whoever opened it.
    pub inode: u64,
}

pub(crate) fn proc_tcp_entries(proc: &str) -> Vec<TcpEntry> {
    let mut out = Vec::new();
    for (table, v6) in [("tcp", false), ("tcp6", true)] {
        let Ok(text) = std::fs::read_to_string(format!("{proc}/net/{table}")) else {
            continue;
        };
        for line in text.lines().skip(1) {
            // sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 10 {
                continue;
            }
            let (Some(local), Some(remote), Ok(uid), Ok(inode)) =
                (parse_proc_addr(f[1], v6), parse_proc_addr(f[2], v6), f[7].parse(), f[9].parse())
            else {
                continue;
            };
            out.push(TcpEntry { local, remote, listening: f[3] == "0A", time_wait: f[3] == "06", uid, inode });
        }
    }
    out
}

/// The TCP sockets process `pid` (this one when None) is listening on,
/// from `/proc/<pid>/fd` and `/proc/<pid>/net/tcp{,6}`.
pub fn listening_sockets(pid: Option<u32>) -> std::io::Result<Vec<SocketAddr>> {
    let proc = pid.map_or_else(|| "/proc/self".to_string(), |p| format!("/proc/{p}"));
    let mut inodes = std::collections::HashSet::new();
    for fd in std::fs::read_dir(format!("{proc}/fd"))? {
        if let Ok(link) = std::fs::read_link(fd?.path()) {
            if let Some(n) = link.to_str().and_then(|l| l.strip_prefix("socket:[")).and_then(|l| l.strip_suffix(']')) {
                if let Ok(n) = n.parse::<u64>() {
                    inodes.insert(n);
                }
            }
        }
    }
    Ok(proc_tcp_entries(&proc).into_iter().filter(|e| e.listening && inodes.contains(&e.inode)).map(|e| e.local).collect())
}

/// `/proc/net/tcp`'s `HEXADDR:HEXPORT`: the address's bytes as 32-bit
/// words printed in host order.
fn parse_proc_addr(s: &str, v6: bool) -> Option<SocketAddr> {
    let (addr, port) = s.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let mut bytes = Vec::with_capacity(16);
    for i in 0..addr.len() / 8 {
        bytes.extend_from_slice(&u32::from_str_radix(addr.get(i * 8..i * 8 + 8)?, 16).ok()?.to_ne_bytes());
    }
    let ip = match (v6, bytes.len()) {
        (false, 4) => IpAddr::V4(Ipv4Addr::new(bytes[0], bytes[1], bytes[2], bytes[3])),
        (true, 16) => IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(bytes).ok()?)),
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}
