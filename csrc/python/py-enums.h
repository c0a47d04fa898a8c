// llama_preempt._core: the policy's enums as Python str enums. Each crosses the boundary as one
// type (ParkTier, ParkReason, ...): C++ hands Python a member, Python hands C++ a member or its
// name. A member equals the name the server writes for it in /slots, /metrics and its logs
// (ParkTier.DISK == "disk", str(ParkTier.DISK) == "disk"), so code that compared the strings the
// events carried before keeps working, and one table below is the only place a name is spelled.
//
// Include this header in every file that binds one of these enums: it specializes pybind11's
// type_caster for them, and a file that binds them without it would cast them another way.
#pragma once

#include <pybind11/pybind11.h>

#include "preempt-events.h"
#include "preempt-executor.h"
#include "preempt-policy.h"
#include "preempt-sim.h"

#include <cctype>
#include <string>
#include <utility>
#include <vector>

namespace llama_preempt {

// an enum's Python class: its name, its docstring, and its members (Python name, C++ value) in
// order; the members' values are wire(): the names the server writes
template <typename E> struct py_str_enum;

template <> struct py_str_enum<park_tier> {
    static constexpr const char * name = "ParkTier";
    static constexpr const char * doc  = "where a parked slot's state waits: host RAM, a file on disk, or nowhere (recompute)";
    // every tier, named as the server names it, upper-cased (ParkTier.RAM == "ram"): a new tier
    // needs nothing here
    static std::vector<std::pair<const char *, park_tier>> members() {
        static const std::vector<std::string> names = [] {
            std::vector<std::string> v;
            for (int i = 0; i < N_PARK_TIERS; ++i) {
                std::string n = park_tier_name((park_tier) i);
                for (char & c : n) {
                    c = (char) std::toupper((unsigned char) c);
                }
                v.push_back(n);
            }
            return v;
        }();
        std::vector<std::pair<const char *, park_tier>> m;
        for (int i = 0; i < N_PARK_TIERS; ++i) {
            m.emplace_back(names[i].c_str(), (park_tier) i);
        }
        return m;
    }
    static const char * wire(park_tier t) { return park_tier_name(t); }
};

template <> struct py_str_enum<park_reason> {
    static constexpr const char * name = "ParkReason";
    static constexpr const char * doc  = "who parked a slot, as /slots' parked_by says: the planner (the pool was full), "
                                         "forced (LLAMA_SERVER_PREEMPT_EVERY), last_resort (decode failed at n_batch 1) or api";
    static std::vector<std::pair<const char *, park_reason>> members() {
        return { { "POOL_FULL", park_reason::pool_full }, { "FORCED", park_reason::forced },
                 { "LAST_RESORT", park_reason::last_resort }, { "API", park_reason::api } };
    }
    static const char * wire(park_reason r) { return park_reason_key(r); }
};

template <> struct py_str_enum<park_choice> {
    static constexpr const char * name = "ParkChoice";
    static constexpr const char * doc  = "why a victim went to its tier (the preempt_parks_by_choice_total label)";
    static std::vector<std::pair<const char *, park_choice>> members() {
        return { { "SWAP_CHEAPER", park_choice::swap_cheaper }, { "RECOMPUTE_CHEAPER", park_choice::recompute_cheaper },
                 { "SWAP_MODE", park_choice::swap_mode },       { "RECOMPUTE_MODE", park_choice::recompute_mode },
                 { "OVER_BUDGET", park_choice::over_budget },   { "NO_STATE", park_choice::no_state },
                 { "SWAP_FAILED", park_choice::swap_failed },   { "DISK_CHEAPER", park_choice::disk_cheaper },
                 { "RAM_FULL", park_choice::ram_full } };
    }
    static const char * wire(park_choice c) { return park_choice_name(c); }
};

template <> struct py_str_enum<preempt_mode> {
    static constexpr const char * name = "PreemptMode";
    static constexpr const char * doc  = "--preempt-mode (auto, swap, recompute); a park or resume event's mode is swap or recompute";
    static std::vector<std::pair<const char *, preempt_mode>> members() {
        return { { "AUTO", preempt_mode::automatic }, { "SWAP", preempt_mode::swap }, { "RECOMPUTE", preempt_mode::recompute } };
    }
    static const char * wire(preempt_mode m) { return preempt_mode_name(m); }
};

template <> struct py_str_enum<decision_kind> {
    static constexpr const char * name = "DecisionKind";
    static constexpr const char * doc  = "what a decision of the trace did";
    static std::vector<std::pair<const char *, decision_kind>> members() {
        return { { "PARK", decision_kind::park }, { "RESUME", decision_kind::resume }, { "FAIL", decision_kind::fail } };
    }
    static const char * wire(decision_kind k) {
        return k == decision_kind::park ? "park" : k == decision_kind::resume ? "resume" : "fail";
    }
};

template <> struct py_str_enum<sim_outcome> {
    static constexpr const char * name = "SimOutcome";
    static constexpr const char * doc  = "how a simulated request ended";
    static std::vector<std::pair<const char *, sim_outcome>> members() {
        return { { "PENDING", sim_outcome::pending }, { "COMPLETED", sim_outcome::completed }, { "FAILED", sim_outcome::failed } };
    }
    static const char * wire(sim_outcome o) {
        return o == sim_outcome::completed ? "completed" : o == sim_outcome::failed ? "failed" : "pending";
    }
};

template <> struct py_str_enum<end_stop> {
    static constexpr const char * name = "StopType";
    static constexpr const char * doc  = "why a request ended, as /completion's stop_type: eos, word, limit (none: cancelled)";
    static std::vector<std::pair<const char *, end_stop>> members() {
        return { { "NONE", end_stop::none }, { "EOS", end_stop::eos }, { "WORD", end_stop::word }, { "LIMIT", end_stop::limit } };
    }
    static const char * wire(end_stop s) { return end_stop_name(s); }
};

// the names of E's members, in order, as a tuple of str
template <typename E> pybind11::tuple str_enum_values() {
    pybind11::list out;
    for (const auto & [py_name, value] : py_str_enum<E>::members()) {
        out.append(py_str_enum<E>::wire(value));
    }
    return pybind11::tuple(out);
}

// the Python class of E, created once in the module (register_enums() in py-events.cpp)
template <typename E> void def_str_enum(pybind11::module_ & m) {
    namespace py = pybind11;
    using T = py_str_enum<E>;
    py::list items;
    for (const auto & [py_name, value] : T::members()) {
        items.append(py::make_tuple(py_name, T::wire(value)));
    }
    py::object str = py::module_::import("builtins").attr("str");
    py::object cls = py::module_::import("enum").attr("Enum")(T::name, items, py::arg("module") = m.attr("__name__"),
                                                               py::arg("type") = str);
    cls.attr("__doc__") = T::doc;
    // printed, formatted and hashed as the name the server writes, as enum.StrEnum (3.11+) does, so
    // a member and its name are the same dict key on every Python this package supports
    cls.attr("__str__")    = str.attr("__str__");
    cls.attr("__format__") = str.attr("__format__");
    cls.attr("__hash__")   = str.attr("__hash__");
    m.attr(T::name) = cls;
}

} // namespace llama_preempt

