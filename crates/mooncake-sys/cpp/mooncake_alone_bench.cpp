// "Mooncake alone": the baseline for kvc-transfer-bench. Moves the same
// byte ranges between two processes through the same engine.so and the
// same C API calls, timed the same way (allocateBatchID .. freeBatchID per
// iteration, completion polled with the same backoff), with no Rust and no
// kvc code on the path. kvc-transfer-bench drives both roles through
// stdin/stdout, writes the plan file, and alternates iterations with kvc's
// so that both see the same load from the rest of the machine.
//
//   mooncake_alone_bench target <pool_bytes>
//       prints "READY <segment> <base_addr> <pool_bytes>", serves until
//       stdin closes.
//   mooncake_alone_bench initiator <segment> <remote_addr> <pool_bytes>
//                                  <plan_file> <max_backoff_us> <window>
//       plan_file: one "src_offset dst_offset length" per line; tasks go
//       out in batches of window/2 with at most <window> in flight (the TCP
//       transport fails tasks beyond its per-peer queue). Prints "READY",
//       then for each "GO" line on stdin moves the plan once and prints
//       "ITER <nanoseconds>"; at end of input prints "DONE".
//
// Built by crates/mooncake-sys/build.rs next to the shim (wheel linkage
// only); kvc-transfer-bench finds it through KVC_MOONCAKE_ALONE_BENCH.

#include <algorithm>
#include <chrono>
#include <deque>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "mooncake_c_api.h"

namespace {

[[noreturn]] void die(const std::string& msg) {
    std::fprintf(stderr, "mooncake_alone_bench: %s\n", msg.c_str());
    std::exit(1);
}

transfer_engine_t start_engine() {
    transfer_engine_t e = createTransferEngine("P2PHANDSHAKE", "127.0.0.1", "", 0, 0);
    if (!e) die("createTransferEngine failed");
    if (!installTransport(e, "tcp", nullptr)) die("installTransport(tcp) failed");
    return e;
}

// Page-aligned, touched (first-touch faults would be measured otherwise),
// registered.
char* pool(transfer_engine_t e, size_t bytes) {
    void* p = nullptr;
    if (posix_memalign(&p, 4096, bytes) != 0) die("out of memory");
    std::memset(p, 0x5a, bytes);
    if (registerLocalMemory(e, p, bytes, "*", 1) != 0) die("registerLocalMemory failed");
    return static_cast<char*>(p);
}

int target(size_t bytes) {
    transfer_engine_t e = start_engine();
    char* buf = pool(e, bytes);
    char seg[256];
    if (getLocalIpAndPort(e, seg, sizeof seg) != 0) die("getLocalIpAndPort failed");
    std::printf("READY %s %llu %zu\n", seg, (unsigned long long)(uintptr_t)buf, bytes);
    std::fflush(stdout);
    std::string line;
    while (std::getline(std::cin, line)) {
    }
    unregisterLocalMemory(e, buf);
    destroyTransferEngine(e);
    std::free(buf);
    return 0;
}

struct Range {
    uint64_t src, dst, len;
};

struct Batch {
    batch_id_t id;
    size_t start, len, next;
};

int initiator(const char* segment, uint64_t remote, size_t bytes, const char* plan_file,
              long max_backoff_us, size_t window) {
    std::vector<Range> plan;
    std::ifstream in(plan_file);
    Range r{};
    while (in >> r.src >> r.dst >> r.len) {
        if (r.src + r.len > bytes) die("plan range beyond the local pool");
        plan.push_back(r);
    }
    if (plan.empty()) die("empty plan");
    window = std::max<size_t>(window, 1);
    const size_t chunk = (window + 1) / 2;

    transfer_engine_t e = start_engine();
    char* buf = pool(e, bytes);
    segment_id_t seg = openSegment(e, segment);
    if (seg < 0) die(std::string("openSegment failed: ") + segment);

    std::vector<transfer_request> reqs(plan.size());
    std::printf("READY\n");
    std::fflush(stdout);
    std::string line;
    while (std::getline(std::cin, line)) {
        if (line != "GO") continue;
        auto t0 = std::chrono::steady_clock::now();
        for (size_t i = 0; i < plan.size(); ++i) {
            reqs[i] = transfer_request{KVC_OPCODE_WRITE, buf + plan[i].src, seg, 0,
                                       remote + plan[i].dst, plan[i].len};
        }
        std::deque<Batch> inflight;
        size_t submitted = 0, outstanding = 0;
        long backoff_us = 50;
        while (submitted < plan.size() || !inflight.empty()) {
            while (submitted < plan.size()) {
                size_t len = std::min(chunk, plan.size() - submitted);
                if (outstanding > 0 && outstanding + len > window) break;
                batch_id_t b = allocateBatchID(e, len);
                if (b == KVC_INVALID_BATCH) die("allocateBatchID failed");
                if (submitTransfer(e, b, reqs.data() + submitted, len) != 0) die("submitTransfer failed");
                inflight.push_back(Batch{b, submitted, len, 0});
                submitted += len;
                outstanding += len;
            }
            Batch& front = inflight.front();
            transfer_status st{};
            if (getTransferStatus(e, front.id, front.next, &st) != 0) die("getTransferStatus failed");
            if (st.status == 4) {
                ++front.next;
                --outstanding;
                backoff_us = 50;
                if (front.next == front.len) {
                    if (freeBatchID(e, front.id) != 0) die("freeBatchID failed");
                    inflight.pop_front();
                }
                continue;
            }
            if (st.status != 0 && st.status != 1) die("transfer failed, status " + std::to_string(st.status));
            std::this_thread::sleep_for(std::chrono::microseconds(backoff_us));
            backoff_us = std::min(backoff_us * 2, max_backoff_us);
        }
        auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                      std::chrono::steady_clock::now() - t0)
                      .count();
        std::printf("ITER %lld\n", (long long)ns);
        std::fflush(stdout);
    }
    closeSegment(e, seg);
    unregisterLocalMemory(e, buf);
    destroyTransferEngine(e);
    std::free(buf);
    std::printf("DONE\n");
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc == 3 && std::string(argv[1]) == "target") {
        return target(std::strtoull(argv[2], nullptr, 10));
    }
    if (argc == 8 && std::string(argv[1]) == "initiator") {
        return initiator(argv[2], std::strtoull(argv[3], nullptr, 10),
                         std::strtoull(argv[4], nullptr, 10), argv[5], std::atol(argv[6]),
                         std::strtoull(argv[7], nullptr, 10));
    }
    std::fprintf(stderr,
                 "usage: mooncake_alone_bench target <pool_bytes>\n"
                 "       mooncake_alone_bench initiator <segment> <remote_addr> <pool_bytes> "
                 "<plan_file> <max_backoff_us> <window>\n");
    return 2;
}
