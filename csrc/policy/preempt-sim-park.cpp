// The simulator's park and resume (preempt-sim.h): what the server's mechanics do to a slot and
// to the clock, in simulated time.
#include "preempt-sim.h"

#include "preempt-policy.h"

#include <algorithm>
#include <cstdint>

namespace llama_preempt {

void sim_server::park(sim_slot & s) {
    // the server's own decisions (preempt-policy.h), priced with the simulated costs
    park_input in;
    in.at        = s.phase == slot_phase::generating ? parked_from::generating : s.is_new ? parked_from::started : parked_from::prompt;
    in.replaying = s.replay_left > 0;
    in.n_held    = s.cells;
    in.n_prompt  = reqs[s.req].n_prompt;
    in.n_replay  = s.replay_total;
    const double bytes = in.n_held * p.bytes_per_cell;
    cost_rates rates;
    rates.park_bps       = p.swap_out_bps;
    rates.restore_bps    = p.swap_in_bps;
    rates.prefill_tps    = 1.0 / p.prefill_token_s;
    rates.disk_write_bps = p.disk_write_bps;
    rates.disk_read_bps  = p.disk_read_bps;
    park_options o;
    o.bytes        = has_swap_state(in) ? (size_t) bytes : 0;
    o.n_tokens     = in.n_held;
    o.ram_left     = ram_left(ram_budget(), (size_t) parked_bytes);
    o.disk_left    = ram_left(disk_budget(), (size_t) disk_bytes);
    o.waits_behind = o.disk_left > 0 && waits_behind_parked(views(), s.id);
    const park_decision how = choose_park(effective_mode(p.mode, ram_budget(), disk_budget()), o, rates);
    const park_shape shape = shape_park(in, how.swap, p.n_batch);
    res.parks_by_choice[(int) how.why]++;

    s.held      = in.n_held;
    s.from_gen  = shape.from == parked_from::generating;
    s.n_restore = shape.n_restore;
    s.reading   = false;
    if (how.swap) {
        s.swapped = true;
        s.bytes   = bytes;
        s.on_disk = how.disk;
        t += bytes / p.swap_out_bps;
        if (how.disk) {
            disk_bytes += bytes;
            res.peak_disk_bytes = std::max(res.peak_disk_bytes, disk_bytes);
            res.n_park_disk++;
            // one I/O thread: the write queues behind what it is doing
            t_io_free = std::max(t_io_free, t) + bytes / p.disk_write_bps;
            if (o.bytes <= o.ram_left) {
                s.t_io_done = t_io_free;  // written in the background from the host copy, held until then
                s.ram       = bytes;
            } else {
                t     = t_io_free;  // the loop waits for the write: the host copy does not fit the RAM left
                s.ram = 0;
            }
        } else {
            s.ram = bytes;
        }
        parked_bytes += s.ram;
        res.peak_parked_bytes = std::max(res.peak_parked_bytes, parked_bytes);
        res.n_park_swap++;
    } else {
        s.swapped = false;
        s.on_disk = false;
        s.bytes   = 0;
        s.ram     = 0;
        if (s.from_gen && !in.replaying) {
            s.replay_total = shape.n_restore;  // what it held plus the token it had sampled
        }
        if (shape.from == parked_from::prompt) {
            s.redo_left  += shape.n_redo;  // starts its prompt over
            s.prompt_done = 0;
        }
        res.n_park_recompute++;
    }
    s.replay_left = 0;
    s.cells       = 0;
    s.phase       = slot_phase::parked;
    s.t_parked    = t;
    s.n_preempt  += 1;
    res.requests[s.req].n_preempt += 1;
}

void sim_server::settle_disk() {
    for (auto & s : slots) {
        // as the server, the slot that came back next in the last plan keeps its host copy
        if (s.phase == slot_phase::parked && s.on_disk && !s.reading && s.ram > 0 && t >= s.t_io_done &&
            s.id != restore_next) {
            parked_bytes -= s.ram;  // written: the state is only on disk now
            s.ram = 0;
        }
    }
}

void sim_server::read_ahead(sim_slot & s) {
    if (s.phase != slot_phase::parked || !s.on_disk || s.ram > 0 || s.bytes > ram_left(ram_budget(), (size_t) parked_bytes)) {
        return;
    }
    t_io_free   = std::max(t_io_free, t) + s.bytes / p.disk_read_bps;
    s.t_io_done = t_io_free;
    s.reading   = true;
    s.ram       = s.bytes;
    parked_bytes += s.ram;
    res.peak_parked_bytes = std::max(res.peak_parked_bytes, parked_bytes);
}

void sim_server::resume(sim_slot & s) {
    res.requests[s.req].t_parked_s += t - s.t_parked;
    res.n_resume++;
    if (s.swapped) {
        if (s.on_disk) {
            if (s.reading) {
                t = std::max(t, s.t_io_done);  // the read ahead lands
            } else if (s.ram == 0) {
                t_io_free = std::max(t_io_free, t) + s.bytes / p.disk_read_bps;  // read now, the loop waits
                t         = t_io_free;
            }  // else its write is still running (it stays in the queue's time): restored from the host copy
            disk_bytes -= s.bytes;
        }
        t += s.bytes / p.swap_in_bps;
        parked_bytes -= s.ram;
        s.cells   = s.held;
        s.bytes   = 0;
        s.ram     = 0;
        s.on_disk = false;
        s.reading = false;
        s.swapped = false;
        s.phase   = s.from_gen ? slot_phase::generating : slot_phase::prompt;
        return;
    }
    s.phase = slot_phase::prompt;
    if (s.from_gen) {
        s.replay_left = s.replay_total;
    }
}

} // namespace llama_preempt
