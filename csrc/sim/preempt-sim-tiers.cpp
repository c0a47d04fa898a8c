// The simulator's tiers (preempt-sim-tiers.h): a park's copies on the simulated clock.
#include "preempt-sim.h"

#include <algorithm>

namespace llama_preempt {

// the state to host RAM at the park rate, after the host budget made room (cached prompts give
// way first; a disk park's bytes only pass through)
static move_result copy_to_host(sim_server & s, const park_order & o, host_use use) {
    const bool ok = s.host.reserve(s.prompts.held(), o.bytes, use);
    s.prompts.spill();
    if (!ok) {
        return { move_failure::copy_out };
    }
    s.slots[o.id].bytes = (double) o.bytes;
    s.t += o.bytes / s.p.swap_out_bps;
    return {};
}

// a parked state back into the pool at the restore rate; its host RAM goes back to the budget
static void restore_from_host(sim_server & s, sim_slot & slot) {
    s.t += slot.bytes / s.p.swap_in_bps;
    s.free_ram(slot);
    s.host.release(s.prompts.held());
}

// --- RAM ---

void sim_ram_tier::price(cost_rates & rates) const {
    rates.park_bps    = s.p.swap_out_bps;
    rates.restore_bps = s.p.swap_in_bps;
}

size_t sim_ram_tier::room() const {
    return s.ram_room();
}

move_result sim_ram_tier::copy_out(const park_order & o) {
    const move_result r = copy_to_host(s, o, host_use::park);
    if (r.ok()) {
        s.hold_ram(s.slots[o.id], (double) o.bytes);
    }
    return r;
}

move_result sim_ram_tier::copy_in(int32_t id) {
    auto & slot = s.slots[id];
    slot.t_restore0 = s.t;  // as the server's, the parked time ends where the restore begins
    restore_from_host(s, slot);
    return {};
}

void sim_ram_tier::forget(int32_t id) {
    s.free_ram(s.slots[id]);
}

// --- disk ---

void sim_disk_tier::price(cost_rates & rates) const {
    rates.own(where()).out_bps = s.p.disk_write_bps;
    rates.own(where()).in_bps  = s.p.disk_read_bps;
}

size_t sim_disk_tier::room() const {
    // prompt files give way to parks: their bytes count as room
    return s.disk.room() + s.prompts.file_bytes();
}

move_result sim_disk_tier::copy_out(const park_order & o) {
    // written in the background from a host copy that fits what parks may hold; else, as the
    // server, streamed from the pool to its file now (one chunk of host RAM), the loop waiting
    if (o.background) {
        const move_result r = copy_to_host(s, o, host_use::transit);
        if (!r.ok()) {
            return r;
        }
    }
    auto & slot = s.slots[o.id];
    slot.bytes    = (double) o.bytes;
    slot.streamed = !o.background;
    s.prompts.drop_files(o.bytes);  // parks first on disk
    s.disk.bytes += slot.bytes;
    s.res.peak_disk_bytes = std::max(s.res.peak_disk_bytes, s.disk.bytes);
    // one I/O thread: the write queues behind what it is doing
    const double t_written = s.disk.io(s.t, slot.bytes / s.p.disk_write_bps);
    if (slot.streamed) {
        s.t = t_written;
        return {};
    }
    slot.t_io_done = t_written;  // written from the host copy, held until then
    s.hold_ram(slot, slot.bytes);
    return {};
}

move_result sim_disk_tier::copy_in(int32_t id) {
    auto & slot = s.slots[id];
    slot.t_restore0 = s.t;
    if (slot.streamed) {
        // straight from its file into the pool, the loop waiting for the read
        s.t = s.disk.io(s.t, slot.bytes / s.p.disk_read_bps);
        s.disk.bytes -= slot.bytes;
        slot.streamed = false;
        return {};
    }
    s.host.reserve(s.prompts.held(), (size_t) slot.bytes, host_use::transit);  // its bytes come back into host RAM
    s.prompts.spill();
    if (slot.reading) {
        s.t = std::max(s.t, slot.t_io_done);  // the read ahead lands
    } else if (slot.ram == 0) {
        s.t = s.disk.io(s.t, slot.bytes / s.p.disk_read_bps);  // read now, the loop waits
    }  // else its write is still running (it stays in the queue's time): restored from the host copy
    s.disk.bytes -= slot.bytes;
    restore_from_host(s, slot);
    return {};
}

void sim_disk_tier::read_ahead(int32_t id) {
    auto & slot = s.slots[id];
    if (slot.streamed) {
        return;  // it comes back straight from its file
    }
    slot.t_io_done = s.disk.io(s.t, slot.bytes / s.p.disk_read_bps);
    slot.reading   = true;
    s.hold_ram(slot, slot.bytes);
}

void sim_disk_tier::forget(int32_t id) {
    auto & slot = s.slots[id];
    slot.streamed = false;
    s.free_ram(slot);
    s.disk.bytes -= slot.bytes;
}

// --- host RAM packed to q8_0 ---

// its own moves only: the host copies are the RAM tier's rates, which every executor prices
void sim_q8_tier::price(cost_rates & rates) const {
    rates.own(where()) = { s.p.pack_bps, s.p.unpack_bps, s.p.pack_ratio, 0, 0 };
}

size_t sim_q8_tier::room() const {
    return s.ram_room();  // the RAM tier's: its packed bytes count there
}

move_result sim_q8_tier::copy_out(const park_order & o) {
    const size_t packed = (size_t) (o.bytes * s.p.pack_ratio);
    const bool   ok     = s.host.reserve(s.prompts.held(), packed, host_use::park);
    s.prompts.spill();
    if (!ok) {
        return { move_failure::copy_out };
    }
    auto & slot = s.slots[o.id];
    slot.bytes = (double) o.bytes;
    s.t += o.bytes / s.p.swap_out_bps + o.bytes / s.p.pack_bps;
    s.hold_ram(slot, (double) packed);
    return {};
}

move_result sim_q8_tier::copy_in(int32_t id) {
    auto & slot = s.slots[id];
    slot.t_restore0 = s.t;
    s.t += slot.bytes / s.p.unpack_bps;  // unpacked into full buffers, then restored as a RAM park
    restore_from_host(s, slot);
    return {};
}

void sim_q8_tier::forget(int32_t id) {
    s.free_ram(s.slots[id]);
}

// --- RECOMPUTE ---

void sim_recompute_tier::price(cost_rates & rates) const {
    rates.prefill_tps = s.p.cost.prompt_token_s > 0 ? 1.0 / s.p.cost.prompt_token_s : 1e9;
}

} // namespace llama_preempt
