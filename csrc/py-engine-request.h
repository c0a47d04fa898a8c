// llama_preempt._core: one request of the in-process Engine (py-engine.cpp), shared between the
// upstream route handler that answers it on its own thread and the Python side that reads it.
#pragma once

#include <pybind11/pybind11.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>

namespace py = pybind11;

// One request, answered by an upstream route handler on its own thread. The Python side reads
// the status and either the body or the stream's chunks.
struct engine_request {
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
        cv.notify_all();
    }

    void push_chunk(std::string chunk) {
        {
            std::lock_guard<std::mutex> lk(mtx);
            chunks.push_back(std::move(chunk));
        }
        cv.notify_all();
    }

    void set_done() {
        {
            std::lock_guard<std::mutex> lk(mtx);
            started = true;
            done    = true;
        }
        cv.notify_all();
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
