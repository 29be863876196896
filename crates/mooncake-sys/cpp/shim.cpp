// Mooncake's C API (the subset in mooncake_c_api.h) implemented over the
// C++ class `mooncake::TransferEngine` that the PyPI wheel's engine.so
// exports (the wheel ships no C API).
//
// Only the members we call are declared, with the exact signatures engine.so
// exports (their mangled names must match), and the value types they take
// with the byte layouts of the verified versions (src/verified.rs):
// a wrong layout would silently corrupt transfers, hence the static_asserts.
// Every entry point catches C++ exceptions: none may unwind into Rust.

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <new>
#include <string>
#include <vector>

#include "mooncake_c_api.h"

extern "C" void kvc_python_stubs_anchor(void);

namespace mooncake {

// 16 bytes: {uint16 code; const char* message}. The destructor is inline
// in Mooncake (delete[] of the message) and non-trivial, which also makes
// the ABI return it through a hidden pointer, as engine.so does.
class Status final {
   public:
    Status() = default;
    Status(const Status&) = delete;
    Status& operator=(const Status&) = delete;
    ~Status() { delete[] message_; }
    int code() const { return static_cast<int>(code_); }

   private:
    uint16_t code_ = 0;
    const char* message_ = nullptr;
};
static_assert(sizeof(Status) == 16, "mooncake::Status layout");

// Declared for its nested types only; never instantiated here.
class Transport {
   public:
    using SegmentHandle = uint64_t;
    using SegmentID = uint64_t;
    using BatchID = uint64_t;

    struct TransferRequest {
        enum OpCode { READ = 0, WRITE = 1 };
        OpCode opcode;
        void* source;
        SegmentID target_id;
        uint64_t target_offset;
        size_t length;
        int advise_retry_cnt = 0;
        int transport_hint = 0;
        uint64_t task_group_id = 0;
    };

    enum TransferStatusEnum {
        WAITING = 0,
        PENDING = 1,
        INVALID = 2,
        CANCELED = 3,
        COMPLETED = 4,
        TIMEOUT = 5,
        FAILED = 6,
    };

    struct TransferStatus {
        TransferStatusEnum s;
        size_t transferred_bytes;
    };
};
static_assert(sizeof(Transport::TransferRequest) == 56, "TransferRequest layout");
static_assert(offsetof(Transport::TransferRequest, source) == 8, "TransferRequest.source");
static_assert(offsetof(Transport::TransferRequest, target_id) == 16, "TransferRequest.target_id");
static_assert(offsetof(Transport::TransferRequest, target_offset) == 24, "TransferRequest.target_offset");
static_assert(offsetof(Transport::TransferRequest, length) == 32, "TransferRequest.length");
static_assert(offsetof(Transport::TransferRequest, advise_retry_cnt) == 40, "TransferRequest.advise_retry_cnt");
static_assert(offsetof(Transport::TransferRequest, task_group_id) == 48, "TransferRequest.task_group_id");
static_assert(sizeof(Transport::TransferStatus) == 16, "TransferStatus layout");

class TransferEngine {
   public:
    explicit TransferEngine(bool auto_discover);
    ~TransferEngine();
    int init(const std::string& metadata_conn_string, const std::string& local_server_name,
             const std::string& ip_or_host_name, uint64_t rpc_port);
    Transport* installTransport(const std::string& proto, void** args);
    int uninstallTransport(const std::string& proto);
    std::string getLocalIpAndPort();
    Transport::SegmentHandle openSegment(const std::string& segment_name);
    int closeSegment(Transport::SegmentHandle handle);
    int registerLocalMemory(void* addr, size_t length, const std::string& location,
                            bool remote_accessible, bool update_metadata);
    int unregisterLocalMemory(void* addr, bool update_metadata);
    Transport::BatchID allocateBatchID(size_t batch_size);
    Status submitTransfer(Transport::BatchID batch_id,
                          const std::vector<Transport::TransferRequest>& entries);
    Status getTransferStatus(Transport::BatchID batch_id, size_t task_id,
                             Transport::TransferStatus& status);
    Status freeBatchID(Transport::BatchID batch_id);
    int syncSegmentCache(const std::string& segment_name);

   private:
    // The real object is 56 bytes in 0.3.13 and larger in later versions.
    // Over-allocate; its fields are never touched from here.
    alignas(16) unsigned char opaque_[1024];
};

}  // namespace mooncake

namespace {

using mooncake::Transport;
using mooncake::TransferEngine;

constexpr int kErrException = -9000;  // a C++ exception was caught
constexpr int kErrArgument = -1;      // as Mooncake's ERR_INVALID_ARGUMENT

TransferEngine* native(transfer_engine_t e) { return static_cast<TransferEngine*>(e); }

void report(const char* where, const std::exception* e) {
    std::fprintf(stderr, "mooncake-sys shim: %s threw %s\n", where,
                 e ? e->what() : "a non-standard exception");
}

// Runs `body`, turning any C++ exception into `on_error`.
template <typename T, typename F>
T guarded(const char* where, T on_error, F&& body) {
    try {
        return body();
    } catch (const std::exception& e) {
        report(where, &e);
    } catch (...) {
        report(where, nullptr);
    }
    return on_error;
}

}  // namespace

