// llama_preempt._core: the compiled side of the Python package.
//
// It exposes the one policy implementation that the server runs, so the Python layer (tests,
// the simulator) drives exactly the code the server does, and the server itself in process
// (EngineCore, py-engine.cpp), whose loop Python drives.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <map>
#include <set>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <tuple>

#include "ggml-backend.h"
#include "ggml-rpc.h"
#include "log.h"
#include "preempt-copy.h"
#include "py-enums.h"
#include "preempt-config.h"
#include "preempt-flags.h"
#include "preempt-policy.h"
#include "preempt-sim.h"
#include "preempt-version.h"

namespace py = pybind11;
namespace lp = llama_preempt;

void register_engine(py::module_ & m);  // py-engine.cpp: the in-process server
void register_events(py::module_ & m);  // py-events.cpp: step events and the exported names
void register_sim(py::module_ & m);     // py-sim.cpp: the simulator, its results and the policy's enums
void register_memory(py::module_ & m);  // py-memory.cpp: the memory half's choices (prompt files, the copy guard)
void register_model(py::module_ & m);   // py-model.cpp: the request fields and the chat messages check
void register_policy(py::module_ & m);  // py-policy.cpp: the planner, its phases, the step cost and the decode width
void register_choice(py::module_ & m);  // py-choice.cpp: how one victim is parked, the budgets, the flags' checks


PYBIND11_MODULE(_core, m) {
    m.doc() = "llama-preempt compiled core: the preemption policy shared with llama-server";

    register_events(m);
    register_engine(m);
    register_sim(m);
    register_memory(m);
    register_model(m);

    m.def("version", &lp::version, "llama-preempt version compiled into this module");
    m.def("version_line", &lp::version_line, "the identity line llama-server prints at start");

    register_policy(m);
    register_choice(m);

    // llama.cpp's log threshold for the process (0 errors off too ... 4 debug): a quiet Engine loads
    // at 1 (errors, which the load's exceptions point to) and serves at 0, where a failed request
    // is the RequestError Python raises and nothing more on stderr
    m.def("set_log_verbosity", [](int verbosity) { common_log_set_verbosity_thold(verbosity); }, py::arg("verbosity"));
    m.def("get_log_verbosity", []() { return common_log_get_verbosity_thold(); });

    m.def("measure_link_speeds", [](size_t n_bytes, int n_reps, const std::vector<std::string> & rpc) {
              std::vector<std::tuple<std::string, std::string, double, bool>> out;
              py::gil_scoped_release nogil;
              // RPC servers are devices only once registered, as llama-server's --rpc does
              for (const auto & endpoint : rpc) {
                  static std::set<std::string> added;
                  if (added.insert(endpoint).second) {
                      ggml_backend_register(ggml_backend_rpc_add_server(endpoint.c_str()));
                  }
              }
              for (const auto & l : lp::measure_link_speeds(n_bytes, n_reps)) {
                  out.emplace_back(l.device, l.what, l.gbps, l.pinned);
              }
              return out;
          },
          py::arg("n_bytes") = 256 << 20, py::arg("n_reps") = 5, py::arg("rpc") = std::vector<std::string>{},
          "(device, what, GB/s, pinned) for host memcpy and each device's host<->device transfers: "
          "the yardstick of the SWAP bandwidth bench; `rpc`: HOST:PORT of RPC servers to measure too");

}
