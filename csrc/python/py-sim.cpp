// llama_preempt._core: the simulator (sim/preempt-sim.h) and its typed results, which report in
// the policy's enums (py-enums.h), not tuples or strings.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <map>
#include <string>
#include <vector>

#include "preempt-policy.h"
#include "preempt-fleet.h"
#include "py-enums.h"

namespace py = pybind11;
namespace lp = llama_preempt;

namespace {

// the simulator's requests from the columns Python passes (the chat columns may be empty: no chats)
std::vector<lp::sim_request> sim_requests(const std::vector<double> & t_arrival, const std::vector<int32_t> & n_prompt,
                                          const std::vector<int32_t> & n_gen, const std::vector<int32_t> & conversation = {},
                                          const std::vector<int32_t> & n_shared = {}, const std::vector<int32_t> & after = {}) {
    const size_t n = t_arrival.size();
    if (n_prompt.size() != n || n_gen.size() != n) {
        throw py::value_error("t_arrival, n_prompt and n_gen must have the same length");
    }
    for (const auto * col : { &conversation, &n_shared, &after }) {
        if (!col->empty() && col->size() != n) {
            throw py::value_error("conversation, n_shared and after must be empty or as long as t_arrival");
        }
    }
    std::vector<lp::sim_request> reqs(n);
    for (size_t i = 0; i < n; ++i) {
        if (n_prompt[i] < 1 || n_gen[i] < 1) {
            throw py::value_error("every request needs at least one prompt token and one generated token");
        }
        reqs[i] = { t_arrival[i], n_prompt[i], n_gen[i] };
        if (!conversation.empty()) {
            reqs[i].conversation = conversation[i];
        }
        if (!n_shared.empty()) {
            if (n_shared[i] < 0) {
                throw py::value_error("n_shared must be >= 0 (request " + std::to_string(i) + ")");
            }
            reqs[i].n_shared = n_shared[i];
        }
        if (!after.empty()) {
            if (after[i] >= (int32_t) i) {
                throw py::value_error("after must name an earlier request, or be -1 (request " + std::to_string(i) + ")");
            }
            reqs[i].after = after[i];
        }
    }
    return reqs;
}

} // namespace

