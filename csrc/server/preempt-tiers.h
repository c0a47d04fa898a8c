// llama-preempt: the server's three tiers (policy/preempt-tier.h): RAM, disk and RECOMPUTE as the
// policy prices them (their measured rates and their room) and as the executor moves a state
// through them. Small adapters over the parked slots (preempt-parked.h): the swap store's copies to
// host RAM and back, and the disk tier's files; a state lives in the slot's preemption state
// (parked.state(id).swap), and what a tier holds is counted from there. preempt_server owns one
// of each (server_tiers) and hands them to the policy as a tier_set.
#pragma once

#include "preempt-parked.h"
#include "preempt-port.h"
#include "preempt-q8.h"
#include "preempt-tier.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

namespace llama_preempt {

// a park in host RAM: the park and restore copies' rates, within what parks may hold of the host budget
struct ram_tier final : kv_tier {
    parked_slots & parked;
    park_port &  port;
    ram_tier(parked_slots & parked, park_port & port) : parked(parked), port(port) {}

    park_tier where() const override { return park_tier::ram; }
    ahead_kind ahead() const override { return ahead_kind::upload; }  // where the copier can (read_ahead())
    void read_ahead(int32_t id) override { parked.upload_ahead(id); }
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
        const size_t n_bytes = parked.state(id).swap.state_bytes();
        return parked.restore_from_host(id, parked.restore_begin(id), n_bytes, "host RAM");
    }
    void forget(int32_t id) override { parked.forget(id); }
};

// a park on disk: through host RAM to its file (--preempt-disk), read back before its restore; the
// file's write and read rates, and the disk's room (prompt files give way to parks)
struct disk_tier final : kv_tier {
    parked_slots & parked;
    park_port &  port;
    disk_tier(parked_slots & parked, park_port & port) : parked(parked), port(port) {}

    bool on() const { return parked.swap().disk != nullptr; }  // --preempt-disk

