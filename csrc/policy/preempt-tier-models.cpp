// The table of tier models (preempt-tier-model.h), in tier order. A new tier is a line here.
#include "preempt-tier-model.h"

namespace llama_preempt {

const tier_model & ram_model();        // preempt-tier-ram.cpp
const tier_model & ram_q8_model();     // preempt-tier-q8.cpp
const tier_model & disk_model();       // preempt-tier-disk.cpp
const tier_model & recompute_model();  // preempt-tier-recompute.cpp

const std::vector<const tier_model *> & tier_models() {
    static const std::vector<const tier_model *> all = { &ram_model(), &ram_q8_model(), &disk_model(), &recompute_model() };
    return all;
}

const tier_model & model_of(park_tier where) {
    for (const tier_model * m : tier_models()) {
        if (m->where() == where) {
            return *m;
        }
    }
    return recompute_model();
}

} // namespace llama_preempt
