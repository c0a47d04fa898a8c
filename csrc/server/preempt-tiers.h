// llama-preempt: the server's three tiers (policy/preempt-tier.h): RAM, disk and RECOMPUTE as the
// policy prices them (their measured rates and their room) and as the executor moves a state
// through them. Small adapters over the parked slots (preempt-parked.h): the swap store's copies to
// host RAM and back, and the disk tier's files; a state lives in the slot's preemption state
// (port.preempt_of(id).swap), and what a tier holds is counted from there. preempt_server owns one
// of each (server_tiers) and hands them to the policy as a tier_set.
#pragma once

#include "preempt-parked.h"
#include "preempt-port.h"
#include "preempt-tier.h"

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>

namespace llama_preempt {

// a park in host RAM: the park and restore copies' rates, within what parks may hold of the host budget
struct ram_tier final : kv_tier {
    parked_slots & parked;
    server_port &  port;
    ram_tier(parked_slots & parked, server_port & port) : parked(parked), port(port) {}

    park_tier where() const override { return park_tier::ram; }
    void price(cost_rates & r) const override {
        r.park_bps    = parked.swap().rates.park_bps;
        r.restore_bps = parked.swap().rates.restore_bps;
    }
    size_t room() const override { return parked.ram_room(); }
    move_result copy_out(const park_order & o) override {
        swap_result r;
        if (!parked.copy_to_host(o.id, host_use::park, r)) {
            return { move_failure::copy_out };
        }
        return {};
    }
    move_result copy_in(int32_t id) override {
        const size_t n_bytes = port.preempt_of(id).swap.state_bytes();
        return parked.restore_from_host(id, parked.restore_begin(id), n_bytes, "host RAM");
    }
    void forget(int32_t id) override { parked.forget(id); }
};

// a park on disk: through host RAM to its file (--preempt-disk), read back before its restore; the
// file's write and read rates, and the disk's room (prompt files give way to parks)
struct disk_tier final : kv_tier {
    parked_slots & parked;
    server_port &  port;
    disk_tier(parked_slots & parked, server_port & port) : parked(parked), port(port) {}

    park_tier where() const override { return park_tier::disk; }
    void price(cost_rates & r) const override {
        r.disk_write_bps = parked.swap().rates.disk_write_bps;
        r.disk_read_bps  = parked.swap().rates.disk_read_bps;
    }
    size_t room() const override { return parked.disk_room(); }
    // through host RAM to its file, written in the background from the host copy while that fits
    // what parks may hold (o.background); else streamed from the pool to its file now, one chunk at
    // a time, never a host copy of the whole state
    move_result copy_out(const park_order & o) override {
        if (!o.background) {
            return parked.stream_to_disk(o.id) ? move_result {}
                                               : move_result { move_failure::disk_write };
        }
        swap_result r;
        if (!parked.copy_to_host(o.id, host_use::transit, r)) {
            return { move_failure::copy_out };
        }
        const auto dr = parked.disk_park(o.id, r);
        if (!dr.ok()) {
            return { move_failure::disk_write,
                     dr.outcome == disk_outcome::kept_in_ram ? park_tier::ram
                                                                            : park_tier::recompute };
        }
        return {};
    }
    // its file back into host RAM (or its host copy, still held), then restored as a RAM park; a
    // streamed one straight from its file into the pool
    move_result copy_in(int32_t id) override {
        const size_t n_bytes = port.preempt_of(id).swap.state_bytes();
        auto m = parked.restore_begin(id);
        if (port.preempt_of(id).swap.disk.streamed) {
            return parked.restore_streamed(id, m, n_bytes);
        }
        std::string why;
        if (!parked.disk_read_back(id, why)) {
            return parked.restore_failed(id, m, n_bytes, "disk", why);
        }
        return parked.restore_from_host(id, m, n_bytes, "disk");
    }
    void forget(int32_t id) override { parked.forget(id); }
};

// RECOMPUTE: nothing is copied; its price is the prefill that replays what a slot held
struct recompute_tier final : kv_tier {
    const parked_slots & parked;
    explicit recompute_tier(const parked_slots & parked) : parked(parked) {}

    park_tier where() const override { return park_tier::recompute; }
    void price(cost_rates & r) const override { r.prefill_tps = parked.swap().rates.prefill_tps; }
    size_t room() const override { return SIZE_MAX; }
    move_result copy_out(const park_order &) override { return {}; }
    move_result copy_in(int32_t) override { return {}; }
    void forget(int32_t) override {}
};

// The server's tiers, owned together; set() hands the policy those this server has (an opt-in
// tier only under its flag). Adding a tier: its struct above, a member here, a line in set().
struct server_tiers {
    recompute_tier recompute;
    ram_tier       ram;
    disk_tier      disk;

    server_tiers(parked_slots & parked, server_port & port) : recompute(parked), ram(parked, port), disk(parked, port) {}

    tier_set set() {
        tier_set s;
        for (kv_tier * t : std::initializer_list<kv_tier *>{ &recompute, &ram, &disk }) {
            s.by_where[(int) t->where()] = t;
        }
        return s;
    }
};

} // namespace llama_preempt
