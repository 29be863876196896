//! The entry points of a build without Mooncake: the same names and
//! signatures as `ffi.rs`, each failing the way the C API reports failure
//! (null engine or transport, -1, `INVALID_BATCH`). Callers learn why, and
//! what to install, from `crate::ensure_available()`.

#![allow(non_snake_case, clippy::missing_safety_doc)]

use std::ffi::{c_char, c_int, c_void};
use std::ptr;

use crate::types::*;

const FAILED: c_int = -1;

pub unsafe extern "C" fn createTransferEngine(_: *const c_char, _: *const c_char, _: *const c_char, _: u64, _: c_int) -> transfer_engine_t {
    ptr::null_mut()
}
pub unsafe extern "C" fn destroyTransferEngine(_: transfer_engine_t) {}
pub unsafe extern "C" fn installTransport(_: transfer_engine_t, _: *const c_char, _: *mut *mut c_void) -> transport_t {
    ptr::null_mut()
}
pub unsafe extern "C" fn uninstallTransport(_: transfer_engine_t, _: *const c_char) -> c_int {
    FAILED
}
pub unsafe extern "C" fn getLocalIpAndPort(_: transfer_engine_t, _: *mut c_char, _: usize) -> c_int {
    FAILED
}
pub unsafe extern "C" fn openSegment(_: transfer_engine_t, _: *const c_char) -> segment_id_t {
    FAILED
}
pub unsafe extern "C" fn closeSegment(_: transfer_engine_t, _: segment_id_t) -> c_int {
    FAILED
}
pub unsafe extern "C" fn registerLocalMemory(_: transfer_engine_t, _: *mut c_void, _: usize, _: *const c_char, _: c_int) -> c_int {
    FAILED
}
pub unsafe extern "C" fn unregisterLocalMemory(_: transfer_engine_t, _: *mut c_void) -> c_int {
    FAILED
}
pub unsafe extern "C" fn allocateBatchID(_: transfer_engine_t, _: usize) -> batch_id_t {
    INVALID_BATCH
}
pub unsafe extern "C" fn submitTransfer(_: transfer_engine_t, _: batch_id_t, _: *mut transfer_request, _: usize) -> c_int {
    FAILED
}
pub unsafe extern "C" fn getTransferStatus(_: transfer_engine_t, _: batch_id_t, _: usize, _: *mut transfer_status) -> c_int {
    FAILED
}
pub unsafe extern "C" fn freeBatchID(_: transfer_engine_t, _: batch_id_t) -> c_int {
    FAILED
}
pub unsafe extern "C" fn syncSegmentCache(_: transfer_engine_t) -> c_int {
    FAILED
}
