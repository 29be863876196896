//! Raw FFI to the Mooncake Transfer Engine, exposing the surface of
//! Mooncake's C API (`transfer_engine_c.h`): `createTransferEngine`,
//! `installTransport`, `getLocalIpAndPort`, `registerLocalMemory`,
//! `unregisterLocalMemory`, `openSegment`, `closeSegment`,
//! `allocateBatchID`, `submitTransfer`, `getTransferStatus`, `freeBatchID`,
//! `destroyTransferEngine`, ...
//!
//! Two ways of linking, chosen by build.rs:
//!
//! - **wheel** (what users of SGLang and vLLM have): the PyPI wheel
//!   `mooncake-transfer-engine-non-cuda==0.3.13.post1`, installed into
//!   `.mooncake/` by `scripts/mooncake_setup.sh` (or named by
//!   `MOONCAKE_WHEEL_DIR`). The wheel ships no C API, so `cpp/shim.cpp`
//!   implements it over the C++ class its `engine.so` exports; only releases
//!   whose layouts are listed in [`VERIFIED_RELEASES`] are accepted.
//! - **source**: `MOONCAKE_ROOT` names a source-built Mooncake whose
//!   `libtransfer_engine.so` exports the C API itself (not exercised here:
//!   building it needs the Mooncake sources).
//!
//! With neither, the crate still builds: every entry point fails and
//! [`ensure_available`] says what to install. Everything here is `unsafe`
//! and raw; `kvc-disagg`'s `transport` module is the safe layer.

#[cfg(target_os = "linux")]
pub mod accept_guard;
#[cfg(target_os = "linux")]
pub mod bind_scope;
mod error;
#[cfg(target_os = "linux")]
mod sock_diag;
#[cfg(target_os = "linux")]
mod socket_table;
mod types;
mod verified;

#[cfg(not(mooncake = "none"))]
mod ffi;
#[cfg(mooncake = "none")]
mod unavailable;

pub use error::MooncakeSysError;
#[cfg(not(mooncake = "none"))]
pub use ffi::*;
pub use types::*;
#[cfg(mooncake = "none")]
pub use unavailable::*;
pub use verified::{find_verified, VerifiedRelease, VERIFIED_RELEASES};

/// How this build links Mooncake, e.g. `wheel mooncake-transfer-engine-non-cuda==0.3.13.post1 (/path)`,
/// `source libtransfer_engine (/path)` or `none (why)`.
pub const LINKAGE: &str = env!("KVC_MOONCAKE_LINKAGE");

/// Whether this build links a Mooncake.
pub const fn is_available() -> bool {
    !cfg!(mooncake = "none")
}

/// `Ok` when a Mooncake is linked; otherwise the error naming what to
/// install (`bash scripts/mooncake_setup.sh`).
pub fn ensure_available() -> Result<(), MooncakeSysError> {
    if is_available() {
        Ok(())
    } else {
        Err(MooncakeSysError::NotAvailable { linkage: LINKAGE })
    }
}

#[cfg(test)]
mod tests {
    use std::ffi::{c_char, CStr, CString};
    use std::ptr;
    use std::time::{Duration, Instant};

    use super::*;

    fn check(what: &str, rc: i32) {
        assert_eq!(rc, 0, "{what} returned {rc}");
    }

    /// An engine on 127.0.0.1 with the TCP transport, and its segment name.
    unsafe fn engine() -> (transfer_engine_t, String) {
        let meta = CString::new("P2PHANDSHAKE").unwrap();
        let host = CString::new("127.0.0.1").unwrap();
        let empty = CString::new("").unwrap();
        let e = createTransferEngine(meta.as_ptr(), host.as_ptr(), empty.as_ptr(), 0, 0);
        assert!(!e.is_null(), "createTransferEngine failed");
        let tcp = CString::new("tcp").unwrap();
        assert!(!installTransport(e, tcp.as_ptr(), ptr::null_mut()).is_null(), "installTransport(tcp) failed");
        let mut buf = [0 as c_char; 256];
        check("getLocalIpAndPort", getLocalIpAndPort(e, buf.as_mut_ptr(), buf.len()));
        (e, CStr::from_ptr(buf.as_ptr()).to_str().unwrap().to_string())
    }

    #[test]
    fn unavailable_error_names_the_setup_script() {
        let msg = MooncakeSysError::NotAvailable { linkage: "none (test)" }.to_string();
        assert!(msg.contains("bash scripts/mooncake_setup.sh"), "{msg}");
    }

