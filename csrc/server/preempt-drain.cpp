// llama-preempt: the graceful drain's process-wide state (preempt-drain.h).
#include "preempt-drain.h"

#include <chrono>
#include <cstdlib>
#include <cstring>
#if defined(_WIN32)
#include <io.h>
#define LLAMA_PREEMPT_WRITE _write
#else
#include <unistd.h>
#define LLAMA_PREEMPT_WRITE write
#endif

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
    (void) !LLAMA_PREEMPT_WRITE(2, msg, (unsigned) (sizeof(msg) - 1));
    std::_Exit(1);  // async-signal-safe, unlike exit()
}

int drain_level() {
    return std::min(g_level.load(), 2);
}

int32_t drain_timeout_s() {
    return g_timeout_s.load();
}

static bool ends_with(const std::string & s, const char * tail) {
    const size_t n = strlen(tail);
    return s.size() >= n && s.compare(s.size() - n, n, tail) == 0;
}

std::string drain_refusal(const std::string & method, const std::string & path) {
    if (g_level.load() == 0) {
        return "";
    }
    // the health checks, behind --api-prefix too, and Vertex AI's own route
    const char * aip = getenv("AIP_HEALTH_ROUTE");
    const bool health = ends_with(path, "/health") || (aip && path == aip);
    // POSTs that start no new work: the slot actions (an unpark lets a parked request finish),
    // steering a completion in flight, finding a stream the drain is still finishing
    const bool steers = path.find("/slots/") != std::string::npos || ends_with(path, "/chat/completions/control") ||
                        ends_with(path, "/streams/lookup");
    if ((method != "POST" || steers) && !health) {
        return "";
    }
    return health
        ? R"({"status":"draining","error":{"code":503,"message":"the server is shutting down: finishing the requests it has, taking no new ones","type":"unavailable_error"}})"
        : R"({"error":{"code":503,"message":"the server is shutting down (draining): send this request to another server","type":"unavailable_error"}})";
}

void drain_watcher::start(std::function<void(bool changed)> tick) {
    stop();
    done = false;
    thread = std::thread([this, tick = std::move(tick)]() {
        int seen = 0;
        while (!done.load()) {
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
            const int level = drain_level();
            if (level > 0) {
                tick(level != seen);
                seen = level;
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
