//! The crate's one error, and how a shim call's message reaches it.

use std::ffi::{c_char, CStr};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The CUTLASS kernels cannot be used here (not built in, not sm90).
    #[error("CUTLASS unavailable: {0}")]
    Unavailable(String),
    /// A call failed; the shim's message names the call and why.
    #[error("CUTLASS: {0}")]
    Cutlass(String),
}

#[cfg_attr(not(kvc_cutlass), allow(dead_code))]
pub(crate) const ERR_LEN: usize = 1024;

/// Runs a shim call that returns nonzero and fills its `err` buffer (ERR_LEN
/// bytes) on failure, wrapping the message with `wrap`.
#[cfg_attr(not(kvc_cutlass), allow(dead_code))]
pub(crate) fn call(f: impl FnOnce(*mut c_char) -> i32, wrap: fn(String) -> Error) -> Result<(), Error> {
    let mut err = [0 as c_char; ERR_LEN];
    if f(err.as_mut_ptr()) != 0 {
        // SAFETY: the shim writes a NUL-terminated string (snprintf) or leaves the zeroed buffer.
        return Err(wrap(unsafe { CStr::from_ptr(err.as_ptr()) }.to_string_lossy().into_owned()));
    }
    Ok(())
}

/// `v` as the shim's i32, or an error naming `what`.
pub(crate) fn int(v: usize, what: &str) -> Result<i32, Error> {
    i32::try_from(v).map_err(|_| Error::Cutlass(format!("{what} = {v} does not fit an i32")))
}

/// A shim call that writes a byte count (a workspace size) through its
/// first pointer.
#[cfg(kvc_cutlass)]
pub(crate) fn bytes(f: impl FnOnce(*mut u64, *mut c_char) -> i32) -> Result<usize, Error> {
    let mut n = 0u64;
    call(|e| f(&mut n, e), Error::Cutlass)?;
    Ok(n as usize)
}

/// An entry's body: `$body` where the shim is built in; in a build without
/// it the arguments are only marked used and the entry answers
/// [`unavailable`].
macro_rules! shim {
    ([$($arg:ident),*], $body:block) => {{
        #[cfg(kvc_cutlass)]
        $body
        #[cfg(not(kvc_cutlass))]
        {
            let _ = ($(&$arg,)*);
            $crate::error::unavailable()
        }
    }};
}

/// What every entry answers in a build without CUTLASS's headers.
#[cfg(not(kvc_cutlass))]
pub(crate) fn unavailable<T>() -> Result<T, Error> {
    Err(Error::Unavailable("kvc was built without CUTLASS's headers (scripts/cutlass_setup.sh, then scripts/cuda_setup.sh)".into()))
}