    park_tier where() const override { return park_tier::disk; }
    ahead_kind ahead() const override { return ahead_kind::read_in; }
    void read_ahead(int32_t id) override { parked.read_file_ahead(id); }
    void price(cost_rates & r) const override {
        r.own(where()) = parked.swap().rates.own(where());
    }
    size_t room() const override { return parked.disk_room(); }
    // through host RAM to its file, written in the background from the host copy while that fits
    // what parks may hold (o.background); else streamed from the pool to its file now, one chunk at
    // a time, never a host copy of the whole state
    move_result copy_out(const park_order & o) override {
        if (!o.background) {
            return parked.stream_to_disk(o.id) ? move_result {}
                                               : move_result { move_failure::write };
        }
        swap_result r;
        if (!parked.copy_to_host(o.id, host_use::transit, r)) {
            return { move_failure::copy_out };
        }
        const auto dr = parked.disk_park(o.id, r);
        if (!dr.ok()) {
            return { move_failure::write,
                     dr.outcome == disk_outcome::kept_in_ram ? park_tier::ram
                                                                            : park_tier::recompute };
        }
        return {};
    }
    // its file back into host RAM (or its host copy, still held), then restored as a RAM park; a
    // streamed one straight from its file into the pool
    move_result copy_in(int32_t id) override {
        const size_t n_bytes = parked.state(id).swap.state_bytes();
        auto m = parked.restore_begin(id);
        if (parked.state(id).swap.disk.streamed) {
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

// A park in host RAM compressed to q8_0 (--preempt-compress q8_0; store/preempt-q8.h): about half
// a RAM park's bytes, within the same share of the host budget, for the time packing and
// unpacking take (measured here: the rates it is priced by). Not byte-exact. The state comes to
// host RAM whole as bytes on their way (a disk park's way), is packed while its cells are still in
// place, and is unpacked into full buffers before its restore; never uploaded ahead.
struct q8_tier final : kv_tier {
    parked_slots & parked;
    park_port &  port;
    tier_rate      measured = cost_rates{}.own(park_tier::ram_q8);  // its own pack and unpack rates and packed share
    std::vector<q8_form> forms;  // by slot: how the state it holds was packed (the handle of what it holds)
    q8_tier(parked_slots & parked, park_port & port) : parked(parked), port(port) {}

    bool on() const { return parked.config().compress_q8; }

    park_tier where() const override { return park_tier::ram_q8; }
    // its own moves only: the host copies are the RAM tier's rates, which every server prices
    void price(cost_rates & r) const override { r.own(where()) = measured; }
    size_t room() const override { return parked.ram_room(); }
    move_result copy_out(const park_order & o) override {
        const size_t room = parked.ram_room();
        swap_result r;
        if (!parked.copy_to_host(o.id, host_use::transit, r)) {
            return { move_failure::copy_out };
        }
        auto & st = parked.state(o.id).swap;
        const size_t  full = st.bytes();
        settle_copy(st, *parked.swap().copier);  // on a device: its transfer lands first, outside the pack's time
        const int64_t t0   = ggml_time_us();
        std::string why;
        forms.resize(std::max<size_t>(forms.size(), (size_t) port.n_slots()));
        const bool packed = compress_state(st, port.contexts_of(o.id), parked.swap(), forms[o.id], why);
        parked.take_verdict(o.id);  // a checked park's verdict, reached as its transfer settled
        if (packed && st.bytes() <= room) {
            const int64_t t_us = ggml_time_us() - t0;
            PSLT_INF(port, o.id, "packed to q8_0: %.2f MiB of state held in %.2f MiB in %.2f ms\n", full / 1048576.0,
                     st.bytes() / 1048576.0, t_us / 1000.0);
            observe(measured.out_bps, full, t_us);
            measured.held_ratio += cost_rates::ALPHA * ((double) st.bytes() / full - measured.held_ratio);
            return {};
        }
        if (packed) {
            why = string_format("packed to %.2f MiB, more than the %.2f MiB parks may still hold", st.bytes() / 1048576.0, room / 1048576.0);
        }
        PSLT_WRN(port, o.id, "compressed park failed (%s)\n", why.c_str());
        if (!packed && full <= room) {
            return { move_failure::copy_out, park_tier::ram };  // a plain RAM park, as copied
        }
        parked.forget(o.id);
        return { move_failure::copy_out };
    }
    move_result copy_in(int32_t id) override {
        auto m = parked.restore_begin(id);
        auto & st = parked.state(id).swap;
        const size_t n_bytes = st.state_bytes();
        const q8_form form   = std::move(forms[id]);
        const size_t  full   = form.full_bytes();
        parked.reserve_transit(full);
        const int64_t t0 = ggml_time_us();
        std::string why;
        if (!expand_state(st, form, parked.swap(), why)) {
            return parked.restore_failed(id, m, n_bytes, "compressed host RAM", why);
        }
        observe(measured.in_bps, full, ggml_time_us() - t0);
        return parked.restore_from_host(id, m, full, "compressed host RAM");
    }
    void forget(int32_t id) override {
        parked.forget(id);
        if ((size_t) id < forms.size()) {
            forms[id] = {};
        }
    }

private:
    static void observe(double & bps, size_t bytes, int64_t t_us) {
        if (bytes >= cost_rates::MIN_COPY_BYTES && t_us > 0) {
            bps += cost_rates::ALPHA * (bytes * 1e6 / t_us - bps);
        }
    }
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

// The server's tiers, owned together; set() hands the policy those this server has (the disk and
// the compressed tier only under their flags). Adding a tier: its struct above, a member here, a line in set().
struct server_tiers {
    recompute_tier recompute;
    ram_tier       ram;
    disk_tier      disk;
    q8_tier        q8;

    server_tiers(parked_slots & parked, park_port & port)
        : recompute(parked), ram(parked, port), disk(parked, port), q8(parked, port) {}

    tier_set set() {
        tier_set s;
        for (kv_tier * t : std::initializer_list<kv_tier *>{ &recompute, &ram, disk.on() ? &disk : nullptr, q8.on() ? &q8 : nullptr }) {
            if (t != nullptr) {
                s.by_where[(int) t->where()] = t;
            }
        }
        return s;
    }
};

} // namespace llama_preempt
