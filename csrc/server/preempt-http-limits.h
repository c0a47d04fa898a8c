#pragma once
// llama-preempt: every HTTP connection bounded, so slow, stuck or hostile clients cannot take the
// server down. cpp-httplib runs one thread per connection; upstream let a connection that sent half a
// request hold its thread for --timeout (an hour), and its thread pool could leave a request queued
// behind busy threads. Here (with patch http-limits in cpp-httplib): a request's line, headers and body
// arrive within --read-deadline of its first byte; an idle keep-alive connection closes after
// --keep-alive-timeout; at most --max-connections are open, one more is answered 503 at once; a
// response whose client reads nothing for --stall-timeout is ended (its request cancelled, its cells
// freed); and the pool has a thread for every connection it admits, so /health always finds one.

#include "common.h"
#include "preempt-metrics.h"

#include <algorithm>
#include <string>

namespace llama_preempt {

// the threads of the HTTP pool: `base` always alive (sized from the slots and the queue, -nt when
// given), dynamic ones up to `max` (one per admitted connection, plus room for the refusals' short jobs)
struct http_threads {
    int base = 0;
    int max  = 0;
};

inline http_threads http_threads_for(const common_params & params, int upstream_base) {
    http_threads t;
    // a slot's request, a queued one (--max-queue), and 4 for monitoring (/health, /metrics, /slots, /props)
    t.base = params.n_threads_http > 0 ? params.n_threads_http
                                       : std::max(upstream_base, params.n_parallel + std::max(0, params.preempt_max_queue) + 4);
    t.max  = params.preempt_max_connections > 0 ? std::max(t.base, params.preempt_max_connections) + 64 : t.base + 1024;
    return t;
}

// the 503 a connection beyond --max-connections gets, whole, before it is closed
inline std::string connection_refusal(int max_connections) {
    // the JSON error shape of every other refusal (the message has nothing to escape)
    const std::string body = "{\"error\":{\"code\":503,\"type\":\"unavailable_error\",\"message\":\"too many "
                             "connections: this server holds at most " + std::to_string(max_connections) +
                             " open at once (--max-connections); retry shortly\"}}";
    return "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json; charset=utf-8\r\nContent-Length: " +
           std::to_string(body.size()) + "\r\nRetry-After: 1\r\nConnection: close\r\n\r\n" + body;
}

// the write side's bound: a write that finds no room for this long ends the response (--timeout when
// --stall-timeout is 0)
inline int write_timeout_s(const common_params & params) {
    return params.preempt_stall_timeout_s > 0 ? std::min(params.timeout_write, params.preempt_stall_timeout_s)
                                              : params.timeout_write;
}

// the start log's line: how many threads, and every limit with its flag (SRV_INF: server-common.h)
inline void log_http_limits(const common_params & params, const http_threads & t) {
    SRV_INF("HTTP: %d threads always, up to %d (a thread for each of up to %d connections, --max-connections; "
            "one more is answered 503); a request's headers and body within %d s (--read-deadline), an idle "
            "keep-alive connection closed after %d s (--keep-alive-timeout), a client that reads nothing for %d s "
            "ended (--stall-timeout)\n", t.base, t.max, params.preempt_max_connections, params.preempt_read_deadline_s,
            params.preempt_keep_alive_s, write_timeout_s(params));
}

// each connection's send buffer, fixed (set on the listener, which its connections inherit): the
// kernel would grow it to megabytes, so a client that stops reading was noticed only after megabytes
// of its answer had been generated and queued; 256 KiB is a few thousand streamed tokens, and bounds
// the kernel memory a thousand held connections take
constexpr int http_send_buffer_bytes = 256 << 10;

template <typename Socket>
void bound_send_buffer(Socket sock) {
    const int bytes = http_send_buffer_bytes;
    setsockopt(sock, SOL_SOCKET, SO_SNDBUF, reinterpret_cast<const char *>(&bytes), sizeof(bytes));
}

// applied to each listener (Server: httplib::Server with patch http-limits)
template <typename Server>
void apply_http_limits(Server & srv, const common_params & params) {
    srv.set_request_read_deadline(params.preempt_read_deadline_s);
    srv.set_keep_alive_timeout(params.preempt_keep_alive_s);
    srv.set_write_timeout(write_timeout_s(params));
    srv.set_max_connections(params.preempt_max_connections > 0 ? (size_t) params.preempt_max_connections : 0,
                            connection_refusal(params.preempt_max_connections));
}

// what the listeners' limits did, summed (Server as above)
template <typename Servers>
http_limit_counts http_limit_counts_of(const Servers & servers) {
    http_limit_counts c;
    for (const auto & srv : servers) {
        if (!srv) {
            continue;
        }
        const auto & k = srv->limit_counters();
        c.open          += k.open.load();
        c.refused       += k.refused.load();
        c.read_deadline += k.read_deadline.load();
        c.write_stalled += k.write_stalled.load();
        c.idle_closed   += k.idle_closed.load();
    }
    return c;
}

} // namespace llama_preempt
