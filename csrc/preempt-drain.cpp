// llama-preempt: the graceful drain's process-wide state (preempt-drain.h).
#include "preempt-drain.h"

#include <chrono>
#include <unistd.h>

namespace llama_preempt {

static std::atomic<bool>    g_armed{false};
static std::atomic<int>     g_level{0};
static std::atomic<int32_t> g_timeout_s{0};

static_assert(std::atomic<int>::is_always_lock_free, "the signal handler needs a lock-free counter");

void drain_arm(int32_t timeout_s) {
    g_timeout_s = timeout_s;
    g_armed     = true;
}

bool drain_take_signal() {
    if (!g_armed.load()) {
        return false;  // still loading (or not llama-server): upstream's handling
    }
    const int level = g_level.fetch_add(1) + 1;
    if (level <= 2) {
        return true;
    }
    static const char msg[] = "llama-preempt: third signal, exiting at once\n";
    (void) !write(STDERR_FILENO, msg, sizeof(msg) - 1);
    _exit(1);
}

int drain_level() {
    return std::min(g_level.load(), 2);
}

int32_t drain_timeout_s() {
    return g_timeout_s.load();
}

std::string drain_refusal(const std::string & method, const std::string & path) {
    if (g_level.load() == 0) {
        return "";
    }
    const bool health = path == "/health" || path == "/v1/health";
    if (method != "POST" && !health) {
        return "";
    }
    return health
        ? R"({"status":"draining","error":{"code":503,"message":"the server is shutting down: finishing the requests it has, taking no new ones","type":"unavailable_error"}})"
        : R"({"error":{"code":503,"message":"the server is shutting down (draining): send this request to another server","type":"unavailable_error"}})";
}

void drain_watcher::start(std::function<void()> wake) {
    stop();
    done = false;
    thread = std::thread([this, wake = std::move(wake)]() {
        int seen = 0;
        while (!done.load()) {
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
            const int level = drain_level();
            if (level != seen) {
                seen = level;
                wake();
            }
        }
    });
}

void drain_watcher::stop() {
    done = true;
    if (thread.joinable()) {
        thread.join();
    }
}

} // namespace llama_preempt
