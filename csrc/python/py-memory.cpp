// llama_preempt._core: the memory half's choices (policy/preempt-memory.h), as the server and the
// simulator ask them: the prompt cache's disk side and the copy guard's reaction.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <tuple>

#include "preempt-memory.h"

namespace py = pybind11;
namespace lp = llama_preempt;

namespace {

// a prompt file from Python: (tokens, bytes, written); the token vectors outlive the views
using py_file = std::tuple<std::vector<int32_t>, size_t, bool>;

std::vector<lp::prompt_file_view> file_views(const std::vector<py_file> & files) {
    std::vector<lp::prompt_file_view> v;
    v.reserve(files.size());
    for (const auto & f : files) {
        v.push_back({ std::get<0>(f).data(), std::get<0>(f).size(), std::get<1>(f), std::get<2>(f) });
    }
    return v;
}

} // namespace

void register_memory(py::module_ & m) {
    py::enum_<lp::prompt_read_why>(m, "PromptReadWhy", "why a cached prompt's file is read back or its tokens prefilled")
        .value("NO_MATCH",        lp::prompt_read_why::no_match)
        .value("RAM_AS_GOOD",     lp::prompt_read_why::ram_as_good)
        .value("PREFILL_CHEAPER", lp::prompt_read_why::prefill_cheaper)
        .value("NO_ROOM",         lp::prompt_read_why::no_room)
        .value("READ_BACK",       lp::prompt_read_why::read_back);
    py::class_<lp::prompt_read_choice>(m, "PromptReadChoice")
        .def(py::init<>())
        .def_readwrite("why",      &lp::prompt_read_choice::why)
        .def_readwrite("file",     &lp::prompt_read_choice::file)
        .def_readwrite("n_common", &lp::prompt_read_choice::n_common)
        .def_property_readonly("read", &lp::prompt_read_choice::read)
        .def("__repr__", [](const lp::prompt_read_choice & c) {
            return std::string("<PromptReadChoice ") + lp::prompt_read_why_name(c.why) + " file=" + std::to_string(c.file) +
                   " n_common=" + std::to_string(c.n_common) + ">";
        });
    m.def("match_prompt_file", [](const std::vector<py_file> & files, const std::vector<int32_t> & tokens) {
              const auto mt = lp::match_prompt_file(file_views(files), tokens);
              return std::make_tuple(mt.file, mt.n_common);
          }, py::arg("files"), py::arg("tokens"),
          "(file, n_common): the file (tokens, bytes, written) sharing the longest prefix, at least a quarter of its own");
    m.def("choose_prompt_read", [](const std::vector<py_file> & files, const std::vector<int32_t> & tokens,
                                   size_t n_ram_common, size_t host_room, const lp::cost_rates & rates) {
              return lp::choose_prompt_read(file_views(files), tokens, n_ram_common, host_room, rates);
          }, py::arg("files"), py::arg("tokens"), py::arg("n_ram_common"), py::arg("host_room"), py::arg("rates"),
          "the server's choice for a request: read its best prompt file back, or prefill (and why)");
    m.def("choose_read_ahead", [](const std::vector<py_file> & files, const lp::prompt_read_choice & next, int32_t held) {
              const auto a = lp::choose_read_ahead(file_views(files), next, held);
              return std::make_tuple(a.want, a.forget, a.start);
          }, py::arg("files"), py::arg("next"), py::arg("held"),
          "(want, forget, start): the file to hold read ahead for the oldest waiting request's choice `next`");
    m.def("prompt_files_to_drop", [](const std::vector<size_t> & sizes, size_t room, size_t n_bytes) {
              std::vector<py_file> files;
              for (size_t n : sizes) {
                  files.emplace_back(std::vector<int32_t>{}, n, true);
              }
              return lp::prompt_files_to_drop(file_views(files), room, n_bytes);
          }, py::arg("sizes"), py::arg("room"), py::arg("n_bytes"),
          "how many of the oldest prompt files (their sizes, oldest first) give way to a park of n_bytes");
    m.def("react_to_wrong_copy", [](bool per_slice_already, bool used_faster_route) {
              return std::string(lp::guard_reaction_name(lp::react_to_wrong_copy(per_slice_already, used_faster_route)));
          }, py::arg("per_slice_already"), py::arg("used_faster_route"),
          "the copy guard on a wrong copy: \"per_slice\" (that device copies slice by slice) or \"swap_off\"");
}
