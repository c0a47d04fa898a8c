// llama_preempt._core: a JSON document (upstream's common_json) as the Python objects it spells,
// for what the Engine hands to Python without a string in between.
#pragma once

#include <pybind11/pybind11.h>

#include "server-common.h"

namespace py = pybind11;

// a JSON document as the Python objects it spells (dict, list, str, int, float, bool, None),
// handed over without a string in between
inline py::object to_python(const json & j) {
    if (j.is_object()) {
        py::dict d;
        for (const auto & [k, v] : j.items()) {
            d[py::str(k)] = to_python(v);
        }
        return std::move(d);
    }
    if (j.is_array()) {
        py::list l;
        for (size_t i = 0; i < j.size(); ++i) {
            l.append(to_python(j.at(i)));
        }
        return std::move(l);
    }
    if (j.is_string())         return py::str(j.get<std::string>());
    if (j.is_boolean())        return py::bool_(j.get<bool>());
    if (j.is_number_integer()) return py::int_(j.get<long long>());
    if (j.is_number_float())   return py::float_(j.get<double>());
    return py::none();
}
