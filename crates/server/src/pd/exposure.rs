//! Where the KV transport may listen, decided once at startup.
//!
//! Mooncake's transport authenticates no peer: whoever reaches its ports
//! can read and write the registered KV pool by address. kvc therefore
//! binds its listeners to one address (`--kv-transport-host`, see
//! `kvc_disagg::transport::mooncake::Listeners`), defaults that address to
//! loopback unless `--host` names one address, and starts on a
//! non-loopback address only when the operator acknowledges it
//! (`--allow-unauthenticated-kv-transport`).

use std::net::IpAddr;

/// The transport address: the flag, else `--host` when it is one
/// (non-wildcard) address, else loopback.
pub fn transport_host(flag: Option<&str>, http_host: &str) -> String {
    if let Some(h) = flag.filter(|h| !h.is_empty()) {
        return h.to_string();
    }
    match http_host.trim_start_matches('[').trim_end_matches(']').parse::<IpAddr>() {
        Ok(ip) if !ip.is_unspecified() => ip.to_string(),
        _ => "127.0.0.1".to_string(),
    }
}

/// What Mooncake must be told in its environment to listen on `host`:
/// `MC_USE_IPV6=1` for an IPv6 address (0.3.x binds its handshake daemon
/// to IPv4's `INADDR_ANY` otherwise, which no IPv6 address can replace:
/// it stayed on every IPv4 address of the host, and peers could not reach
/// it over IPv6). See [`ensure_mooncake_env`].
pub fn mooncake_env(host: &str) -> Option<(&'static str, &'static str)> {
    match host.trim_start_matches('[').trim_end_matches(']').parse::<IpAddr>() {
        Ok(IpAddr::V6(v6)) if v6.to_ipv4_mapped().is_none() => Some(("MC_USE_IPV6", "1")),
        _ => None,
    }
}

/// Makes sure this process runs with [`mooncake_env`] for the transport
/// host these flags give. Mooncake reads the variable when its library is
/// loaded, before `main`; so when it is missing, the process executes
/// itself again with it set (same binary, same arguments). Returns only if
/// nothing was missing (or the re-execution failed, with the error).
pub fn ensure_mooncake_env(kv_transport_host: Option<&str>, http_host: &str) -> std::io::Result<()> {
    use std::os::unix::process::CommandExt;
    let Some((k, v)) = mooncake_env(&transport_host(kv_transport_host, http_host)) else {
        return Ok(());
    };
    if std::env::var_os(k).is_some_and(|cur| cur == v) {
        return Ok(());
    }
    let exe = std::env::current_exe()?;
    Err(std::process::Command::new(exe).args(std::env::args_os().skip(1)).env(k, v).exec())
}

/// Why the transport may or may not start on an address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exposure {
    /// Loopback: only this host's processes reach it.
    Loopback,
    /// A network address, acknowledged by the operator.
    NetworkAcknowledged,
    /// A network address without the acknowledgment: refused.
    NetworkRefused,
    /// The wildcard address: refused whatever the flags (it is every
    /// network the host is on).
    Wildcard,
}

impl Exposure {
    pub fn as_str(self) -> &'static str {
        match self {
            Exposure::Loopback => "loopback",
            Exposure::NetworkAcknowledged => "network_acknowledged",
            Exposure::NetworkRefused => "network_refused",
            Exposure::Wildcard => "wildcard",
        }
    }

    pub fn allowed(self) -> bool {
        matches!(self, Exposure::Loopback | Exposure::NetworkAcknowledged)
    }
}

/// The decision for a transport address.
pub fn decide_exposure(addr: IpAddr, acknowledged: bool) -> Exposure {
    if addr.is_unspecified() {
        Exposure::Wildcard
    } else if addr.is_loopback() || matches!(addr, IpAddr::V6(v6) if v6.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())) {
        Exposure::Loopback
    } else if acknowledged {
        Exposure::NetworkAcknowledged
    } else {
        Exposure::NetworkRefused
    }
}

/// The error a refused decision starts with.
pub fn refusal(addr: IpAddr, exposure: Exposure) -> String {
    match exposure {
        Exposure::Wildcard => format!(
            "--kv-transport-host {addr} is every address of this host: name the one address peers reach this worker at \
             (the KV transport has no authentication; docs/disaggregation.md, \"Network model\")"
        ),
        _ => format!(
            "the KV transport would listen on {addr}, a network address, and it has no authentication: anyone who reaches \
             that address can read and write this worker's KV pool. Use a private network that only kvc workers reach, \
             then pass --allow-unauthenticated-kv-transport (or use --kv-transport-host 127.0.0.1 on one host)"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ipv6_transport_host_asks_mooncake_for_ipv6_listeners() {
        assert_eq!(mooncake_env("::1"), Some(("MC_USE_IPV6", "1")));
        assert_eq!(mooncake_env("[fd00::5]"), Some(("MC_USE_IPV6", "1")));
        assert_eq!(mooncake_env("127.0.0.1"), None);
        assert_eq!(mooncake_env("::ffff:10.0.0.5"), None, "a v4-mapped address is IPv4");
        assert_eq!(mooncake_env("worker-0.kvc"), None);
    }

    #[test]
    fn the_transport_host_follows_the_flag_then_a_single_http_address_then_loopback() {
        assert_eq!(transport_host(Some("10.0.0.5"), "0.0.0.0"), "10.0.0.5");
        assert_eq!(transport_host(None, "10.0.0.7"), "10.0.0.7");
        assert_eq!(transport_host(None, "127.0.0.1"), "127.0.0.1");
        assert_eq!(transport_host(None, "0.0.0.0"), "127.0.0.1");
        assert_eq!(transport_host(None, "::"), "127.0.0.1");
        assert_eq!(transport_host(None, "[::1]"), "::1");
        assert_eq!(transport_host(Some(""), "localhost"), "127.0.0.1");
    }

    #[test]
    fn only_loopback_or_an_acknowledged_network_address_is_allowed() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert_eq!(decide_exposure(ip("127.0.0.1"), false), Exposure::Loopback);
        assert_eq!(decide_exposure(ip("::1"), false), Exposure::Loopback);
        assert_eq!(decide_exposure(ip("::ffff:127.0.0.1"), false), Exposure::Loopback);
        assert_eq!(decide_exposure(ip("10.1.2.3"), false), Exposure::NetworkRefused);
        assert_eq!(decide_exposure(ip("10.1.2.3"), true), Exposure::NetworkAcknowledged);
        assert_eq!(decide_exposure(ip("0.0.0.0"), true), Exposure::Wildcard);
        assert_eq!(decide_exposure(ip("::"), true), Exposure::Wildcard);
        assert!(!Exposure::NetworkRefused.allowed() && !Exposure::Wildcard.allowed());
        assert!(refusal(ip("10.1.2.3"), Exposure::NetworkRefused).contains("--allow-unauthenticated-kv-transport"));
    }
}
