// llama-preempt: upstream's prompt cache, one tier down (preempt-prompt-disk.h).
#include "preempt-prompt-disk.h"

#include <algorithm>

namespace llama_preempt {

prompt_disk::~prompt_disk() {
    while (!files_.empty()) {
        drop(files_.size() - 1);
    }
}

void prompt_disk::drop(size_t i) {
    store_->remove(files_[i].file);  // waits for the I/O thread to let go of its bytes
    files_.erase(files_.begin() + (std::ptrdiff_t) i);
}

bool prompt_disk::spill(std::vector<llama_token> tokens, std::vector<uint8_t> && tgt, std::vector<uint8_t> && dft, std::string & why) {
    entry e;
    e.tokens = std::move(tokens);
    e.tgt    = std::move(tgt);
    e.dft    = std::move(dft);
    disk_error error = disk_error::none;
    e.file = store_->write(e.tgt.data(), e.tgt.size(), e.dft.data(), e.dft.size(), false, why, error);
    if (!e.file) {
        return false;
    }
    files_.push_back(std::move(e));  // the vectors' buffers move with it: the store's pointers stay valid
    return true;
}

static size_t common_prefix(const std::vector<llama_token> & a, const std::vector<llama_token> & b) {
    const size_t n = std::min(a.size(), b.size());
    size_t i = 0;
    while (i < n && a[i] == b[i]) {
        ++i;
    }
    return i;
}

int32_t prompt_disk::best(const std::vector<llama_token> & tokens, size_t & n_common) const {
    int32_t best = -1;
    n_common = 0;
    for (size_t i = 0; i < files_.size(); ++i) {
        const size_t n = common_prefix(files_[i].tokens, tokens);
        if (n * 4 >= files_[i].tokens.size() && n > n_common) {
            best     = (int32_t) i;
            n_common = n;
        }
    }
    return best;
}

bool prompt_disk::take(int32_t i, prompt_read & out, std::string & why, disk_error & error) {
    auto & e = files_[i];
    bool ok = store_->settle(e.file) == disk_file::status::written;  // a write still running finishes first
    if (ok) {
        out.tgt.resize(e.file->n_bytes[0]);
        out.dft.resize(e.file->n_bytes[1]);
        ok = store_->read(e.file, out.tgt.data(), out.dft.data()) && store_->settle(e.file) == disk_file::status::read;
    }
    if (!ok) {
        why   = e.file->why.empty() ? "its file was not written" : e.file->why;
        error = e.file->error == disk_error::none ? disk_error::read : e.file->error;
    } else {
        out.tokens = std::move(e.tokens);
        out.t_us   = e.file->t_us;
    }
    drop((size_t) i);
    return ok;
}

int32_t prompt_disk::step() {
    int32_t n_failed = 0;
    for (size_t i = 0; i < files_.size();) {
        auto & e = files_[i];
        if (!e.written && store_->is_settled(e.file)) {
            if (store_->settle(e.file) != disk_file::status::written) {
                drop(i);
                ++n_failed;
                continue;
            }
            e.written = true;
            e.tgt = {};  // on disk now: the host copy goes
            e.dft = {};
        }
        ++i;
    }
    return n_failed;
}

size_t prompt_disk::make_room(size_t n) {
    size_t freed = 0;
    while (!files_.empty() && store_->room() < n) {
        freed += files_.front().file->total();
        drop(0);
    }
    return freed;
}

size_t prompt_disk::bytes_held() const {
    size_t n = 0;
    for (const auto & e : files_) {
        n += e.file->total();
    }
    return n;
}

} // namespace llama_preempt
