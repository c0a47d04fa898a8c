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

namespace {

// one victim's options as choose_park() and tier_offers() take them; `extra_tiers` are offered
// beside the tiers every executor has
lp::park_options park_options_of(size_t bytes, int64_t n_tokens, size_t ram_left, size_t disk_left, bool waits_behind,
                                 const std::vector<lp::park_tier> & extra_tiers) {
    lp::park_options o;
    o.bytes        = bytes;
    o.n_tokens     = n_tokens;
    o.ram_left     = ram_left;
    o.disk_left    = disk_left;
    o.waits_behind = waits_behind;
    for (lp::park_tier t : extra_tiers) {
        o.offered |= lp::tier_bit(t);
    }
    return o;
}

} // namespace

PYBIND11_MODULE(_core, m) {
    m.doc() = "llama-preempt compiled core: the preemption policy shared with llama-server";

    register_events(m);
    register_engine(m);
    register_sim(m);
    register_memory(m);
    register_model(m);

    m.def("version", &lp::version, "llama-preempt version compiled into this module");
    m.def("version_line", &lp::version_line, "the identity line llama-server prints at start");

    m.attr("PREEMPT_N_STARVED") = lp::PREEMPT_N_STARVED;
    m.attr("PREEMPT_MARGIN")    = lp::PREEMPT_MARGIN;

    py::enum_<lp::slot_phase>(m, "SlotPhase")
        .value("IDLE",       lp::slot_phase::idle)
        .value("WAITING",    lp::slot_phase::waiting)
        .value("PROMPT",     lp::slot_phase::prompt)
        .value("GENERATING", lp::slot_phase::generating)
        .value("PARKED",     lp::slot_phase::parked);

    py::class_<lp::slot_view>(m, "SlotView", "what the policy sees of one slot at a token boundary")
        .def(py::init<>())
        .def(py::init([](int32_t id, lp::slot_phase phase, py::kwargs kw) {
                 lp::slot_view s;
                 s.id = id;
                 s.phase = phase;
                 py::object self = py::cast(s);
                 for (auto item : kw) {
                     const auto key = py::str(item.first).cast<std::string>();
                     if (!py::hasattr(self, key.c_str())) {
                         throw py::type_error("SlotView has no field '" + key + "'");
                     }
                     self.attr(key.c_str()) = item.second;
                 }
                 return self.cast<lp::slot_view>();
             }),
             py::arg("id"), py::arg("phase"))
        .def_readwrite("id",            &lp::slot_view::id)
        .def_readwrite("phase",         &lp::slot_view::phase)
        .def_readwrite("n_cells",       &lp::slot_view::n_cells)
        .def_readwrite("n_shared",      &lp::slot_view::n_shared)
        .def_readwrite("n_draft",       &lp::slot_view::n_draft)
        .def_readwrite("n_prompt_left", &lp::slot_view::n_prompt_left)
        .def_readwrite("n_replay_left", &lp::slot_view::n_replay_left)
        .def_readwrite("is_new",        &lp::slot_view::is_new)
        .def_readwrite("n_restore",     &lp::slot_view::n_restore)
        .def_readwrite("t_parked_us",   &lp::slot_view::t_parked_us)
        .def_readwrite("can_resume",    &lp::slot_view::can_resume)
        .def_readwrite("waits_for_unpark", &lp::slot_view::waits_for_unpark)
        .def_readwrite("priority",      &lp::slot_view::priority)
        .def_readwrite("arrival",       &lp::slot_view::arrival)
        .def_readwrite("t_arrival_us",  &lp::slot_view::t_arrival_us)
        .def_readwrite("n_gen_left",    &lp::slot_view::n_gen_left)
        .def_readwrite("n_preempt",     &lp::slot_view::n_preempt)
        .def_readwrite("in_family",     &lp::slot_view::in_family)
        .def_readwrite("is_multimodal", &lp::slot_view::is_multimodal)
        .def_readwrite("can_park",      &lp::slot_view::can_park)
        .def_readwrite("t_last_token_us", &lp::slot_view::t_last_token_us)
        .def_readwrite("was_generating", &lp::slot_view::was_generating)
        .def("__repr__", [](const lp::slot_view & s) {
            return "<SlotView id=" + std::to_string(s.id) + " phase=" + std::to_string((int) s.phase) +
                   " n_cells=" + std::to_string(s.n_cells) + " n_preempt=" + std::to_string(s.n_preempt) + ">";
        });

    py::class_<lp::sched_params>(m, "SchedParams", "how the planner shares an overloaded pool (the --preempt-* "
                                 "scheduling flags; the simulator sweeps them)")
        .def(py::init<>())
        .def_readwrite("n_starved",          &lp::sched_params::n_starved, "a slot parked this often is spared as a victim")
        .def_readwrite("age_step_us",        &lp::sched_params::age_step_us, "aging: one priority level per this much waiting")
        .def_readwrite("n_prompt_budget",    &lp::sched_params::n_prompt_budget,
                       "prompt tokens a step adds while a slot generates (0: n_batch)")
        .def_readwrite("n_restore_headroom", &lp::sched_params::n_restore_headroom,
                       "thrash guard: cells per running slot a resume leaves free")
        .def_readwrite("n_near_finish",      &lp::sched_params::n_near_finish,
                       "a slot with at most this many tokens left is spared as a victim")
        .def_readwrite("pass_limit_us",      &lp::sched_params::pass_limit_us,
                       "a new request that does not fit may be passed by later ones this long (0: never)")
        .def_readwrite("width_loss",         &lp::sched_params::width_loss,
                       "the decode width may give up this share of the best width's throughput (0: every slot decodes)")
        .def_readwrite("n_width",            &lp::sched_params::n_width, "slots that decode at once, fixed (0: by the step cost)")
        .def_readwrite("max_gap_us",         &lp::sched_params::max_gap_us,
                       "a paused slot decodes a token at least this often (0: no bound)")
        .def("__repr__", [](const lp::sched_params & s) {
            return "SchedParams(n_starved=" + std::to_string(s.n_starved) + ", age_step_us=" + std::to_string(s.age_step_us) +
                   ", n_prompt_budget=" + std::to_string(s.n_prompt_budget) + ", n_restore_headroom=" +
                   std::to_string(s.n_restore_headroom) + ", n_near_finish=" + std::to_string(s.n_near_finish) +
                   ", pass_limit_us=" + std::to_string(s.pass_limit_us) + ", width_loss=" + std::to_string(s.width_loss) +
                   ", n_width=" + std::to_string(s.n_width) + ", max_gap_us=" + std::to_string(s.max_gap_us) + ")";
        });

    py::class_<lp::step_shape>(m, "StepShape", "one step's batch as its cost depends on it")
        .def(py::init([](int32_t n_decode, int32_t n_prompt, int64_t n_attended, int64_t n_spanned) {
                 return lp::step_shape{ n_decode, n_prompt, n_attended, n_spanned };
             }),
             py::arg("n_decode") = 0, py::arg("n_prompt") = 0, py::arg("n_attended") = 0, py::arg("n_spanned") = 0)
        .def_readwrite("n_decode",   &lp::step_shape::n_decode)
        .def_readwrite("n_prompt",   &lp::step_shape::n_prompt)
        .def_readwrite("n_attended", &lp::step_shape::n_attended, "cells its tokens attend, summed over them")
        .def_readwrite("n_spanned",  &lp::step_shape::n_spanned,
                       "cells the attention spans for its tokens, summed over them (a unified pool: its used cells per token)");

    py::class_<lp::step_cost>(m, "StepCost", "what one step costs, in seconds: fixed, per generated and per prompt "
                              "token, per cell attended")
        .def(py::init([](py::kwargs kw) {
                 py::object self = py::cast(lp::step_cost{});
                 for (auto item : kw) {
                     const auto key = py::str(item.first).cast<std::string>();
                     if (!py::hasattr(self, key.c_str())) {
                         throw py::type_error("StepCost has no field '" + key + "'");
                     }
                     self.attr(key.c_str()) = item.second;
                 }
                 return self.cast<lp::step_cost>();
             }))
        .def_readwrite("fixed_s",        &lp::step_cost::fixed_s)
        .def_readwrite("decode_token_s", &lp::step_cost::decode_token_s)
        .def_readwrite("prompt_token_s", &lp::step_cost::prompt_token_s)
        .def_readwrite("attend_cell_s",  &lp::step_cost::attend_cell_s)
        .def_readwrite("span_cell_s",    &lp::step_cost::span_cell_s)
        .def("seconds", &lp::step_cost::seconds, py::arg("shape"))
        .def("__repr__", [](const lp::step_cost & c) {
            char buf[240];
            snprintf(buf, sizeof(buf), "StepCost(fixed_s=%.6g, decode_token_s=%.6g, prompt_token_s=%.6g, attend_cell_s=%.6g, "
                     "span_cell_s=%.6g)", c.fixed_s, c.decode_token_s, c.prompt_token_s, c.attend_cell_s, c.span_cell_s);
            return std::string(buf);
        });

    py::class_<lp::step_cost_fit>(m, "StepCostFit", "the step cost fitted online from measured steps (the server's own)")
        .def(py::init<const lp::step_cost &>(), py::arg("prior") = lp::step_cost{})
        .def("observe", &lp::step_cost_fit::observe, py::arg("shape"), py::arg("t_s"))
        .def("cost", &lp::step_cost_fit::cost)
        .def_property_readonly("n_samples", &lp::step_cost_fit::n_samples)
        .def_property_readonly("ready", &lp::step_cost_fit::ready);
    m.attr("STEP_COST_N_READY") = lp::step_cost_fit::N_READY;

    py::class_<lp::width_guard>(m, "WidthGuard", "the decode width rule's live check against every slot decoding")
        .def(py::init<>())
        .def("observe", &lp::width_guard::observe, py::arg("n_decode"), py::arg("t_s"), py::arg("limited"), py::arg("loss"),
             "one step: its decoded tokens, the loop's time it took, whether its width was limited, the width-loss allowed")
        .def("allow_limit", &lp::width_guard::allow_limit, "may this step's width be limited (not while probing or holding off)")
        .def_property_readonly("n_probes", &lp::width_guard::n_probes)
        .def_property_readonly("n_fallbacks", &lp::width_guard::n_fallbacks)
        .def_property_readonly("last_limited_tps", &lp::width_guard::last_limited_tps)
        .def_property_readonly("last_full_tps", &lp::width_guard::last_full_tps);
    m.attr("WIDTH_PROBE_EVERY") = lp::width_guard::PROBE_EVERY;
    m.attr("WIDTH_WINDOW")      = lp::width_guard::WINDOW;
    m.attr("WIDTH_HOLD")        = lp::width_guard::HOLD;

    m.def("decode_width", &lp::decode_width, py::arg("fixed_s"), py::arg("u"), py::arg("loss"),
          "how many of the generating slots (their marginal costs `u`, oldest first) decode at once");
    m.def("decode_slot_cost", &lp::decode_slot_cost, py::arg("cost"), py::arg("n_cells"), py::arg("n_tokens") = 1,
          py::arg("n_span") = 0, "the marginal cost of one more decoding slot holding n_cells (n_span: the cells each "
          "token's attention spans, the pool's used cells in a unified pool)");
    m.def("decode_order", &lp::decode_order, py::arg("slots"), py::arg("params"), py::arg("parked") = false,
          "generating slot ids in the order they get a decode seat");

    py::class_<lp::plan_params>(m, "PlanParams", "pool size and knobs of the planner")
        .def(py::init([](int32_t n_pool, int32_t n_batch, int32_t margin, int32_t n_starved, bool park, int64_t t_now_us,
                         const lp::sched_params * sched) {
                 if (n_pool <= 0) {
                     throw py::value_error("n_pool must be positive");
                 }
                 lp::plan_params p;
                 p.n_pool   = n_pool;
                 p.n_batch  = n_batch;
                 p.margin   = margin;
                 p.park     = park;
                 p.t_now_us = t_now_us;
                 if (sched) {
                     p.sched = *sched;
                 }
                 if (n_starved >= 0) {
                     p.sched.n_starved = n_starved;
                 }
                 return p;
             }),
             py::arg("n_pool"), py::arg("n_batch") = 512, py::arg("margin") = lp::PREEMPT_MARGIN,
             py::arg("n_starved") = -1, py::arg("park") = true, py::arg("t_now_us") = 0, py::arg("sched") = nullptr)
        .def_readwrite("n_pool",    &lp::plan_params::n_pool)
        .def_readwrite("n_batch",   &lp::plan_params::n_batch)
        .def_readwrite("margin",    &lp::plan_params::margin)
        .def_property("n_starved", [](const lp::plan_params & p) { return p.sched.n_starved; },
                      [](lp::plan_params & p, int32_t v) { p.sched.n_starved = v; })
        .def_readwrite("park",      &lp::plan_params::park)
        .def_readwrite("t_now_us",  &lp::plan_params::t_now_us)
        .def_readwrite("sched",     &lp::plan_params::sched)
        .def_readwrite("cost",      &lp::plan_params::cost, "the fitted step cost the width is chosen by")
        .def_readwrite("cost_ready", &lp::plan_params::cost_ready, "the width is limited only when the fit is ready")
        .def_readwrite("width_free", &lp::plan_params::width_free,
                       "the width guard holds the limit off: every generating slot decodes")
        .def_readwrite("unified",   &lp::plan_params::unified,
                       "one stream for every slot: a token's attention spans the pool's used cells (the span cost)")
        .def_readwrite("park_to_admit", &lp::plan_params::park_to_admit,
                       "a paused slot may be parked to let a new request's prompt in");

    py::class_<lp::plan>(m, "Plan", "one step's decisions")
        .def_readonly("purge",  &lp::plan::purge)
        .def_readonly("fail",   &lp::plan::fail)
        .def_readonly("park",   &lp::plan::park)
        .def_readonly("resume", &lp::plan::resume)
        .def_readonly("hold",   &lp::plan::hold)
        .def_readonly("n_used", &lp::plan::n_used)
        .def_readonly("n_need", &lp::plan::n_need)
        .def_readonly("restore_next", &lp::plan::restore_next)
        .def_readonly("n_prompt_budget", &lp::plan::n_prompt_budget)
        .def_readonly("pause",  &lp::plan::pause)
        .def_readonly("n_decode_width", &lp::plan::n_decode_width)
        .def("has_action", &lp::plan::has_action)
        .def("__repr__", [](const lp::plan & pl) { return "<Plan " + lp::plan_to_string(pl) + ">"; });

    m.def("plan_step", &lp::plan_step, py::arg("slots"), py::arg("params"),
          "run the planner over slot snapshots; returns the step's Plan");
    m.def("select_victim", &lp::select_victim, py::arg("slots"), py::arg("params"),
          py::arg("skip") = std::vector<int32_t>{}, "the slot to park next, or -1");
    m.def("restore_order", &lp::restore_order, py::arg("slots"), py::arg("params") = lp::plan_params{},
          "parked slot ids in the order they are considered for restore");
    m.def("reservation", &lp::reservation, py::arg("slot"), py::arg("params"),
          "cells the slot's next step adds to the pool");
    m.def("time_plan_step", [](const std::vector<lp::slot_view> & slots, const lp::plan_params & params, int64_t n) {
              // the planner's own cost per call, without Python in the loop (bench/cells.py)
              py::gil_scoped_release nogil;
              size_t sink = 0;
              const auto t0 = std::chrono::steady_clock::now();
              for (int64_t i = 0; i < n; ++i) {
                  sink += lp::plan_step(slots, params).park.size();
              }
              const auto t1 = std::chrono::steady_clock::now();
              (void) sink;
              return std::chrono::duration<double, std::micro>(t1 - t0).count() / std::max<int64_t>(1, n);
          },
          py::arg("slots"), py::arg("params"), py::arg("n") = 1000, "microseconds per plan_step call, timed in C++");

    // RAM, disk or RECOMPUTE: the choice the server and the simulator make for each victim
    py::class_<lp::cost_rates>(m, "CostRates", "the measured rates a park to RAM, to disk or by RECOMPUTE is priced with")
        .def(py::init<>())
        .def_readwrite("park_bps",       &lp::cost_rates::park_bps)
        .def_readwrite("restore_bps",    &lp::cost_rates::restore_bps)
        .def_readwrite("prefill_tps",    &lp::cost_rates::prefill_tps)
        .def_readwrite("disk_write_bps", &lp::cost_rates::disk_write_bps)
        .def_readwrite("disk_read_bps",  &lp::cost_rates::disk_read_bps)
        .def_readonly("n_park_samples",       &lp::cost_rates::n_park_samples)
        .def_readonly("n_restore_samples",    &lp::cost_rates::n_restore_samples)
        .def_readonly("n_prefill_samples",    &lp::cost_rates::n_prefill_samples)
        .def_readonly("n_disk_write_samples", &lp::cost_rates::n_disk_write_samples)
        .def_readonly("n_disk_read_samples",  &lp::cost_rates::n_disk_read_samples)
        .def("observe_park",       &lp::cost_rates::observe_park,       py::arg("bytes"), py::arg("t_us"))
        .def("observe_restore",    &lp::cost_rates::observe_restore,    py::arg("bytes"), py::arg("t_us"))
        .def("observe_prefill",    &lp::cost_rates::observe_prefill,    py::arg("n_tokens"), py::arg("t_us"))
        .def("observe_disk_write", &lp::cost_rates::observe_disk_write, py::arg("bytes"), py::arg("t_us"))
        .def("observe_disk_read",  &lp::cost_rates::observe_disk_read,  py::arg("bytes"), py::arg("t_us"));

    py::class_<lp::park_decision>(m, "ParkDecision", "RAM, disk or RECOMPUTE for one victim, and why")
        .def_property_readonly("swap", [](const lp::park_decision & d) { return d.copies(); })  // copied out, to RAM or disk
        .def_property_readonly("disk", [](const lp::park_decision & d) { return d.tier == lp::park_tier::disk; })
        .def_readonly("why",  &lp::park_decision::why)
        .def_property_readonly("reason", [](const lp::park_decision & d) { return std::string(lp::choice_reason_name(d.reason)); })
        .def_readonly("tier", &lp::park_decision::tier)
        .def_readonly("swap_ms",      &lp::park_decision::swap_ms)
        .def_readonly("disk_ms",      &lp::park_decision::disk_ms)
        .def_readonly("recompute_ms", &lp::park_decision::recompute_ms);

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
              py::list out;
              for (const auto & t : lp::tier_offers(park_options_of(bytes, n_tokens, ram_left, disk_left, waits_behind, extra_tiers), rates)) {
                  py::dict d;
                  d["tier"] = t.where;
                  d["copies"] = t.copies;
                  d["fits"] = t.fits;
                  d["ms"] = t.ms;
                  d["rank_ms"] = t.rank_ms;
                  out.append(d);
              }
              return out;
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
