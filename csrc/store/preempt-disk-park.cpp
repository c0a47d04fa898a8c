// llama-preempt: disk parks (preempt-disk-park.h).
#include "preempt-disk-park.h"

#include <cstdio>
#include <cstring>

namespace llama_preempt {

// host buffers for the state read back, as a park's
static bool alloc_buffers(swap_state & st, swap_host & host) {
    return alloc_host_buffers(st, { st.disk.n_bytes[0], st.disk.n_bytes[1] }, host);
}

// a park the copy guard checked: what came back equals upstream's serialization at the park, byte for byte
static copy_check verify(const swap_state & st) {
    const auto & ref = st.disk.ref;
    if (ref.empty()) {
        return copy_check::none;  // not verifying
    }
    return ref.size() == st.bytes() && for_each_part(st, [&](int, const host_buffer & buf, size_t at) {
        return memcmp(ref.data() + at, buf.data, buf.size) == 0;
    }) ? copy_check::right : copy_check::wrong;
}

// a checked park's state back in RAM: bytes that differ from upstream's at the park are never restored
static disk_result & checked(swap_state & st, disk_result & r) {
    r.verified = verify(st);
    if (r.verified == copy_check::wrong) {
        r.outcome = disk_outcome::lost;
        r.why = "the bytes read back differ from upstream's serialization at the park";
        st.free();
    }
    return r;
}

// the file holds the state: its write is counted once (bytes, time, the measured rate); the host
// copy stays until free_host_copy()
static void note_write(swap_state & st, swap_host & host, disk_result & r) {
    st.disk.stage = disk_stage::written_in_ram;
    r.outcome = disk_outcome::written;
    r.bytes = st.disk.total();
    r.t_us  = st.disk.file->t_us;
    host.rates.observe_out(park_tier::disk, r.bytes, r.t_us);
}

// the host copy goes back to the pool (the RAM budget gets it back): the state is only on disk now
static void free_host_copy(swap_state & st) {
    st.tgt.reset();
    st.dft.reset();
    st.disk.stage = disk_stage::on_disk;
}

// the file could not be had but the host copy, within the RAM budget, still holds the state: the
// slot stays parked in RAM (a RAM park from now on)
static void keep_in_ram(swap_state & st, disk_result & r) {
    st.disk.reset();
    r.outcome = disk_outcome::kept_in_ram;
}

static void fail_from(const disk_file & f, disk_result & r) {
    r.outcome = disk_outcome::lost;
    r.error   = f.error;
    r.why     = f.why;
}

disk_result disk_park(swap_state & st, swap_host & host, bool background, std::vector<uint8_t> && ref) {
    disk_result r;
    auto & d = st.disk;
    d.store      = host.disk;
    d.n_bytes[0] = st.tgt.size;
    d.n_bytes[1] = st.dft.size;
    d.ref        = std::move(ref);
    if (!background) {
        settle_copy(st, *host.copier);  // written now: the bytes must be in host RAM
    }
    // on a device the transfer to host RAM may still run: the write is queued held (its bytes taken
    // from the disk budget now) and disk_step() starts it once the transfer has settled
    const bool held = background && st.copy_in_flight;
    d.stage = held ? disk_stage::write_held : disk_stage::writing;
    d.file  = host.disk->write(st.tgt.data, st.tgt.size, st.dft.data, st.dft.size, held, r.why, r.error);
    if (!d.file) {
        if (background) {
            keep_in_ram(st, r);
        } else {
            r.outcome = disk_outcome::lost;
            st.free();
        }
        return r;
    }
    if (background) {
        return r;
    }
    // the host copy does not fit what is left of the RAM: the loop waits for the file
    if (host.disk->settle(d.file) != disk_file::status::written) {
        fail_from(*d.file, r);
        st.free();
        return r;
    }
    note_write(st, host, r);
    free_host_copy(st);
    return r;
}

disk_result disk_step(swap_state & st, swap_host & host, bool keep, bool keep_read) {
    disk_result r;
    auto & d = st.disk;
    if (!d.on() || !d.file) {
        return r;
    }
    if (d.stage == disk_stage::write_held) {
        if (!st.copy_in_flight) {
            d.stage = disk_stage::writing;
            d.store->start(d.file);
        }
        return r;
    }
    if (!d.in_ram() || !d.store->is_settled(d.file)) {
        return r;
    }
    const auto status = d.store->settle(d.file);
    if (d.stage == disk_stage::reading_ahead) {
        // read ahead, and the slot is no longer the next back while RAM is short: its RAM goes to
        // others meanwhile
        if (status == disk_file::status::read && !keep_read && d.store->unread(d.file)) {
            free_host_copy(st);
            r.outcome = disk_outcome::dropped;
        }
        return r;  // a read that failed is reported by the resume
    }
    if (status != disk_file::status::written) {
        fail_from(*d.file, r);
        keep_in_ram(st, r);
        return r;
    }
    if (d.stage == disk_stage::writing) {
        note_write(st, host, r);
    }
    if (!keep) {
        free_host_copy(st);
    }
    return r;
}

disk_result disk_park_streamed(swap_state & st, const seq_contexts & sc, const state_sizes & n, swap_host & host) {
    disk_result r;
    auto & d = st.disk;
    d.store      = host.disk;
    d.n_bytes[0] = n.tgt;
    d.n_bytes[1] = n.dft;
    d.streamed   = true;
    r.outcome    = disk_outcome::lost;
    state_stream from(sc, n);
    if (!from.lay_out(r.why)) {
        st.free();
        return r;
    }
    d.stage = disk_stage::writing;
    d.file  = host.disk->write(from, n.tgt, n.dft, r.why, r.error);
    if (!d.file || host.disk->settle(d.file) != disk_file::status::written) {
        if (d.file) {
            fail_from(*d.file, r);
        }
        st.free();
        return r;
    }
    note_write(st, host, r);
    d.stage  = disk_stage::on_disk;  // there never was a host copy
    d.layout = from.layout();
    return r;
}

disk_result disk_restore_streamed(swap_state & st, const seq_contexts & sc, swap_host & host, bool verify) {
    disk_result r;
    auto & d = st.disk;
    state_stream into(sc, { d.n_bytes[0], d.n_bytes[1] });
    into.use_layout(d.layout);
    if (verify) {
        into.check_restore();
    }
    d.stage = disk_stage::reading;
    if (!d.file || !d.store->read(d.file, into) || d.store->settle(d.file) != disk_file::status::read) {
        r.outcome = disk_outcome::lost;
        if (d.file) {
            r.error = d.file->error;
            r.why   = d.file->why;
        }
        if (r.why.empty()) {
            r.why = "its file is not readable (not written)";
        }
        into.undo();  // part of it may be in the cells: never resume on them
        st.free();
        return r;
    }
    r.bytes   = d.total();
    r.t_us    = d.file->t_us;
    if (verify) {
        r.mismatch = into.mismatch();
        r.verified = r.mismatch.found ? copy_check::wrong : copy_check::right;
        r.report   = into.devices();
    }
    if (r.mismatch.found) {
        r.outcome = disk_outcome::lost;
        r.why     = "the restored cells differ from its file's bytes";
        into.undo();  // never resume on cells that differ from what was parked
        st.free();
        return r;
    }
    r.outcome = disk_outcome::read;
    host.rates.observe_in(park_tier::disk, r.bytes, r.t_us);
    d.store->remove(d.file);
    d.file.reset();
    d.stage = disk_stage::read_back;
    return r;
}

bool disk_read_ahead(swap_state & st, swap_host & host) {
    auto & d = st.disk;
    if (d.stage != disk_stage::on_disk || d.streamed || !d.file || !alloc_buffers(st, host)) {
        return false;
    }
    if (!d.store->read(d.file, st.tgt.data, st.dft.data)) {
        st.tgt.reset();
        st.dft.reset();
        return false;
    }
    d.stage = disk_stage::reading_ahead;  // the buffers are the state's, once the read lands
    return true;
}

disk_result disk_read_back(swap_state & st, swap_host & host) {
    disk_result r;
    auto & d = st.disk;
    if (d.in_ram() && !d.reading()) {
        // the write is queued or still running, or the host copy was kept (the slot was next back):
        // the host copy is the state, the file is dropped; a write that failed since the last step
        // is counted here
        if (d.store->is_settled(d.file) && d.store->settle(d.file) == disk_file::status::failed) {
            r.error = d.file->error;
            r.why   = d.file->why;
        }
        d.store->remove(d.file);
        d.file.reset();
        d.stage   = disk_stage::read_back;
        r.outcome = disk_outcome::from_memory;
        return checked(st, r);
    }
    if (!d.reading()) {
        if (!alloc_buffers(st, host)) {
            r.outcome = disk_outcome::lost;
            r.why     = "cannot allocate host RAM to read its file back";
            st.free();
            return r;
        }
        if (!d.store->read(d.file, st.tgt.data, st.dft.data)) {
            r.outcome = disk_outcome::lost;
            r.why     = "its file is not readable (not written)";
            st.free();
            return r;
        }
        d.stage = disk_stage::reading;
    }
    r.outcome = d.stage == disk_stage::reading_ahead ? disk_outcome::read_ahead : disk_outcome::read;
    const auto status = d.store->settle(d.file);
    if (status != disk_file::status::read) {
        r.outcome = disk_outcome::lost;
        r.error   = d.file->error;
        r.why   = d.file->why;
        st.free();
        return r;
    }
    r.bytes = d.total();
    r.t_us  = d.file->t_us;
    host.rates.observe_in(park_tier::disk, r.bytes, r.t_us);
    d.store->remove(d.file);  // the disk budget gets it back now; the state is in RAM again
    d.file.reset();
    d.stage = disk_stage::read_back;
    return checked(st, r);
}

} // namespace llama_preempt
