// llama_preempt._core: the typed boundary between the server's mechanics and Python. The events a
// step reports (preempt-events.h) are bound as they are, so Python reads C++'s own fields (a field
// added here is there at once, and one Python lacks cannot be silently dropped), and the names the
// policy and /metrics use are exported, never re-listed in Python.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "preempt-events.h"
#include "preempt-stats.h"
#include "preempt-metrics.h"
#include "preempt-policy.h"
#include "py-enums.h"

#include <string>
#include <vector>

namespace py = pybind11;
namespace lp = llama_preempt;

namespace {

// a read-only Python class over a C++ event: its fields by name (`_fields`, as a namedtuple has),
// equality, and a repr that names them
template <typename T>
struct event_class {
    py::class_<T> cls;
    std::vector<std::string> fields;

    event_class(py::module_ & m, const char * name, const char * doc) : cls(m, name, doc) {}

    template <typename M>
    event_class & field(const char * name, M T::*member) {
        cls.def_readonly(name, member);
        fields.emplace_back(name);
        return *this;
    }

    void done() {
        const auto names = fields;
        py::tuple t(names.size());
        for (size_t i = 0; i < names.size(); ++i) {
            t[i] = py::str(names[i]);
        }
        cls.attr("_fields") = t;
        cls.def("__repr__", [names](py::object self) {
            std::string out = py::str(self.get_type().attr("__name__")).cast<std::string>() + "(";
            for (size_t i = 0; i < names.size(); ++i) {
                out += (i ? ", " : "") + names[i] + "=" + py::repr(self.attr(names[i].c_str())).cast<std::string>();
            }
            return out + ")";
        });
        cls.def("__eq__", [names](py::object self, py::object other) {
            if (!py::isinstance(other, self.get_type())) {
                return false;
            }
            for (const auto & n : names) {
                if (!self.attr(n.c_str()).equal(other.attr(n.c_str()))) {
                    return false;
                }
            }
            return true;
        });
        cls.def("_asdict", [names](py::object self) {
            py::dict d;
            for (const auto & n : names) {
                d[py::str(n)] = self.attr(n.c_str());
            }
            return d;
        });
    }
};

} // namespace

