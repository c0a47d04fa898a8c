// The simulator's three tiers (policy/preempt-tier.h) in simulated time: what a park's copies
// cost on the server's clock and what they hold of host RAM and the disk, as the server's tiers
// (csrc/server/preempt-tiers.h) do with the real copies. Each is a view of its simulated server
// (the slots, the clock and the budgets are the server's): the server owns them.
#pragma once

#include "preempt-tier.h"

namespace llama_preempt {

struct sim_server;

// a park in host RAM: copied out at the park rate, back at the restore rate, within the parks' cap
struct sim_ram_tier final : kv_tier {
    sim_server & s;
    explicit sim_ram_tier(sim_server & s) : s(s) {}

    park_tier   where() const override { return park_tier::ram; }
    ahead_kind  ahead() const override { return ahead_kind::upload; }  // an upload ahead costs the simulated step nothing
    void        price(cost_rates & rates) const override;
    size_t      room() const override;
    move_result copy_out(const park_order & o) override;
    move_result copy_in(int32_t id) override;
    void        forget(int32_t id) override;
};

// a park on disk: through host RAM, written by the one I/O thread (in the background while its
// host copy fits what parks may hold), read back (or ahead) before its restore
struct sim_disk_tier final : kv_tier {
    sim_server & s;
    explicit sim_disk_tier(sim_server & s) : s(s) {}

    park_tier   where() const override { return park_tier::disk; }
    ahead_kind  ahead() const override { return ahead_kind::read_in; }
    void        read_ahead(int32_t id) override;  // the next one back has its file read while others decode
    void        price(cost_rates & rates) const override;
    size_t      room() const override;  // 0: no disk tier
    move_result copy_out(const park_order & o) override;
    move_result copy_in(int32_t id) override;
    void        forget(int32_t id) override;
};

// a park in host RAM packed to q8_0 (--preempt-compress q8_0): the RAM park's copies plus packing
// and unpacking at their rates, holding its packed share of what parks may hold; never uploaded ahead
struct sim_q8_tier final : kv_tier {
    sim_server & s;
    explicit sim_q8_tier(sim_server & s) : s(s) {}

    park_tier   where() const override { return park_tier::ram_q8; }
    void        price(cost_rates & rates) const override;
    size_t      room() const override;
    move_result copy_out(const park_order & o) override;
    move_result copy_in(int32_t id) override;
    void        forget(int32_t id) override;
};

// RECOMPUTE: nothing is copied; its price is the prefill that replays what the slot held
struct sim_recompute_tier final : kv_tier {
    sim_server & s;
    explicit sim_recompute_tier(sim_server & s) : s(s) {}

    park_tier   where() const override { return park_tier::recompute; }
    void        price(cost_rates & rates) const override;
    size_t      room() const override { return SIZE_MAX; }
    move_result copy_out(const park_order &) override { return {}; }
    move_result copy_in(int32_t) override { return {}; }
    void        forget(int32_t) override {}
};

} // namespace llama_preempt
