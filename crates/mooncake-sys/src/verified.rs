// The Mooncake releases whose ABI layouts mooncake-sys has verified (sizes
// and field offsets of Transport::TransferRequest, TransferStatus and
// mooncake::Status, the exported TransferEngine members; see
// shared/docs/MOONCAKE.md). The build refuses any other wheel: a layout
// mismatch would corrupt transfers silently instead of failing.
//
// This file is also `include!`d by build.rs, so it must stay free of
// crate-relative paths.

/// A PyPI wheel of Mooncake whose layout the shim (`cpp/shim.cpp`) matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VerifiedRelease {
    /// Distribution name as in the wheel's METADATA `Name:`.
    pub dist: &'static str,
    /// METADATA `Version:`.
    pub version: &'static str,
    /// `sizeof(Transport::TransferRequest)` in this release.
    pub transfer_request_bytes: usize,
}

/// Every release the build accepts. 0.3.14 (`mooncake-transfer-engine-cuda13`)
/// is absent on purpose: its TransferRequest is 72 bytes and its new fields
/// are not confirmed.
pub const VERIFIED_RELEASES: &[VerifiedRelease] = &[
    VerifiedRelease { dist: "mooncake-transfer-engine-non-cuda", version: "0.3.13.post1", transfer_request_bytes: 56 },
    VerifiedRelease { dist: "mooncake-transfer-engine-non-cuda", version: "0.3.13", transfer_request_bytes: 56 },
    VerifiedRelease { dist: "mooncake-transfer-engine", version: "0.3.13.post1", transfer_request_bytes: 56 },
    VerifiedRelease { dist: "mooncake-transfer-engine", version: "0.3.13", transfer_request_bytes: 56 },
];

/// The verified release with this METADATA name and version, if any.
/// Names compare as PyPI normalises them (case, `-`, `_` and `.` alike).
pub fn find_verified(dist: &str, version: &str) -> Option<&'static VerifiedRelease> {
    fn norm(s: &str) -> String {
        s.trim().to_ascii_lowercase().replace(['_', '.'], "-")
    }
    VERIFIED_RELEASES.iter().find(|r| norm(r.dist) == norm(dist) && r.version == version.trim())
}