extern "C" {

transfer_engine_t createTransferEngine(const char* metadata_conn_string,
                                       const char* local_server_name,
                                       const char* ip_or_host_name, uint64_t rpc_port,
                                       int auto_discover) {
    kvc_python_stubs_anchor();
    if (!metadata_conn_string || !local_server_name) return nullptr;
    return guarded<transfer_engine_t>("createTransferEngine", nullptr, [&]() -> transfer_engine_t {
        auto* e = new TransferEngine(auto_discover != 0);
        int rc = e->init(metadata_conn_string, local_server_name,
                         ip_or_host_name ? ip_or_host_name : "", rpc_port);
        if (rc != 0) {
            delete e;
            return nullptr;
        }
        return e;
    });
}

void destroyTransferEngine(transfer_engine_t engine) {
    if (!engine) return;
    guarded<int>("destroyTransferEngine", 0, [&] {
        delete native(engine);
        return 0;
    });
}

transport_t installTransport(transfer_engine_t engine, const char* proto, void** args) {
    if (!engine || !proto) return nullptr;
    return guarded<transport_t>("installTransport", nullptr, [&]() -> transport_t {
        return native(engine)->installTransport(proto, args);
    });
}

int uninstallTransport(transfer_engine_t engine, const char* proto) {
    if (!engine || !proto) return kErrArgument;
    return guarded<int>("uninstallTransport", kErrException,
                        [&] { return native(engine)->uninstallTransport(proto); });
}

int getLocalIpAndPort(transfer_engine_t engine, char* buf_out, size_t buf_len) {
    if (!engine || !buf_out || buf_len == 0) return kErrArgument;
    return guarded<int>("getLocalIpAndPort", kErrException, [&] {
        std::string s = native(engine)->getLocalIpAndPort();
        if (s.size() + 1 > buf_len) return kErrArgument;
        std::snprintf(buf_out, buf_len, "%s", s.c_str());
        return 0;
    });
}

segment_id_t openSegment(transfer_engine_t engine, const char* segment_name) {
    if (!engine || !segment_name) return kErrArgument;
    return guarded<segment_id_t>("openSegment", kErrException, [&]() -> segment_id_t {
        Transport::SegmentHandle h = native(engine)->openSegment(segment_name);
        if (h == static_cast<Transport::SegmentHandle>(-1) || h > 0x7fffffffULL) return kErrArgument;
        return static_cast<segment_id_t>(h);
    });
}

int closeSegment(transfer_engine_t engine, segment_id_t segment_id) {
    if (!engine || segment_id < 0) return kErrArgument;
    return guarded<int>("closeSegment", kErrException, [&] {
        return native(engine)->closeSegment(static_cast<Transport::SegmentHandle>(segment_id));
    });
}

int registerLocalMemory(transfer_engine_t engine, void* addr, size_t length, const char* location,
                        int remote_accessible) {
    if (!engine || !addr || !location) return kErrArgument;
    return guarded<int>("registerLocalMemory", kErrException, [&] {
        return native(engine)->registerLocalMemory(addr, length, location, remote_accessible != 0,
                                                   true);
    });
}

int unregisterLocalMemory(transfer_engine_t engine, void* addr) {
    if (!engine || !addr) return kErrArgument;
    return guarded<int>("unregisterLocalMemory", kErrException,
                        [&] { return native(engine)->unregisterLocalMemory(addr, true); });
}

batch_id_t allocateBatchID(transfer_engine_t engine, size_t batch_size) {
    if (!engine) return KVC_INVALID_BATCH;
    return guarded<batch_id_t>("allocateBatchID", KVC_INVALID_BATCH,
                               [&] { return native(engine)->allocateBatchID(batch_size); });
}

int submitTransfer(transfer_engine_t engine, batch_id_t batch_id, struct transfer_request* entries,
                   size_t count) {
    if (!engine || (!entries && count > 0)) return kErrArgument;
    return guarded<int>("submitTransfer", kErrException, [&] {
        std::vector<Transport::TransferRequest> reqs(count);
        for (size_t i = 0; i < count; ++i) {
            const transfer_request& in = entries[i];
            if (in.target_id < 0) return kErrArgument;
            Transport::TransferRequest& r = reqs[i];
            r.opcode = in.opcode == KVC_OPCODE_READ ? Transport::TransferRequest::READ
                                                    : Transport::TransferRequest::WRITE;
            r.source = in.source;
            r.target_id = static_cast<Transport::SegmentID>(in.target_id);
            r.target_offset = in.target_offset;
            r.length = in.length;
        }
        mooncake::Status s = native(engine)->submitTransfer(batch_id, reqs);
        return s.code();
    });
}

int getTransferStatus(transfer_engine_t engine, batch_id_t batch_id, size_t task_id,
                      struct transfer_status* status) {
    if (!engine || !status) return kErrArgument;
    return guarded<int>("getTransferStatus", kErrException, [&] {
        Transport::TransferStatus st{Transport::WAITING, 0};
        mooncake::Status s = native(engine)->getTransferStatus(batch_id, task_id, st);
        if (s.code() == 0) {
            status->status = static_cast<int>(st.s);
            status->transferred_bytes = st.transferred_bytes;
        }
        return s.code();
    });
}

int freeBatchID(transfer_engine_t engine, batch_id_t batch_id) {
    if (!engine) return kErrArgument;
    return guarded<int>("freeBatchID", kErrException, [&] {
        mooncake::Status s = native(engine)->freeBatchID(batch_id);
        return s.code();
    });
}

int syncSegmentCache(transfer_engine_t engine) {
    if (!engine) return kErrArgument;
    return guarded<int>("syncSegmentCache", kErrException,
                        [&] { return native(engine)->syncSegmentCache(std::string()); });
}

}  // extern "C"
