// llama-preempt: the graceful drain. SIGTERM or SIGINT ends llama-server after its requests:
//  - new work is refused with 503, and /health answers 503 "draining", so a load balancer stops
//    sending;
//  - requests that have not started (waiting for a slot, or in one and not begun) are handed back
//    at once with 503, so a balancer sends them to another server;
//  - requests in flight, parked ones too, finish for up to --drain-timeout seconds;
//  - whatever is left then ends with an error response (a stream gets an error event and its end),
//    parked buffers are freed, and the process exits 0.
// A second signal ends the drain at once (the requests still answered with an error); a third
// exits at once with status 1, as upstream's second signal does.
//
// The state is process-wide: a signal handler can reach nothing else, and may only touch atomics.
// A small thread (drain_watcher) turns a signal into a wake-up of the server loop, which does the
// rest at its next step (preempt-drain-loop.h).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>

namespace llama_preempt {

// the binary arms the drain once its model is loaded and its signal handlers may reach us
void drain_arm(int32_t timeout_s);
// async-signal-safe: true when the drain takes this signal (the first and the second one)
bool drain_take_signal();
// 0: serving; 1: draining; 2: cut short (a second signal)
int drain_level();
int32_t drain_timeout_s();

// every 503 (a drain's, upstream's own while loading) says when to try again: soon, at another server
constexpr const char * RETRY_AFTER_S = "1";

// "" to let a request through, else the JSON body of its 503: while draining, POSTs that start new
// work and the health checks are refused; reads (/metrics, /slots, /props, ...), the slot actions,
// steering a completion in flight and finding a stream still answer
std::string drain_refusal(const std::string & method, const std::string & path);

// Polls the drain level every 20 ms and, while a drain runs, calls `tick` from its own thread
// (`changed`: the level moved since the last tick).
class drain_watcher {
public:
    drain_watcher() = default;
    drain_watcher(const drain_watcher &) = delete;
    drain_watcher & operator=(const drain_watcher &) = delete;
    ~drain_watcher() { stop(); }

    void start(std::function<void(bool changed)> tick);
    void stop();

private:
    std::thread       thread;
    std::atomic<bool> done{false};
};

} // namespace llama_preempt
