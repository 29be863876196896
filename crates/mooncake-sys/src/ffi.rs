//! The C API entry points, linked from the wheel shim (`cpp/shim.cpp` over
//! engine.so) or from a source-built `libtransfer_engine`. Same names,
//! signatures and conventions as Mooncake's `transfer_engine_c.h`: 0 (or a
//! non-null pointer, or a non-negative segment id) means success.

#![allow(non_snake_case)]

use std::ffi::{c_char, c_int, c_void};

use crate::types::*;

extern "C" {
    /// `metadata_conn_string` "P2PHANDSHAKE" needs no metadata server; the
    /// segment name is then `getLocalIpAndPort`'s "host:port".
    pub fn createTransferEngine(
        metadata_conn_string: *const c_char,
        local_server_name: *const c_char,
        ip_or_host_name: *const c_char,
        rpc_port: u64,
        auto_discover: c_int,
    ) -> transfer_engine_t;
    pub fn destroyTransferEngine(engine: transfer_engine_t);
    pub fn installTransport(engine: transfer_engine_t, proto: *const c_char, args: *mut *mut c_void) -> transport_t;
    pub fn uninstallTransport(engine: transfer_engine_t, proto: *const c_char) -> c_int;
    pub fn getLocalIpAndPort(engine: transfer_engine_t, buf_out: *mut c_char, buf_len: usize) -> c_int;
    pub fn openSegment(engine: transfer_engine_t, segment_name: *const c_char) -> segment_id_t;
    pub fn closeSegment(engine: transfer_engine_t, segment_id: segment_id_t) -> c_int;
    pub fn registerLocalMemory(
        engine: transfer_engine_t,
        addr: *mut c_void,
        length: usize,
        location: *const c_char,
        remote_accessible: c_int,
    ) -> c_int;
    pub fn unregisterLocalMemory(engine: transfer_engine_t, addr: *mut c_void) -> c_int;
    pub fn allocateBatchID(engine: transfer_engine_t, batch_size: usize) -> batch_id_t;
    pub fn submitTransfer(engine: transfer_engine_t, batch_id: batch_id_t, entries: *mut transfer_request, count: usize) -> c_int;
    pub fn getTransferStatus(engine: transfer_engine_t, batch_id: batch_id_t, task_id: usize, status: *mut transfer_status) -> c_int;
    pub fn freeBatchID(engine: transfer_engine_t, batch_id: batch_id_t) -> c_int;
    pub fn syncSegmentCache(engine: transfer_engine_t) -> c_int;
}
