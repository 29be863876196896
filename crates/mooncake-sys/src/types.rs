//! The C API's value types and constants (`transfer_engine_c.h`), with the
//! layouts Mooncake's C callers use.

#![allow(non_camel_case_types)]

use std::ffi::{c_int, c_void};

/// An engine (`TransferEngine*` behind the C API).
pub type transfer_engine_t = *mut c_void;
/// A transport installed on an engine (only tested for null).
pub type transport_t = *mut c_void;
/// A remote segment opened by `openSegment`; negative means failure.
pub type segment_id_t = i32;
/// A batch of transfer tasks.
pub type batch_id_t = u64;

/// `allocateBatchID` failed.
pub const INVALID_BATCH: batch_id_t = u64::MAX;
pub const OPCODE_READ: c_int = 0;
pub const OPCODE_WRITE: c_int = 1;

/// Task states reported by `getTransferStatus`.
pub const STATUS_WAITING: c_int = 0;
pub const STATUS_PENDING: c_int = 1;
pub const STATUS_INVALID: c_int = 2;
pub const STATUS_CANCELED: c_int = 3;
pub const STATUS_COMPLETED: c_int = 4;
pub const STATUS_TIMEOUT: c_int = 5;
pub const STATUS_FAILED: c_int = 6;

/// One transfer task: `length` bytes between local `source` and
/// `target_offset` (an address in the remote process for host memory) of
/// segment `target_id`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct transfer_request {
    pub opcode: c_int,
    pub source: *mut c_void,
    pub target_id: segment_id_t,
    /// File segments only (newer C headers); 0 for memory.
    pub file_id: u32,
    pub target_offset: u64,
    pub length: u64,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct transfer_status {
    pub status: c_int,
    pub transferred_bytes: u64,
}

/// Human name of a task state.
pub fn status_name(status: c_int) -> &'static str {
    match status {
        STATUS_WAITING => "WAITING",
        STATUS_PENDING => "PENDING",
        STATUS_INVALID => "INVALID",
        STATUS_CANCELED => "CANCELED",
        STATUS_COMPLETED => "COMPLETED",
        STATUS_TIMEOUT => "TIMEOUT",
        STATUS_FAILED => "FAILED",
        _ => "UNKNOWN",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    #[test]
    fn c_structs_have_the_c_api_layout() {
        assert_eq!(size_of::<transfer_request>(), 40);
        assert_eq!(offset_of!(transfer_request, source), 8);
        assert_eq!(offset_of!(transfer_request, target_id), 16);
        assert_eq!(offset_of!(transfer_request, file_id), 20);
        assert_eq!(offset_of!(transfer_request, target_offset), 24);
        assert_eq!(offset_of!(transfer_request, length), 32);
        assert_eq!(size_of::<transfer_status>(), 16);
        assert_eq!(offset_of!(transfer_status, transferred_bytes), 8);
    }
}
