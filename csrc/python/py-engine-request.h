// llama_preempt._core: one request of the in-process Engine (py-engine.cpp), shared between the
// upstream route handler that answers it on its own thread and the Python side that reads it.
#pragma once

#include <pybind11/pybind11.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <string>

#include <cerrno>
#include <unistd.h>

namespace py = pybind11;

// Where requests tell an event loop that they have news (the Engine's notify pipe, for asyncio):
// each piece of news writes the request's id, 8 bytes, to a non-blocking pipe the event loop
// watches; a full pipe loses the id but sets `missed`, and the reader then looks at every request.
struct engine_notifier {
    int               fd = -1;  // the pipe's write end
    std::atomic<bool> missed{false};

    void tell(uint64_t id) {
        if (fd < 0) {
            return;  // closed with the Engine
        }
        while (write(fd, &id, sizeof(id)) < 0) {
            if (errno != EINTR) {
                missed = true;  // EAGAIN: the reader is behind, and will look at everything
                return;
            }
        }
    }
};

// What a cancel wakes: the Engine's server, whose waiting request handlers then check their
// should_stop() at once instead of at their next 1 s poll (server_context::wake_readers()). The
// Engine lets it go at close(); a request's handle may outlive the Engine.
struct engine_waker {
    std::mutex mtx;
    std::function<void()> wake;  // empty once the Engine is closed

    void operator()() {
        std::lock_guard<std::mutex> lk(mtx);
        if (wake) {
            wake();
        }
    }
};

// "a=1&b" -> {a: "1", b: ""}: a request target's query, as a route handler reads its params
std::map<std::string, std::string> parse_query_string(const std::string & query);

// One request, answered by an upstream route handler on its own thread. The Python side reads
// the status and either the body or the stream's chunks.
struct engine_request {
    uint64_t id = 0;                          // the Engine's count of requests, from 1
    std::shared_ptr<engine_notifier> notify;  // set while an event loop listens (AsyncEngine)
    std::shared_ptr<engine_waker>    waker;   // the Engine's: a cancel wakes its handler now
    std::atomic<bool> cancelled{false};
    const std::function<bool()> should_stop = [this]() { return cancelled.load(); };

    std::mutex              mtx;
    std::condition_variable cv;
    bool        started   = false;  // status (and for a stream, its first chunk) known
    bool        done      = false;  // the handler and its stream are finished
    bool        is_stream = false;
    int         status    = 0;
    std::string data;               // non-streamed body
    std::deque<std::string> chunks; // streamed SSE chunks not taken yet

    void set_started(int st, bool stream, std::string body) {
        {
            std::lock_guard<std::mutex> lk(mtx);
            status    = st;
            is_stream = stream;
            data      = std::move(body);
            started   = true;
        }
        news();
    }

    void push_chunk(std::string chunk) {
        {
            std::lock_guard<std::mutex> lk(mtx);
            chunks.push_back(std::move(chunk));
        }
        news();
    }

    void set_done() {
        {
            std::lock_guard<std::mutex> lk(mtx);
            started = true;
            done    = true;
        }
        news();
    }

    // stop the request, as a client disconnect does: its handler sees it at once and the loop's
    // next step frees its slot (the handler posts the cancel before that step begins, unless the
    // loop is mid-step: then at the step after)
    void cancel() {
        cancelled = true;
        cv.notify_all();
        if (waker) {
            (*waker)();
        }
    }

    // wake the threads that wait on it, and the event loop that listens
    void news() {
        cv.notify_all();
        if (notify) {
            notify->tell(id);
        }
    }

    // wait (GIL released) until pred holds or the timeout passes; a negative timeout waits forever
    template <typename Pred>
    bool wait_for(double timeout_s, Pred pred) {
        py::gil_scoped_release nogil;
        std::unique_lock<std::mutex> lk(mtx);
        if (timeout_s < 0) {
            cv.wait(lk, pred);
            return true;
        }
        return cv.wait_for(lk, std::chrono::duration<double>(timeout_s), pred);
    }
};