void register_events(py::module_ & m) {
    // the policy's enums, one Python str enum each (py-enums.h), before anything that reports in them
    lp::def_str_enum<lp::park_tier>(m);
    lp::def_str_enum<lp::park_reason>(m);
    lp::def_str_enum<lp::park_choice>(m);
    lp::def_str_enum<lp::preempt_mode>(m);
    lp::def_str_enum<lp::decision_kind>(m);
    lp::def_str_enum<lp::sim_outcome>(m);
    lp::def_str_enum<lp::end_stop>(m);

    event_class<lp::park_event>(m, "ParkEvent", "a slot parked in this step")
        .field("slot", &lp::park_event::slot)
        .field("task", &lp::park_event::task)
        .field("mode", &lp::park_event::mode)
        .field("tier", &lp::park_event::tier)
        .field("n_tokens", &lp::park_event::n_tokens)
        .field("bytes", &lp::park_event::bytes)
        .field("reason", &lp::park_event::reason)
        .field("ms", &lp::park_event::ms)
        .field("priority", &lp::park_event::priority)
        .field("choice", &lp::park_event::choice)
        .field("predicted_ms", &lp::park_event::predicted_ms)
        .field("swap_ms_predicted", &lp::park_event::swap_ms_predicted)
        .field("disk_ms_predicted", &lp::park_event::disk_ms_predicted)
        .field("recompute_ms_predicted", &lp::park_event::recompute_ms_predicted)
        .done();
    event_class<lp::resume_event>(m, "ResumeEvent", "a parked slot resumed in this step")
        .field("slot", &lp::resume_event::slot)
        .field("task", &lp::resume_event::task)
        .field("mode", &lp::resume_event::mode)
        .field("tier", &lp::resume_event::tier)
        .field("fallback", &lp::resume_event::fallback)
        .field("parked_ms", &lp::resume_event::parked_ms)
        .field("restore_ms", &lp::resume_event::restore_ms)
        .field("n_replay", &lp::resume_event::n_replay)
        .done();
    event_class<lp::end_event>(m, "EndEvent", "a request that ended in this step (its slot released)")
        .field("slot", &lp::end_event::slot)
        .field("task", &lp::end_event::task)
        .field("n_generated", &lp::end_event::n_generated)
        .field("stop", &lp::end_event::stop)
        .done();
    event_class<lp::fail_event>(m, "FailEvent", "a request that got an error in this step")
        .field("slot", &lp::fail_event::slot)
        .field("task", &lp::fail_event::task)
        .field("message", &lp::fail_event::message)
        .done();
    event_class<lp::step_report>(m, "StepReportCore", "what one iteration of the server loop did, as C++ reports it")
        .field("alive", &lp::step_report::alive)
        .field("busy", &lp::step_report::busy)
        .field("t_us", &lp::step_report::t_us)
        .field("n_decoded", &lp::step_report::n_decoded)
        .field("n_prompt", &lp::step_report::n_prompt)
        .field("n_replay", &lp::step_report::n_replay)
        .field("n_generated", &lp::step_report::n_generated)
        .field("parked", &lp::step_report::parked)
        .field("resumed", &lp::step_report::resumed)
        .field("finished", &lp::step_report::finished)
        .field("failed", &lp::step_report::failed)
        .field("cancelled", &lp::step_report::cancelled)
        .done();

    // the Engine's stats() between steps (preempt-stats.h): PreemptStats.from_core() reads them
    event_class<lp::metric_item>(m, "MetricItem", "one series of ours /metrics shows")
        .field("name", &lp::metric_item::name)
        .field("type", &lp::metric_item::type)
        .field("help", &lp::metric_item::help)
        .field("value", &lp::metric_item::value)
        .done();
    event_class<lp::labeled_metric>(m, "LabeledMetric", "one counter with one label: (label value, count) for every value")
        .field("name", &lp::labeled_metric::name)
        .field("label", &lp::labeled_metric::label)
        .field("help", &lp::labeled_metric::help)
        .field("values", &lp::labeled_metric::values)
        .done();
    event_class<lp::slot_park_fields>(m, "SlotParkFields", "what /slots shows of a slot's park (tier, parked_by and "
                                      "choice mean something while is_preempted)")
        .field("state", &lp::slot_park_fields::state)
        .field("id_cmpl", &lp::slot_park_fields::id_cmpl)
        .field("priority", &lp::slot_park_fields::priority)
        .field("is_preempted", &lp::slot_park_fields::is_preempted)
        .field("is_paused", &lp::slot_park_fields::is_paused)
        .field("n_preempt", &lp::slot_park_fields::n_preempt)
        .field("n_recompute", &lp::slot_park_fields::n_recompute)
        .field("tier", &lp::slot_park_fields::tier)
        .field("parked_by", &lp::slot_park_fields::parked_by)
        .field("choice", &lp::slot_park_fields::choice)
        .field("ram_bytes", &lp::slot_park_fields::ram_bytes)
        .field("disk_bytes", &lp::slot_park_fields::disk_bytes)
        .field("copy_in_flight", &lp::slot_park_fields::copy_in_flight)
        .field("t_preempted_ms", &lp::slot_park_fields::t_preempted_ms)
        .field("n_cells", &lp::slot_park_fields::n_cells)
        .field("n_cells_shared", &lp::slot_park_fields::n_cells_shared)
        .done();
    event_class<lp::slot_stats>(m, "SlotStatsCore", "one slot as the Engine's stats() reports it")
        .field("id", &lp::slot_stats::id)
        .field("n_ctx", &lp::slot_stats::n_ctx)
        .field("is_processing", &lp::slot_stats::is_processing)
        .field("id_task", &lp::slot_stats::id_task)
        .field("n_tokens", &lp::slot_stats::n_tokens)
        .field("n_decoded", &lp::slot_stats::n_decoded)
        .field("park", &lp::slot_stats::park)
        .done();
    event_class<lp::engine_stats>(m, "EngineStatsCore", "the Engine's stats() as C++ reports them, as of a step boundary")
        .field("preempt_on", &lp::engine_stats::preempt_on)
        .field("n_pool", &lp::engine_stats::n_pool)
        .field("ram_budget_bytes", &lp::engine_stats::ram_budget_bytes)
        .field("disk_budget_bytes", &lp::engine_stats::disk_budget_bytes)
        .field("mode", &lp::engine_stats::mode)
        .field("series", &lp::engine_stats::series)
        .field("labeled", &lp::engine_stats::labeled)
        .field("slots", &lp::engine_stats::slots)
        .field("age_ms", &lp::engine_stats::age_ms)
        .field("while_stepping", &lp::engine_stats::while_stepping)
        .done();

    // the names the policy and /metrics use: Python reads them from here (the enums' values, in order)
    m.attr("PREEMPT_MODES") = lp::str_enum_values<lp::preempt_mode>();
    m.attr("PARK_CHOICES")  = lp::str_enum_values<lp::park_choice>();
    m.attr("PARK_TIERS")    = lp::str_enum_values<lp::park_tier>();
    m.attr("PARK_REASONS")  = lp::str_enum_values<lp::park_reason>();
    std::vector<std::string> disk_errors;
    for (int i = 1; i < lp::N_DISK_ERRORS; ++i) {
        disk_errors.emplace_back(lp::disk_error_name((lp::disk_error) i));
    }
    m.attr("DISK_FAILURES") = py::tuple(py::cast(disk_errors));
    m.attr("DEFAULT_PARK_BPS")    = lp::cost_rates::DEFAULT_PARK_BPS;
    m.attr("DEFAULT_RESTORE_BPS") = lp::cost_rates::DEFAULT_RESTORE_BPS;
    m.attr("DEFAULT_PREFILL_TPS") = lp::cost_rates::DEFAULT_PREFILL_TPS;
    m.attr("DEFAULT_DISK_WRITE_BPS") = lp::cost_rates::DEFAULT_DISK_WRITE_BPS;
    m.attr("DEFAULT_DISK_READ_BPS")  = lp::cost_rates::DEFAULT_DISK_READ_BPS;
    m.attr("DEFAULT_PACK_BPS")       = lp::cost_rates::DEFAULT_PACK_BPS;
    m.attr("DEFAULT_UNPACK_BPS")     = lp::cost_rates::DEFAULT_UNPACK_BPS;
    m.attr("DEFAULT_PACK_RATIO")     = lp::cost_rates::DEFAULT_PACK_RATIO;
    m.def("metric_names", []() {
        std::vector<std::pair<std::string, std::string>> out;
        for (const auto & it : lp::metric_items(lp::preempt_counters{}, lp::preempt_gauges{})) {
            out.emplace_back(it.name, it.type);
        }
        return out;
    }, "every preemption series of /metrics (without the llamacpp: prefix), with its kind (counter or gauge)");
    m.def("labeled_metric_names", []() {
        std::vector<std::pair<std::string, std::string>> out;
        for (const auto & it : lp::labeled_items(lp::preempt_counters{})) {
            out.emplace_back(it.name, it.label);
        }
        return out;
    }, "the preemption counters of /metrics with one label (without the llamacpp: prefix), with the label's name");
}
