/*
 * The subset of Mooncake's C API (transfer_engine_c.h) that kvc uses, with
 * the same names, types and return conventions, so the same callers work
 * over the wheel shim (shim.cpp) and over a source-built libtransfer_engine.
 * Written for kvc from the documented API; src/lib.rs mirrors it in Rust.
 */
#ifndef KVC_MOONCAKE_C_API_H
#define KVC_MOONCAKE_C_API_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef void *transfer_engine_t;
typedef void *transport_t;
typedef int32_t segment_id_t;
typedef uint64_t batch_id_t;

#define KVC_INVALID_BATCH UINT64_MAX
#define KVC_OPCODE_READ 0
#define KVC_OPCODE_WRITE 1

/* 40 bytes: opcode at 0, source at 8, target_id at 16, file_id at 20 (the
 * padding slot in older headers), target_offset at 24, length at 32. */
struct transfer_request {
    int opcode;
    void *source;
    segment_id_t target_id;
    uint32_t file_id;
    uint64_t target_offset;
    uint64_t length;
};

/* status: WAITING 0, PENDING 1, INVALID 2, CANCELED 3, COMPLETED 4,
 * TIMEOUT 5, FAILED 6. */
struct transfer_status {
    int status;
    uint64_t transferred_bytes;
};

transfer_engine_t createTransferEngine(const char *metadata_conn_string,
                                       const char *local_server_name,
                                       const char *ip_or_host_name,
                                       uint64_t rpc_port, int auto_discover);
void destroyTransferEngine(transfer_engine_t engine);
transport_t installTransport(transfer_engine_t engine, const char *proto,
                             void **args);
int uninstallTransport(transfer_engine_t engine, const char *proto);
int getLocalIpAndPort(transfer_engine_t engine, char *buf_out, size_t buf_len);
segment_id_t openSegment(transfer_engine_t engine, const char *segment_name);
int closeSegment(transfer_engine_t engine, segment_id_t segment_id);
int registerLocalMemory(transfer_engine_t engine, void *addr, size_t length,
                        const char *location, int remote_accessible);
int unregisterLocalMemory(transfer_engine_t engine, void *addr);
batch_id_t allocateBatchID(transfer_engine_t engine, size_t batch_size);
int submitTransfer(transfer_engine_t engine, batch_id_t batch_id,
                   struct transfer_request *entries, size_t count);
int getTransferStatus(transfer_engine_t engine, batch_id_t batch_id,
                      size_t task_id, struct transfer_status *status);
int freeBatchID(transfer_engine_t engine, batch_id_t batch_id);
int syncSegmentCache(transfer_engine_t engine);

#ifdef __cplusplus
}
#endif

#endif /* KVC_MOONCAKE_C_API_H */