    #[test]
    fn every_verified_release_has_the_checked_request_layout() {
        assert!(find_verified("mooncake_transfer_engine_non_cuda", "0.3.13.post1").is_some());
        assert!(find_verified("mooncake-transfer-engine-cuda13", "0.3.14").is_none());
        assert!(VERIFIED_RELEASES.iter().all(|r| r.transfer_request_bytes == 56));
    }

    /// The C API end to end, through whatever this build links: a write
    /// between two engines of one process over TCP on 127.0.0.1 arrives
    /// intact, and the batch, segment, registration and engines are freed.
    /// Mooncake's listeners (the handshake daemon, the TCP transport's
    /// acceptor) bind the wildcard address; inside
    /// [`bind_scope::restrict_binds`] they bind the engine's address, and
    /// the process listens on nothing else.
    #[test]
    fn an_engine_started_in_a_bind_scope_listens_only_on_its_address() {
        if let Err(e) = ensure_available() {
            panic!("this test needs Mooncake: {e}");
        }
        let lo = std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);
        let ((e, name), seen) = bind_scope::restrict_binds(lo, || unsafe { engine() });
        assert!(seen.len() >= 2, "the handshake daemon and the TCP acceptor bind inside the scope: {seen:?}");
        assert!(seen.iter().all(|b| !b.is_wildcard()), "{seen:?}");
        // This engine's listening sockets (other tests of this process run
        // engines of their own, outside a scope): every one on 127.0.0.1.
        let ports: Vec<u16> = seen.iter().map(|b| b.bound.port()).collect();
        let mine: Vec<_> = bind_scope::listening_sockets(None).unwrap().into_iter().filter(|a| ports.contains(&a.port())).collect();
        assert!(mine.len() >= 2, "{mine:?}");
        for a in &mine {
            let ip = match a.ip() {
                std::net::IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(a.ip(), std::net::IpAddr::V4),
                v4 => v4,
            };
            assert_eq!(ip, lo, "listening on {a} (segment {name})");
        }
        unsafe { destroyTransferEngine(e) };
    }

    #[test]
    fn write_between_two_engines_arrives_intact() {
        if let Err(e) = ensure_available() {
            panic!("this test needs Mooncake: {e}");
        }
        const LEN: usize = 1 << 20;
        unsafe {
            let (a, _) = engine();
            let (b, b_name) = engine();
            let mut src: Vec<u8> = (0..LEN).map(|i| (i * 31 % 251) as u8).collect();
            let mut dst = vec![0u8; LEN];
            let any = CString::new("*").unwrap();
            check("register src", registerLocalMemory(a, src.as_mut_ptr().cast(), LEN, any.as_ptr(), 1));
            check("register dst", registerLocalMemory(b, dst.as_mut_ptr().cast(), LEN, any.as_ptr(), 1));
            let name = CString::new(b_name).unwrap();
            let seg = openSegment(a, name.as_ptr());
            assert!(seg >= 0, "openSegment returned {seg}");

            let batch = allocateBatchID(a, 2);
            assert_ne!(batch, INVALID_BATCH);
            let half = LEN / 2;
            let mut reqs = [0, half].map(|off| transfer_request {
                opcode: OPCODE_WRITE,
                source: src.as_mut_ptr().add(off).cast(),
                target_id: seg,
                file_id: 0,
                target_offset: dst.as_ptr() as u64 + off as u64,
                length: half as u64,
            });
            check("submitTransfer", submitTransfer(a, batch, reqs.as_mut_ptr(), reqs.len()));
            let deadline = Instant::now() + Duration::from_secs(10);
            for task in 0..reqs.len() {
                loop {
                    let mut st = transfer_status::default();
                    check("getTransferStatus", getTransferStatus(a, batch, task, &mut st));
                    if st.status == STATUS_COMPLETED {
                        break;
                    }
                    assert!(matches!(st.status, STATUS_WAITING | STATUS_PENDING), "task {task}: {}", status_name(st.status));
                    assert!(Instant::now() < deadline, "task {task} still {} after 10 s", status_name(st.status));
                    std::thread::sleep(Duration::from_micros(200));
                }
            }
            check("freeBatchID", freeBatchID(a, batch));
            assert!(src == dst, "bytes differ after the transfer");

            check("closeSegment", closeSegment(a, seg));
            check("unregister src", unregisterLocalMemory(a, src.as_mut_ptr().cast()));
            check("unregister dst", unregisterLocalMemory(b, dst.as_mut_ptr().cast()));
            destroyTransferEngine(a);
            destroyTransferEngine(b);
        }
    }
}
