// llama_preempt._core, the planner's area: the slots as the policy sees them, the scheduling
// knobs, the step cost and the decode width, plan_step() and its phases (StepBudget).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <stdexcept>

#include "py-enums.h"
#include "preempt-config.h"
#include "preempt-flags.h"
#include "preempt-policy.h"
#include "preempt-step.h"

namespace py = pybind11;
namespace lp = llama_preempt;

namespace {

// a step's budget over its own copy of the slots and params (the budget holds references to them)
struct step_budget_py {
    std::vector<lp::slot_view>        slots;
    lp::plan_params                   params;
    std::unique_ptr<lp::step_budget>  b;

    step_budget_py(std::vector<lp::slot_view> s, lp::plan_params p) : slots(std::move(s)), params(p) {
        for (const auto & v : slots) {
            if (v.id < 0) {
                throw std::invalid_argument("StepBudget: every slot needs an id >= 0");
            }
        }
        b = std::make_unique<lp::step_budget>(slots, params);
    }
};

} // namespace

void register_policy(py::module_ & m) {
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
        .def_readwrite("n_linked",      &lp::slot_view::n_linked)
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

    // plan_step()'s phases one at a time over a step's budget (preempt-step.h): a test sets a
    // step up and runs the phases it is about
    py::class_<step_budget_py>(m, "StepBudget", "one step's budget of cells, as plan_step()'s phases spend it")
        .def(py::init<std::vector<lp::slot_view>, lp::plan_params>(), py::arg("slots"), py::arg("params"))
        .def_property_readonly("used",      [](const step_budget_py & b) { return b.b->used; })
        .def_property_readonly("need",      [](const step_budget_py & b) { return b.b->need; })
        .def_property_readonly("n_running", [](const step_budget_py & b) { return b.b->n_running; })
        .def_property_readonly("n_growing", [](const step_budget_py & b) { return b.b->n_growing; })
        .def_property_readonly("waiting",   [](const step_budget_py & b) { return b.b->waiting; })
        .def_property_readonly("victims",   [](const step_budget_py & b) {
            std::vector<int32_t> ids;
            for (const lp::slot_view * v : b.b->victims) {
                ids.push_back(v->id);
            }
            return ids;
        })
        .def_property_readonly("restore",   [](const step_budget_py & b) { return b.b->restore; })
        .def_property_readonly("paused",    [](const step_budget_py & b) {
            std::vector<int32_t> ids;
            for (size_t id = 0; id < b.b->seats.paused.size(); ++id) {
                if (b.b->seats.paused[id]) {
                    ids.push_back((int32_t) id);
                }
            }
            return ids;
        })
        .def_property_readonly("plan", [](const step_budget_py & b) { return b.b->pl; })
        .def("end_unfittable",      [](step_budget_py & b) { lp::end_unfittable(*b.b); })
        .def("park_for_running",    [](step_budget_py & b) { lp::park_for_running(*b.b); })
        .def("resume_due",          [](step_budget_py & b) { lp::resume_due(*b.b); })
        .def("admit_new",           [](step_budget_py & b) { lp::admit_new(*b.b); })
        .def("ensure_progress",     [](step_budget_py & b) { lp::ensure_progress(*b.b); })
        .def("resume_not_due",      [](step_budget_py & b) { lp::resume_not_due(*b.b); })
        .def("pick_next_back",      [](step_budget_py & b) { lp::pick_next_back(*b.b); })
        .def("share_prompt_tokens", [](step_budget_py & b) { lp::share_prompt_tokens(*b.b); });
}