namespace pybind11 {
namespace detail {

// C++ to Python: the member; Python to C++: a member or its name (anything else: ValueError)
template <typename E> struct str_enum_caster {
    PYBIND11_TYPE_CASTER(E, const_name("str"));

    bool load(handle src, bool) {
        if (!PyUnicode_Check(src.ptr())) {
            return false;
        }
        using T = llama_preempt::py_str_enum<E>;
        const std::string s = reinterpret_borrow<str>(src);
        const auto members = T::members();
        std::string names;  // "a, b or c"
        for (size_t i = 0; i < members.size(); ++i) {
            if (s == T::wire(members[i].second)) {
                value = members[i].second;
                return true;
            }
            names += std::string(i == 0 ? "" : i + 1 == members.size() ? " or " : ", ") + T::wire(members[i].second);
        }
        throw value_error(std::string(T::name) + " must be " + names + ", got '" + s + "'");
    }

    static handle cast(E v, return_value_policy, handle) {
        using T = llama_preempt::py_str_enum<E>;
        return module_::import("llama_preempt._core").attr(T::name)(T::wire(v)).release();
    }
};

template <> struct type_caster<llama_preempt::park_tier>     : str_enum_caster<llama_preempt::park_tier> {};
template <> struct type_caster<llama_preempt::park_reason>   : str_enum_caster<llama_preempt::park_reason> {};
template <> struct type_caster<llama_preempt::park_choice>   : str_enum_caster<llama_preempt::park_choice> {};
template <> struct type_caster<llama_preempt::preempt_mode>  : str_enum_caster<llama_preempt::preempt_mode> {};
template <> struct type_caster<llama_preempt::decision_kind> : str_enum_caster<llama_preempt::decision_kind> {};
template <> struct type_caster<llama_preempt::sim_outcome>   : str_enum_caster<llama_preempt::sim_outcome> {};
template <> struct type_caster<llama_preempt::end_stop>      : str_enum_caster<llama_preempt::end_stop> {};

} // namespace detail
} // namespace pybind11
