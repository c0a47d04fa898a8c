// llama_preempt._core, the choice's area: how one victim is parked (the measured rates, each tier's
// offer, the decision), what a parked slot needs to come back, the budgets and the flags' checks.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <functional>
#include <stdexcept>

#include "py-enums.h"
#include "preempt-config.h"
#include "preempt-flags.h"
#include "preempt-policy.h"
#include "preempt-step.h"

namespace py = pybind11;
namespace lp = llama_preempt;

namespace {

// one victim's options as choose_park() and tier_offers() take them; `extra_tiers` are offered
// beside the tiers every executor has
lp::park_options park_options_of(size_t bytes, int64_t n_tokens, size_t ram_left, size_t disk_left, bool waits_behind,
                                 const std::vector<lp::park_tier> & extra_tiers) {
    lp::park_options o;
    o.bytes        = bytes;
    o.n_tokens     = n_tokens;
    o.waits_behind = waits_behind;
    o.rooms.host_left = ram_left;
    o.rooms.set(lp::park_tier::ram, ram_left);
    o.rooms.set(lp::park_tier::disk, disk_left);
    for (lp::park_tier t : extra_tiers) {
        o.rooms.set(t, ram_left);  // an opt-in tier in host RAM (the compressed one) has the RAM's room
    }
    return o;
}

// a tier's own rate as a Python attribute of CostRates, read and written
std::function<double(const lp::cost_rates &)> own_get(lp::park_tier t, double lp::tier_rate::* field) {
    return [t, field](const lp::cost_rates & r) { return r.own(t).*field; };
}
std::function<void(lp::cost_rates &, double)> own_set(lp::park_tier t, double lp::tier_rate::* field) {
    return [t, field](lp::cost_rates & r, double v) { r.own(t).*field = v; };
}

// the offers a choice is made from, as dicts: tier, copies, fits, ms, rank_ms
py::list offers_list(const std::vector<lp::tier_offer> & offers) {
    py::list out;
    for (const auto & t : offers) {
        py::dict d;
        d["tier"]    = t.where;
        d["copies"]  = t.copies;
        d["fits"]    = t.fits;
        d["ms"]      = t.ms;
        d["rank_ms"] = t.rank_ms;
        out.append(d);
    }
    return out;
}

} // namespace

