// llama_preempt._core.RequestHandle: one request of the in-process Engine as Python reads it
// (py-engine-request.h), bound here so that py-engine.cpp holds the Engine alone.
#include "py-engine-request.h"

#include <pybind11/stl.h>

#include <memory>
#include <vector>

std::map<std::string, std::string> parse_query_string(const std::string & query) {
    std::map<std::string, std::string> out;
    size_t start = 0;
    while (start < query.size()) {
        size_t end = query.find('&', start);
        if (end == std::string::npos) {
            end = query.size();
        }
        const std::string kv = query.substr(start, end - start);
        const size_t eq = kv.find('=');
        if (!kv.empty()) {
            out[kv.substr(0, eq)] = eq == std::string::npos ? "" : kv.substr(eq + 1);
        }
        start = end + 1;
    }
    return out;
}

void register_request(py::module_ & m) {
    py::class_<engine_request, std::shared_ptr<engine_request>>(m, "RequestHandle",
            "one request answered by an upstream route handler on its own thread")
        .def("cancel", [](engine_request & r) {
            py::gil_scoped_release nogil;
            r.cancel();
        }, "ask the handler to stop, as a client disconnect does: it stops at once, and the loop frees "
           "the slot at its next step")
        .def_property_readonly("cancelled", [](engine_request & r) { return r.cancelled.load(); })
        .def_property_readonly("id", [](engine_request & r) { return r.id; })
        .def_property_readonly("done", [](engine_request & r) {
            std::lock_guard<std::mutex> lk(r.mtx);
            return r.done;
        })
        .def_property_readonly("started", [](engine_request & r) {
            std::lock_guard<std::mutex> lk(r.mtx);
            return r.started;
        })
        .def_property_readonly("status", [](engine_request & r) {
            std::lock_guard<std::mutex> lk(r.mtx);
            return r.status;
        })
        .def_property_readonly("is_stream", [](engine_request & r) {
            std::lock_guard<std::mutex> lk(r.mtx);
            return r.is_stream;
        })
        .def_property_readonly("data", [](engine_request & r) {
            std::lock_guard<std::mutex> lk(r.mtx);
            return py::bytes(r.data);
        })
        .def("has_chunks", [](engine_request & r) {
            std::lock_guard<std::mutex> lk(r.mtx);
            return !r.chunks.empty();
        })
        .def("take_chunks", [](engine_request & r) {
            std::vector<py::bytes> out;
            std::lock_guard<std::mutex> lk(r.mtx);
            for (auto & c : r.chunks) {
                out.emplace_back(c);
            }
            r.chunks.clear();
            return out;
        }, "the streamed chunks that arrived since the last call")
        .def("wait_started", [](engine_request & r, double timeout_s) {
            return r.wait_for(timeout_s, [&]() { return r.started; });
        }, py::arg("timeout_s") = -1.0)
        .def("wait_done", [](engine_request & r, double timeout_s) {
            return r.wait_for(timeout_s, [&]() { return r.done; });
        }, py::arg("timeout_s") = -1.0)
        .def("wait_chunk", [](engine_request & r, double timeout_s) {
            return r.wait_for(timeout_s, [&]() { return r.done || !r.chunks.empty(); });
        }, py::arg("timeout_s") = -1.0, "wait for a chunk or the end of the stream");
}
