// llama-preempt: what the devices themselves do: their copy speeds (the yardstick for SWAP's), and
// what the server says when one is lost.

#include "preempt-copy.h"

#include <chrono>
#include <cstdio>
#include <cstring>

// ggml's own backtrace printer (ggml/src/ggml-impl.h), kept for aborts that are not a lost device
extern "C" void ggml_print_backtrace(void);

namespace llama_preempt {

std::vector<link_speed> measure_link_speeds(size_t n_bytes, int n_reps) {
    using clock = std::chrono::steady_clock;
    std::vector<link_speed> out;
    auto best_gbps = [&](auto && copy) {
        double best = 0;
        for (int i = 0; i < std::max(1, n_reps); ++i) {
            const auto t0 = clock::now();
            copy();
            const double s = std::chrono::duration<double>(clock::now() - t0).count();
            best = std::max(best, s > 0 ? n_bytes / s / 1e9 : 0.0);
        }
        return best;
    };

    {
        std::vector<uint8_t> a(n_bytes, 1), b(n_bytes, 2);  // touched: no page faults in the timing
        out.push_back({ "host", "memcpy", best_gbps([&] { memcpy(b.data(), a.data(), n_bytes); }), false });
    }

    for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
        ggml_backend_dev_t dev = ggml_backend_dev_get(i);
        if (ggml_backend_dev_type(dev) == GGML_BACKEND_DEVICE_TYPE_CPU) {
            continue;
        }
        ggml_backend_t backend = ggml_backend_dev_init(dev, nullptr);
        ggml_backend_buffer_t dbuf = backend ? ggml_backend_buft_alloc_buffer(ggml_backend_dev_buffer_type(dev), n_bytes) : nullptr;
        ggml_backend_buffer_type_t host_buft = ggml_backend_dev_host_buffer_type(dev);
        ggml_backend_buffer_t hbuf = host_buft ? ggml_backend_buft_alloc_buffer(host_buft, n_bytes) : nullptr;
        std::vector<uint8_t> plain;
        uint8_t * host = hbuf ? (uint8_t *) ggml_backend_buffer_get_base(hbuf) : nullptr;
        if (host == nullptr) {
            plain.assign(n_bytes, 1);
            host = plain.data();
        }
        if (dbuf) {
            ggml_init_params params = { ggml_tensor_overhead(), nullptr, true };
            ggml_context * ctx = ggml_init(params);
            ggml_tensor * t = ggml_new_tensor_1d(ctx, GGML_TYPE_I8, (int64_t) n_bytes);
            t->buffer = dbuf;
            t->data   = ggml_backend_buffer_get_base(dbuf);
            memset(host, 3, n_bytes);
            ggml_backend_tensor_set(t, host, 0, n_bytes);  // warm up
            const std::string name = ggml_backend_dev_name(dev);
            out.push_back({ name, "device_to_host", best_gbps([&] {
                ggml_backend_tensor_get_async(backend, t, host, 0, n_bytes);
                ggml_backend_synchronize(backend);
            }), hbuf != nullptr });
            out.push_back({ name, "host_to_device", best_gbps([&] {
                ggml_backend_tensor_set_async(backend, t, host, 0, n_bytes);
                ggml_backend_synchronize(backend);
            }), hbuf != nullptr });
            ggml_free(ctx);
            ggml_backend_buffer_free(dbuf);
        }
        if (hbuf) {
            ggml_backend_buffer_free(hbuf);
        }
        if (backend) {
            ggml_backend_free(backend);
        }
    }
    return out;
}

// llama.cpp ends the process when an RPC server goes away mid-command (RPC_STATUS_ASSERT: a lost
// connection cannot be resumed, the device's buffers went with it). That stays so; this says what
// it means for the requests, in one line an operator can act on, instead of a bare assert and a
// backtrace. Everything they held (cells on the device, swap buffers in host RAM) ends with the
// process: nothing is left behind on the host.
static void on_ggml_abort(const char * message) {
    fprintf(stderr, "%s\n", message);
    if (strstr(message, "RPC") != nullptr) {
        fprintf(stderr, "llama-server: lost an RPC device (rpc-server stopped or unreachable): llama.cpp cannot continue "
                        "without it, so the server ends here; the requests running and parked in it are lost. "
                        "Restart the rpc-server(s), then llama-server.\n");
    } else {
        ggml_print_backtrace();
    }
    fflush(stderr);
}

void log_lost_devices() {
    ggml_set_abort_callback(on_ggml_abort);
}

} // namespace llama_preempt