void register_choice(py::module_ & m) {
    // RAM, disk or RECOMPUTE: the choice the server and the simulator make for each victim
    py::class_<lp::cost_rates>(m, "CostRates", "the measured rates a park to RAM, to disk or by RECOMPUTE is priced with")
        .def(py::init<>())
        .def_readwrite("park_bps",       &lp::cost_rates::park_bps)
        .def_readwrite("restore_bps",    &lp::cost_rates::restore_bps)
        .def_readwrite("prefill_tps",    &lp::cost_rates::prefill_tps)
        // each tier's own rates (cost_rates::own()), under the names of what they measure
        .def_property("disk_write_bps", own_get(lp::park_tier::disk, &lp::tier_rate::out_bps), own_set(lp::park_tier::disk, &lp::tier_rate::out_bps))
        .def_property("disk_read_bps",  own_get(lp::park_tier::disk, &lp::tier_rate::in_bps),  own_set(lp::park_tier::disk, &lp::tier_rate::in_bps))
        .def_property("pack_bps",       own_get(lp::park_tier::ram_q8, &lp::tier_rate::out_bps), own_set(lp::park_tier::ram_q8, &lp::tier_rate::out_bps))
        .def_property("unpack_bps",     own_get(lp::park_tier::ram_q8, &lp::tier_rate::in_bps),  own_set(lp::park_tier::ram_q8, &lp::tier_rate::in_bps))
        .def_property("pack_ratio",     own_get(lp::park_tier::ram_q8, &lp::tier_rate::held_ratio), own_set(lp::park_tier::ram_q8, &lp::tier_rate::held_ratio))
        .def_readonly("n_park_samples",       &lp::cost_rates::n_park_samples)
        .def_readonly("n_restore_samples",    &lp::cost_rates::n_restore_samples)
        .def_readonly("n_prefill_samples",    &lp::cost_rates::n_prefill_samples)
        .def_property_readonly("n_disk_write_samples", [](const lp::cost_rates & r) { return r.own(lp::park_tier::disk).n_out_samples; })
        .def_property_readonly("n_disk_read_samples",  [](const lp::cost_rates & r) { return r.own(lp::park_tier::disk).n_in_samples; })
        .def("observe_park",       &lp::cost_rates::observe_park,       py::arg("bytes"), py::arg("t_us"))
        .def("observe_restore",    &lp::cost_rates::observe_restore,    py::arg("bytes"), py::arg("t_us"))
        .def("observe_prefill",    &lp::cost_rates::observe_prefill,    py::arg("n_tokens"), py::arg("t_us"))
        .def("observe_disk_write", [](lp::cost_rates & r, size_t bytes, int64_t t_us) { r.observe_out(lp::park_tier::disk, bytes, t_us); },
             py::arg("bytes"), py::arg("t_us"))
        .def("observe_disk_read",  [](lp::cost_rates & r, size_t bytes, int64_t t_us) { r.observe_in(lp::park_tier::disk, bytes, t_us); },
             py::arg("bytes"), py::arg("t_us"));

    py::class_<lp::park_decision>(m, "ParkDecision", "RAM, disk or RECOMPUTE for one victim, and why")
        .def_property_readonly("swap", [](const lp::park_decision & d) { return d.copies(); })  // copied out, to RAM or disk
        .def_property_readonly("disk", [](const lp::park_decision & d) { return d.tier == lp::park_tier::disk; })
        .def_readonly("why",  &lp::park_decision::why)
        .def_property_readonly("reason", [](const lp::park_decision & d) { return std::string(lp::choice_reason_name(d.reason)); })
        .def_readonly("tier", &lp::park_decision::tier)
        .def_property_readonly("offers", [](const lp::park_decision & d) { return offers_list(d.offers); })
        .def_property_readonly("predicted_ms", [](const lp::park_decision & d) { return d.quote_of(d.tier); })
        .def_property_readonly("swap_ms",      [](const lp::park_decision & d) { return d.quote_of(lp::park_tier::ram); })
        .def_property_readonly("disk_ms",      [](const lp::park_decision & d) { return d.quote_of(lp::park_tier::disk); })
        .def_property_readonly("recompute_ms", [](const lp::park_decision & d) { return d.quote_of(lp::park_tier::recompute); });

    m.def("choose_park", [](lp::preempt_mode pm, size_t bytes, int64_t n_tokens, size_t ram_left, const lp::cost_rates & rates,
                            size_t disk_left, bool waits_behind, const std::vector<lp::park_tier> & extra_tiers) {
              return lp::choose_park(pm, park_options_of(bytes, n_tokens, ram_left, disk_left, waits_behind, extra_tiers), rates);
          },
          py::arg("mode"), py::arg("bytes"), py::arg("n_tokens"), py::arg("ram_left"), py::arg("rates"),
          py::arg("disk_left") = 0, py::arg("waits_behind") = false, py::arg("extra_tiers") = std::vector<lp::park_tier>{},
          "the server's choice for one victim: `bytes` of state (0: cannot swap), `n_tokens` to re-prefill, "
          "`ram_left` and `disk_left` (0: no disk tier) bytes free, `waits_behind`: another parked slot comes back first, "
          "`extra_tiers`: opt-in tiers the executor has beside RAM, disk and RECOMPUTE (ParkTier.RAM_Q8)");
    m.def("tier_offers", [](size_t bytes, int64_t n_tokens, size_t ram_left, const lp::cost_rates & rates,
                            size_t disk_left, bool waits_behind, const std::vector<lp::park_tier> & extra_tiers) {
              return offers_list(lp::tier_offers(park_options_of(bytes, n_tokens, ram_left, disk_left, waits_behind, extra_tiers), rates));
          },
          py::arg("bytes"), py::arg("n_tokens"), py::arg("ram_left"), py::arg("rates"),
          py::arg("disk_left") = 0, py::arg("waits_behind") = false, py::arg("extra_tiers") = std::vector<lp::park_tier>{},
          "the tiers choose_park() picks from, in tier order: each one's room check, quote and rank in ms");
    m.def("waits_behind_parked", &lp::waits_behind_parked, py::arg("slots"), py::arg("victim"),
          "whether the victim, once parked, comes back after another parked slot (its file can be read ahead)");

    // which slot may be parked, and what a parked slot needs to come back: the decisions the
    // server's mechanics and the simulator both ask the policy for
    m.def("park_blocker", [](const lp::slot_view & s) { return std::string(lp::park_block_reason(lp::park_blocker(s))); },
          py::arg("slot"), "why the slot may never be parked, \"\" when it may");
    m.def("may_park", &lp::may_park, py::arg("slot"));
    py::enum_<lp::parked_from>(m, "ParkedFrom")
        .value("NONE",       lp::parked_from::none)
        .value("STARTED",    lp::parked_from::started)
        .value("PROMPT",     lp::parked_from::prompt)
        .value("GENERATING", lp::parked_from::generating);
    py::class_<lp::park_input>(m, "ParkInput", "a victim at the moment it is parked")
        .def(py::init([](lp::parked_from at, bool replaying, int32_t n_held, int32_t n_prompt, int32_t n_replay) {
                 return lp::park_input{ at, replaying, n_held, n_prompt, n_replay };
             }),
             py::arg("at"), py::arg("replaying") = false, py::arg("n_held") = 0, py::arg("n_prompt") = 0, py::arg("n_replay") = 0)
        .def_readwrite("at",        &lp::park_input::at)
        .def_readwrite("replaying", &lp::park_input::replaying)
        .def_readwrite("n_held",    &lp::park_input::n_held)
        .def_readwrite("n_prompt",  &lp::park_input::n_prompt)
        .def_readwrite("n_replay",  &lp::park_input::n_replay);
    py::class_<lp::park_shape>(m, "ParkShape", "where a parked slot's resume re-enters and the cells it needs")
        .def_readonly("from_", &lp::park_shape::from)
        .def_readonly("n_restore", &lp::park_shape::n_restore)
        .def_readonly("n_redo", &lp::park_shape::n_redo);
    m.def("has_swap_state", &lp::has_swap_state, py::arg("victim"));
    m.def("shape_park", &lp::shape_park, py::arg("victim"), py::arg("swap"), py::arg("n_batch"));
    m.def("effective_mode", [](lp::preempt_mode pm, int64_t ram_mib, int64_t disk_mib) {
              const size_t disk = disk_mib == 0 ? 0 : lp::ram_budget_from_mib(disk_mib);
              return lp::effective_mode(pm, lp::ram_budget_from_mib(ram_mib), disk);
          }, py::arg("mode"), py::arg("preempt_ram_mib"), py::arg("preempt_disk_mib") = 0,
          "the mode a victim is parked by, with this --preempt-ram and disk tier (0: none, -1: the disk's free space)");
    m.def("ram_left", &lp::ram_left, py::arg("ram_budget"), py::arg("held"));
    m.def("ram_budget_from_mib", &lp::ram_budget_from_mib, py::arg("mib"));
    // the flags' own checks (preempt-flags.h): a ValueError with llama-server's words
    m.def("parse_preempt_ram_mib", &lp::parse_preempt_ram_mib, py::arg("value"),
          "--preempt-ram as llama-server parses it (-1, 0 or MiB); ValueError with its message otherwise");
    m.def("parse_host_kv_ram_mib", &lp::parse_host_kv_ram_mib, py::arg("value"),
          "--host-kv-ram as llama-server parses it (-1 or MiB); ValueError with its message otherwise");
    m.def("parse_preempt_disk_mib", &lp::parse_preempt_disk_mib, py::arg("value"),
          "--preempt-disk-mib as llama-server parses it (-1 or MiB); ValueError with its message otherwise");
    m.def("parse_preempt_sched", [](const std::string & value) { return lp::sched_from_flag(lp::parse_preempt_sched(value)); },
          py::arg("value"),
          "--preempt-sched KEY=N,... as llama-server reads it: the planner's SchedParams (defaults where a key is "
          "left out); ValueError with its message otherwise");
    m.def("parse_preempt_mode", [](const std::string & value) {
              return std::string(lp::preempt_mode_flag_name(lp::parse_preempt_mode_flag(value)));
          }, py::arg("value"),
          "--preempt-mode as llama-server parses it; ValueError with its message otherwise");
    m.def("parse_preempt_compress", &lp::parse_preempt_compress, py::arg("value"),
          "--preempt-compress as llama-server parses it: whether the compressed tier is on; ValueError with its message otherwise");
}