void register_sim(py::module_ & m) {
    py::class_<lp::sim_request_result>(m, "SimRequestResult", "one simulated request: times in seconds since the start")
        .def_readonly("outcome",    &lp::sim_request_result::outcome)
        .def_readonly("t_start",    &lp::sim_request_result::t_start, "admitted into a slot (-1: never)")
        .def_readonly("t_first",    &lp::sim_request_result::t_first, "first token (-1: never)")
        .def_readonly("t_done",     &lp::sim_request_result::t_done)
        .def_readonly("n_preempt",  &lp::sim_request_result::n_preempt)
        .def_readonly("t_parked_s", &lp::sim_request_result::t_parked_s)
        .def_readonly("t_second",   &lp::sim_request_result::t_second, "second token (-1: never)")
        .def_readonly("max_gap_s",  &lp::sim_request_result::max_gap_s, "the longest wait between two of its tokens")
        .def_readonly("t_arrival",  &lp::sim_request_result::t_arrival, "when it arrived (a follower: its leader's end and pause)")
        .def_readonly("n_prompt_cached", &lp::sim_request_result::n_prompt_cached,
                      "prompt tokens it did not compute (the server's tokens_cached)")
        .def_property_readonly("cached_from", [](const lp::sim_request_result & r) {
            return std::string(lp::sim_prompt_source_name(r.cached_from));
        }, "where those came from: none, slot, ram or disk");

    py::class_<lp::sim_decision>(m, "SimDecision", "one decision of the simulated server's policy")
        .def_readonly("step",    &lp::sim_decision::step)
        .def_readonly("kind",    &lp::sim_decision::kind)
        .def_readonly("request", &lp::sim_decision::request, "the request its slot served (arrival order)")
        .def_readonly("tier",    &lp::sim_decision::tier, "park: where its state went; resume: where it came back from")
        .def_readonly("reason",  &lp::sim_decision::reason)
        .def_readonly("why",     &lp::sim_decision::why)
        .def_readonly("n_held",  &lp::sim_decision::n_held, "park: the tokens it held")
        .def_readonly("bytes",   &lp::sim_decision::bytes, "park: its state copied out (0: RECOMPUTE)")
        .def("__repr__", [](const lp::sim_decision & d) {
            const char * kind = d.kind == lp::decision_kind::park ? "park" : d.kind == lp::decision_kind::resume ? "resume" : "fail";
            return std::string("<SimDecision step ") + std::to_string(d.step) + " " + kind + " request " +
                   std::to_string(d.request) + " " + lp::park_tier_name(d.tier) +
                   (d.kind == lp::decision_kind::park ? std::string(" ") + lp::park_reason_key(d.reason) + " " + lp::park_choice_name(d.why) : "") + ">";
        });

    py::class_<lp::sim_params>(m, "SimParams", "the simulated server: pool, slots, budget and per-token costs")
        .def(py::init<>())
        .def_readwrite("n_pool",           &lp::sim_params::n_pool)
        .def_readwrite("n_slots",          &lp::sim_params::n_slots)
        .def_readwrite("n_batch",          &lp::sim_params::n_batch)
        .def_readwrite("preempt",          &lp::sim_params::preempt)
        .def_readwrite("kv_unified",       &lp::sim_params::kv_unified, "false: a static split (each slot's attention spans its own cells)")
        .def_readwrite("attn_own_cells",   &lp::sim_params::attn_own_cells,
                       "a unified pool's attention walks each slot's own cells (--attn-own-cells); false: it spans the pool's used cells")
        .def_readwrite("preempt_ram_mib", &lp::sim_params::preempt_ram_mib)
        .def_readwrite("host_kv_ram_mib", &lp::sim_params::host_kv_ram_mib)
        .def_readwrite("cache_ram_mib",   &lp::sim_params::cache_ram_mib, "--cache-ram: upstream's RAM prompt cache (0: none)")
        .def_readwrite("slot_prompt_similarity", &lp::sim_params::slot_prompt_similarity)
        .def_readwrite("mode",             &lp::sim_params::mode, "--preempt-mode: a PreemptMode or its name (auto, swap, recompute)")
        .def_readwrite("sched",            &lp::sim_params::sched, "how the planner shares an overloaded pool (SchedParams)")
        .def_readwrite("cost",             &lp::sim_params::cost, "what a simulated step costs (StepCost)")
        .def_readwrite("bytes_per_cell",   &lp::sim_params::bytes_per_cell)
        .def_readwrite("state_overhead_bytes", &lp::sim_params::state_overhead_bytes)
        .def_readwrite("swap_out_bps",     &lp::sim_params::swap_out_bps)
        .def_readwrite("swap_in_bps",      &lp::sim_params::swap_in_bps)
        .def_readwrite("preempt_disk_mib", &lp::sim_params::preempt_disk_mib)
        .def_readwrite("disk_write_bps",   &lp::sim_params::disk_write_bps)
        .def_readwrite("disk_read_bps",    &lp::sim_params::disk_read_bps)
        .def_readwrite("compress_q8",      &lp::sim_params::compress_q8)
        .def_readwrite("pack_bps",         &lp::sim_params::pack_bps)
        .def_readwrite("unpack_bps",       &lp::sim_params::unpack_bps)
        .def_readwrite("pack_ratio",       &lp::sim_params::pack_ratio)
        .def_readwrite("max_steps",        &lp::sim_params::max_steps);

    py::class_<lp::sim_result>(m, "SimResult", "what a simulated run did")
        .def_readonly("n_steps",            &lp::sim_result::n_steps)
        .def_readonly("n_park_swap",        &lp::sim_result::n_park_swap)
        .def_readonly("n_park_recompute",   &lp::sim_result::n_park_recompute)
        .def_readonly("n_park_disk",        &lp::sim_result::n_park_disk)
        .def_readonly("n_park_ram_q8",      &lp::sim_result::n_park_ram_q8)
        .def_readonly("peak_disk_bytes",    &lp::sim_result::peak_disk_bytes)
        .def_property_readonly("parks_by_choice", [](const lp::sim_result & r) {
            std::map<std::string, int64_t> out;
            for (int i = 0; i < lp::N_PARK_CHOICES; ++i) {
                out[lp::park_choice_name((lp::park_choice) i)] = r.parks_by_choice[i];
            }
            return out;
        })
        .def_readonly("n_resume",           &lp::sim_result::n_resume)
        .def_readonly("n_recompute_tokens", &lp::sim_result::n_recompute_tokens)
        .def_readonly("n_tokens_generated", &lp::sim_result::n_tokens_generated)
        .def_readonly("peak_parked_bytes",  &lp::sim_result::peak_parked_bytes)
        .def_readonly("peak_cells",         &lp::sim_result::peak_cells)
        .def_readonly("makespan_s",         &lp::sim_result::makespan_s)
        .def_readonly("hit_step_limit",     &lp::sim_result::hit_step_limit)
        .def_property_readonly("mean_decode_width", [](const lp::sim_result & r) {
            return r.n_width_steps ? (double) r.sum_decode_width / r.n_width_steps : 0.0;
        }, "the decode width the planner chose, averaged over the steps where a slot generated")
        .def_readonly("max_decode_width",   &lp::sim_result::max_decode_width)
        .def_readonly("n_prompt_tokens_computed", &lp::sim_result::n_prompt_tokens_computed)
        .def_readonly("n_prompt_cache_ram_hits",  &lp::sim_result::n_prompt_cache_ram_hits)
        .def_readonly("n_prompt_cache_disk_hits", &lp::sim_result::n_prompt_cache_disk_hits)
        .def_readonly("n_prompt_cache_spilled",   &lp::sim_result::n_prompt_cache_spilled)
        .def_readonly("n_prompt_cache_evicted",   &lp::sim_result::n_prompt_cache_evicted)
        .def_readonly("n_prompt_cache_read_ahead", &lp::sim_result::n_prompt_cache_read_ahead)
        .def_readonly("n_prompt_cache_disk_skipped", &lp::sim_result::n_prompt_cache_disk_skipped)
        .def_readonly("n_prompt_cache_streamed", &lp::sim_result::n_prompt_cache_streamed)
        .def_readonly("n_prompt_cache_streamed_back", &lp::sim_result::n_prompt_cache_streamed_back)
        .def_readonly("peak_cache_bytes",         &lp::sim_result::peak_cache_bytes)
        .def_readonly("requests",           &lp::sim_result::requests, "a SimRequestResult per request, in the order they arrived")
        .def_readonly("trace",              &lp::sim_result::trace,
                      "every park, resume and failure of a parked request, in order: the decision trace");

    py::class_<lp::sim_fleet_result>(m, "SimFleetResult", "what a simulated fleet of servers did")
        .def_readonly("servers",   &lp::sim_fleet_result::servers,
                      "a SimResult per server, its requests in the caller's order among them")
        .def_readonly("server_of", &lp::sim_fleet_result::server_of, "per request: the server it went to")
        .def_readonly("requests",  &lp::sim_fleet_result::requests, "every request's SimRequestResult, in the caller's order")
        .def("parked_seen", [](const lp::sim_fleet_result & r) {
            const size_t n_srv = r.servers.size();
            std::vector<std::vector<int32_t>> out(r.server_of.size());
            for (size_t i = 0; i < out.size(); ++i) {
                out[i].assign(r.parked_seen.begin() + i * n_srv, r.parked_seen.begin() + (i + 1) * n_srv);
            }
            return out;
        }, "per request: each server's parked requests when the router placed it");

    m.def("simulate", [](const std::vector<double> & t_arrival, const std::vector<int32_t> & n_prompt,
                         const std::vector<int32_t> & n_gen, const lp::sim_params & params,
                         const std::vector<int32_t> & conversation, const std::vector<int32_t> & n_shared,
                         const std::vector<int32_t> & after) {
              const auto reqs = sim_requests(t_arrival, n_prompt, n_gen, conversation, n_shared, after);
              py::gil_scoped_release nogil;
              return lp::simulate(reqs, params);
          },
          py::arg("t_arrival"), py::arg("n_prompt"), py::arg("n_gen"), py::arg("params"),
          py::arg("conversation") = std::vector<int32_t>{}, py::arg("n_shared") = std::vector<int32_t>{},
          py::arg("after") = std::vector<int32_t>{},
          "run the server loop in simulation with the server's own planner; a multi-turn chat's requests name "
          "their conversation, the tokens every prompt shares, and the request each follows (-1: none)");

    m.def("simulate_fleet", [](const std::vector<double> & t_arrival, const std::vector<int32_t> & n_prompt,
                               const std::vector<int32_t> & n_gen, const lp::sim_params & params, int32_t n_servers,
                               const std::string & route, const std::vector<int32_t> & conversation,
                               const std::vector<int32_t> & n_shared, const std::vector<int32_t> & after) {
              const auto reqs = sim_requests(t_arrival, n_prompt, n_gen, conversation, n_shared, after);
              if (n_servers < 1) {
                  throw py::value_error("n_servers must be at least 1");
              }
              lp::sim_route how;
              if (!lp::parse_sim_route(route, how)) {
                  throw py::value_error("route must be round-robin or least-parked, got '" + route + "'");
              }
              py::gil_scoped_release nogil;
              return lp::simulate_fleet(reqs, params, n_servers, how);
          },
          py::arg("t_arrival"), py::arg("n_prompt"), py::arg("n_gen"), py::arg("params"), py::arg("n_servers"),
          py::arg("route") = "round-robin", py::arg("conversation") = std::vector<int32_t>{},
          py::arg("n_shared") = std::vector<int32_t>{}, py::arg("after") = std::vector<int32_t>{},
          "run the workload through n_servers simulated servers, each arrival placed by the route");
}
