// llama-preempt: disk parks (preempt-disk-park.h).
#include "preempt-disk-park.h"

#include <cstdio>
#include <cstring>

namespace llama_preempt {

// host buffers for the state read back, from the same warm pool as a park's
static bool alloc_buffers(swap_state & st, swap_host & host) {
    ggml_backend_buffer_type_t pinned = host.copier->host_buft();
    if (host.knobs.fail_alloc || !st.tgt.alloc(st.disk.n_bytes[0], host.pool, pinned) ||
        !st.dft.alloc(st.disk.n_bytes[1], host.pool, pinned)) {
        st.tgt.reset();
        st.dft.reset();
        return false;
    }
    st.tgt.copier = host.copier;
    st.dft.copier = host.copier;
    return true;
}

// LLAMA_SERVER_PREEMPT_VERIFY: what came back equals upstream's serialization at the park, byte for byte
static int verify(const swap_state & st) {
    const auto & ref = st.disk.ref;
    if (!st.disk.has_ref) {
        return -1;
    }
    return ref.size() == st.bytes() && memcmp(ref.data(), st.tgt.data, st.tgt.size) == 0 &&
           (st.dft.size == 0 || memcmp(ref.data() + st.tgt.size, st.dft.data, st.dft.size) == 0) ? 1 : 0;
}

static bool start_write(swap_state & st, swap_host & host, disk_result & r) {
    st.disk.pending = false;
    st.disk.file    = host.disk->write(st.tgt.data, st.tgt.size, st.dft.data, st.dft.size, r.why, r.error);
    r.ok = st.disk.file != nullptr;
    return r.ok;
}

// the file holds the state: the host copy goes back to the pool (the RAM budget gets it back)
static void finish_write(swap_state & st, swap_host & host, disk_result & r) {
    r.bytes = st.disk.total();
    r.t_us  = st.disk.file->t_us;
    host.rates.observe_disk_write(r.bytes, r.t_us);
    st.tgt.reset();
    st.dft.reset();
    st.disk.in_ram = false;
}

// a write failed after the park: the state is gone (file and host copy); the slot stays parked on
// the disk tier with the error, and its resume recomputes
static void lose(swap_state & st, const disk_result & r) {
    auto & d = st.disk;
    if (d.file) {
        d.store->remove(d.file);
        d.file.reset();
    }
    d.error   = r.error;
    d.why     = r.why;
    d.in_ram  = false;
    d.reading = false;
    d.pending = false;
    st.tgt.reset();
    st.dft.reset();
}

disk_result disk_park(swap_state & st, swap_host & host, bool background, std::vector<uint8_t> && ref, int verified) {
    disk_result r;
    auto & d = st.disk;
    d.store        = host.disk;
    d.n_bytes[0]   = st.tgt.size;
    d.n_bytes[1]   = st.dft.size;
    d.in_ram       = true;
    d.has_ref      = verified >= 0;
    d.ref          = std::move(ref);
    if (background && st.copy_in_flight) {
        d.pending = true;  // disk_step() starts the write once the transfer has settled
        return r;
    }
    settle_copy(st, *host.copier);
    if (!start_write(st, host, r)) {
        st.free();
        return r;
    }
    if (background) {
        return r;
    }
    // the host copy does not fit what is left of the RAM: the loop waits for the file
    if (host.disk->settle(d.file) != disk_file::status::written) {
        r.ok    = false;
        r.error = d.file->error;
        r.why   = d.file->why;
        st.free();
        return r;
    }
    finish_write(st, host, r);
    return r;
}

disk_result disk_step(swap_state & st, swap_host & host, bool & written) {
    disk_result r;
    written = false;
    auto & d = st.disk;
    if (!d.on() || d.failed()) {
        return r;
    }
    if (d.pending) {
        if (!st.copy_in_flight && !start_write(st, host, r)) {
            lose(st, r);
        }
        return r;
    }
    if (!d.file || !d.in_ram || d.reading || !d.store->is_settled(d.file)) {
        return r;
    }
    if (d.store->settle(d.file) == disk_file::status::written) {
        finish_write(st, host, r);
        written = true;
        return r;
    }
    r.ok    = false;
    r.error = d.file->error;
    r.why   = d.file->why;
    lose(st, r);
    return r;
}

bool disk_read_ahead(swap_state & st, swap_host & host) {
    auto & d = st.disk;
    if (!d.on() || d.failed() || d.in_ram || d.reading || !d.file || !alloc_buffers(st, host)) {
        return false;
    }
    if (!d.store->read(d.file, st.tgt.data, st.dft.data)) {
        st.tgt.reset();
        st.dft.reset();
        return false;
    }
    d.in_ram     = true;  // the buffers are the state's, once the read lands
    d.reading    = true;
    d.read_ahead = true;
    return true;
}

disk_result disk_read_back(swap_state & st, swap_host & host) {
    disk_result r;
    auto & d = st.disk;
    if (d.failed()) {
        // counted when the write failed (disk_step)
        r.ok  = false;
        r.why = "its file was lost before the resume (" + d.why + ")";
        st.free();
        return r;
    }
    if (d.pending || (d.in_ram && !d.reading)) {
        // the write is queued or still running: the host copy is the state, the file is dropped
        if (d.file) {
            d.store->remove(d.file);
            d.file.reset();
        }
        d.pending     = false;
        r.from_memory = true;
        r.verified    = verify(st);
        return r;
    }
    if (!d.reading) {
        if (!alloc_buffers(st, host)) {
            r.ok  = false;
            r.why = "cannot allocate host RAM to read its file back";
            st.free();
            return r;
        }
        if (!d.store->read(d.file, st.tgt.data, st.dft.data)) {
            r.ok  = false;
            r.why = "its file is not readable (not written)";
            st.free();
            return r;
        }
        d.in_ram     = true;
        d.reading    = true;
        d.read_ahead = false;
    }
    r.read_ahead = d.read_ahead;
    const auto status = d.store->settle(d.file);
    d.reading = false;
    if (status != disk_file::status::read) {
        r.ok    = false;
        r.error = d.file->error;
        r.why   = d.file->why;
        st.free();
        return r;
    }
    r.bytes = d.total();
    r.t_us  = d.file->t_us;
    host.rates.observe_disk_read(r.bytes, r.t_us);
    d.store->remove(d.file);  // the disk budget gets it back now; the state is in RAM again
    d.file.reset();
    r.verified = verify(st);
    return r;
}

std::string describe_disk(const swap_state & st) {
    const auto & d = st.disk;
    char line[512];
    snprintf(line, sizeof(line), "disk park: %.2f MiB %s%s%s%s", d.total() / 1048576.0,
             d.file ? d.file->path.c_str() : "(no file)", d.pending ? ", write waits for the transfer" : "",
             d.in_ram ? ", host copy held" : ", only on disk", d.failed() ? ", lost" : "");
    return line;
}

} // namespace llama_preempt
