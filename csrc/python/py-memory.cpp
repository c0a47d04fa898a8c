// llama_preempt._core: the memory half's choices (policy/preempt-memory.h), as the server and the
// simulator ask them: the prompt cache's disk side and the copy guard's reaction.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <tuple>

#include "preempt-disk-dir.h"
#include "preempt-host-ram.h"
#include "preempt-hostmem.h"  // return_free_pages()
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

// a cache that gives way, written in Python (tests: the budget's reservations without a server)
class py_host_cache : public lp::host_cache {
public:
    bool cap(size_t limit) override { PYBIND11_OVERRIDE_PURE(bool, lp::host_cache, cap, limit); }
};

// the budget with the Python cache it caps kept alive beside it
struct py_host_ram {
    py::object    cache;  // a HostCache, or None
    lp::host_ram  ram;
};

lp::host_held held_of(size_t parked, size_t ahead) {
    return { parked, ahead };
}

} // namespace

void register_memory(py::module_ & m) {
    py::class_<lp::host_cache, py_host_cache>(m, "HostCache",
                                              "what gives way to the host budget: cap(limit) caps the cache at limit "
                                              "bytes (2**64-1: no limit) and says whether it had to shrink")
        .def(py::init<>())
        .def("cap", &lp::host_cache::cap, py::arg("limit"));
    py::enum_<lp::host_use>(m, "HostUse", "why bytes come into host RAM")
        .value("PARK",         lp::host_use::park)
        .value("TRANSIT",      lp::host_use::transit)
        .value("PROMPT_READ",  lp::host_use::prompt_read)
        .value("PROMPT_AHEAD", lp::host_use::prompt_ahead);
    py::class_<py_host_ram>(m, "HostRam", "the one host budget as the server keeps it (policy/preempt-host-ram.h)")
        .def(py::init([](int64_t host_mib, int64_t park_mib, int64_t cache_mib, py::object cache) {
                 auto r = std::make_unique<py_host_ram>();
                 r->cache = cache;
                 lp::host_cache * c = cache.is_none() ? nullptr : cache.cast<lp::host_cache *>();
                 r->ram = lp::host_ram(lp::host_budget_from_mib(host_mib, park_mib, cache_mib), c, lp::return_free_pages);
                 return r;
             }),
             py::arg("host_kv_ram_mib"), py::arg("preempt_ram_mib"), py::arg("cache_ram_mib"), py::arg("cache") = py::none(),
             "the flags in MiB (-1 no limit; host -2: not given) and the cache that gives way (None: no prompt cache)")
        .def("reserve", [](py_host_ram & r, size_t parked, size_t ahead, size_t bytes, lp::host_use use) {
                 return r.ram.reserve(held_of(parked, ahead), bytes, use);
             }, py::arg("parked"), py::arg("ahead"), py::arg("bytes"), py::arg("use"),
             "room for `bytes` more of `use` beside `parked` and `ahead` bytes held: the cache gives way; "
             "whether they are within that use's share")
        .def("release", [](py_host_ram & r, size_t parked, size_t ahead) { r.ram.release(held_of(parked, ahead)); },
             py::arg("parked"), py::arg("ahead"))
        .def("settle", [](py_host_ram & r, size_t parked, size_t ahead) { r.ram.settle(held_of(parked, ahead)); },
             py::arg("parked"), py::arg("ahead"))
        .def("cache_room", [](const py_host_ram & r, size_t parked, size_t ahead, size_t extra) {
                 return r.ram.cache_room(held_of(parked, ahead), extra);
             }, py::arg("parked"), py::arg("ahead"), py::arg("extra") = 0)
        .def_property_readonly("n_trims", [](const py_host_ram & r) { return r.ram.n_trims(); },
                               "how many times the budget gave freed pages back to the system");

    py::enum_<lp::prompt_read_why>(m, "PromptReadWhy", "why a cached prompt's file is read back or its tokens prefilled")
        .value("NO_MATCH",        lp::prompt_read_why::no_match)
        .value("RAM_AS_GOOD",     lp::prompt_read_why::ram_as_good)
        .value("PREFILL_CHEAPER", lp::prompt_read_why::prefill_cheaper)
        .value("NO_ROOM",         lp::prompt_read_why::no_room)
        .value("READ_BACK",       lp::prompt_read_why::read_back)
        .value("STREAM_BACK",     lp::prompt_read_why::stream_back);
    py::class_<lp::prompt_read_choice>(m, "PromptReadChoice")
        .def(py::init<>())
        .def_readwrite("why",      &lp::prompt_read_choice::why)
        .def_readwrite("file",     &lp::prompt_read_choice::file)
        .def_readwrite("n_common", &lp::prompt_read_choice::n_common)
        .def_property_readonly("read", &lp::prompt_read_choice::read)
        .def_property_readonly("stream", &lp::prompt_read_choice::stream)
        .def("__repr__", [](const lp::prompt_read_choice & c) {
            return std::string("<PromptReadChoice ") + lp::prompt_read_why_name(c.why) + " file=" + std::to_string(c.file) +
                   " n_common=" + std::to_string(c.n_common) + ">";
        });
    m.def("match_prompt_file", [](const std::vector<py_file> & files, const std::vector<int32_t> & tokens) {
              const auto mt = lp::match_prompt_file(file_views(files), tokens);
              return std::make_tuple(mt.file, mt.n_common);
          }, py::arg("files"), py::arg("tokens"),
          "(file, n_common): the file (tokens, bytes, written) sharing the longest prefix, at least a quarter of its own");
    m.def("kept_cache_bytes", [](const std::string & dir) { return lp::kept_cache_bytes(dir); }, py::arg("dir"),
          "--cache-persist: bytes on disk of the files kept in DIR's cache directories (counted as free space by "
          "--preempt-disk-mib's default rule)");
    m.def("choose_prompt_read", [](const std::vector<py_file> & files, const std::vector<int32_t> & tokens,
                                   size_t n_ram_common, size_t host_room, const lp::cost_rates & rates, size_t stream_cells) {
              return lp::choose_prompt_read(file_views(files), tokens, n_ram_common, host_room, rates, stream_cells);
          }, py::arg("files"), py::arg("tokens"), py::arg("n_ram_common"), py::arg("host_room"), py::arg("rates"),
          py::arg("stream_cells") = SIZE_MAX,
          "the server's choice for a request: read its best prompt file back (into RAM, or streamed into the slot), or prefill (and why)");
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
