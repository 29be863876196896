use thiserror::Error;

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum MooncakeSysError {
    /// This build links no Mooncake (see build.rs for how it looks).
    #[error("the Mooncake Transfer Engine is not available in this build ({linkage}): run `bash scripts/mooncake_setup.sh` to install the Debian runtime packages (libibverbs1, ibverbs-providers, libnuma1, libcurl4) and the pinned PyPI wheel mooncake-transfer-engine-non-cuda==0.3.13.post1 into .mooncake/, then rebuild (or set MOONCAKE_WHEEL_DIR / MOONCAKE_ROOT)")]
    NotAvailable { linkage: &'static str },
}
