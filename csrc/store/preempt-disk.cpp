// llama-preempt: the disk tier's files and its I/O thread (preempt-disk.h); what the thread does
// with one file, its write and its read, is preempt-disk-file.cpp.
#include "preempt-disk.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

namespace llama_preempt {

namespace {

constexpr size_t HEADER = disk_store::HEADER_BYTES;

int64_t now_us() {
    return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

} // namespace

std::shared_ptr<disk_store> disk_store::open(const std::string & dir, size_t budget, const disk_knobs & knobs, std::string & err,
                                             const std::string & cache_key, std::string * cache_note) {
    // that `dir` is a directory we may write in was checked before the model loaded (preempt-params.h)
    std::shared_ptr<disk_store> s(new disk_store());
    s->budget_          = budget;
    s->knobs_           = knobs;
    // --cache-persist: a directory kept across restarts, else (or when it cannot be had) our own
    s->persistent_ = !cache_key.empty() && open_cache_dir(dir, cache_key, s->dir_, cache_note ? *cache_note : err, s->n_stale_removed_);
    if (!s->persistent_ && !make_own_dir(dir, knobs.first_name, s->dir_, err)) {
        return nullptr;
    }
    s->n_stale_removed_ += remove_stale_dirs(s->dir_);
    s->worker_  = std::thread([p = s.get()] { p->run(); });
    return s;
}

disk_store::~disk_store() {
    {
        std::lock_guard<std::mutex> lk(mu_);
        stop_   = true;
        cancel_ = true;
    }
    cv_work_.notify_all();
    if (worker_.joinable()) {
        worker_.join();
    }
    const std::string path = dir_.path;
    const auto left = persistent_ ? close_cache_dir(dir_, keep_) : remove_own_dir(dir_);
    if (!left.empty()) {
        std::string names;
        for (const auto & l : left) {
            names += (names.empty() ? "" : "; ") + l;
        }
        note(true, "preemption: the disk tier's directory " + path + " could not be emptied at exit, left behind: " + names);
    }
}

// under mu_: what is left of the budget (--preempt-disk-mib)
size_t disk_store::budget_left_locked() const {
    return budget_ - std::min(budget_, bytes_held_);
}

// under mu_: the filesystem's free bytes beyond the reserve, less what is queued and not on the disk
// yet (the disk does not see it); UINT64_MAX when the filesystem cannot be asked
uint64_t disk_store::disk_left_locked() const {
    struct statvfs vfs;
    if (fstatvfs(dir_.fd, &vfs) != 0) {
        return UINT64_MAX;
    }
    const uint64_t avail = (uint64_t) vfs.f_bavail * vfs.f_frsize;
    const uint64_t taken = RESERVE + bytes_unwritten_;
    return avail > taken ? avail - taken : 0;
}

// under mu_: the bytes of state a new file may take (its header aside): the lesser of what is left
// of the budget and of the disk
size_t disk_store::room_locked() const {
    const size_t room = std::min<uint64_t>(budget_left_locked(), disk_left_locked());
    return room > HEADER ? room - HEADER : 0;
}

size_t disk_store::room() const {
    std::lock_guard<std::mutex> lk(mu_);
    return room_locked();
}

std::shared_ptr<disk_file> disk_store::write(const uint8_t * a, size_t n_a, const uint8_t * b, size_t n_b, bool held,
                                             std::string & why, disk_error & error, std::vector<uint8_t> meta) {
    auto f = std::make_shared<disk_file>();
    f->n_bytes[0] = n_a;
    f->n_bytes[1] = n_b;
    f->src[0]     = a;
    f->src[1]     = b;
    f->meta       = std::move(meta);
    return queue_write(std::move(f), held, why, error);
}

std::shared_ptr<disk_file> disk_store::write(disk_stream & from, size_t n_a, size_t n_b, std::string & why, disk_error & error,
                                             std::vector<uint8_t> meta) {
    auto f = std::make_shared<disk_file>();
    f->n_bytes[0] = n_a;
    f->n_bytes[1] = n_b;
    f->stream     = &from;
    f->meta       = std::move(meta);
    return queue_write(std::move(f), false, why, error);
}

std::shared_ptr<disk_file> disk_store::queue_write(std::shared_ptr<disk_file> f, bool held, std::string & why, disk_error & error) {
    {
        std::lock_guard<std::mutex> lk(mu_);
        remake_if_gone_locked();
        const size_t room = room_locked();
        if (f->total() > room) {
            const bool budget = budget_left_locked() < f->total() + HEADER;
            why   = budget ? "the disk budget (--preempt-disk-mib) has no room left"
                           : "the disk is full (" + std::to_string(room >> 20) + " MiB free beyond its reserve)";
            error = disk_error::full;
            if (!budget) {
                count_full_locked(why);
            }
            return nullptr;
        }
        f->name = park_file_name(++n_files_);
        f->path = dir_.path + "/" + f->name;
        bytes_held_      += f->total();
        bytes_unwritten_ += f->total();
        n_writing_       += 1;
        f->counted   = true;
        f->unwritten = true;
        f->held      = held;
        f->st        = disk_file::status::queued_write;
        f->busy      = true;
        queue_.push_back(f);
    }
    cv_work_.notify_all();
    return f;
}

void disk_store::start(const std::shared_ptr<disk_file> & f) {
    {
        std::lock_guard<std::mutex> lk(mu_);
        f->held = false;
    }
    cv_work_.notify_all();
}

bool disk_store::unread(const std::shared_ptr<disk_file> & f) {
    std::lock_guard<std::mutex> lk(mu_);
    if (f->busy || f->st != disk_file::status::read) {
        return false;
    }
    f->st = disk_file::status::written;
    f->dst[0] = f->dst[1] = nullptr;
    return true;
}

bool disk_store::read(const std::shared_ptr<disk_file> & f, uint8_t * a, uint8_t * b) {
    {
        std::lock_guard<std::mutex> lk(mu_);
        if (f->busy || f->st != disk_file::status::written) {
            return false;
        }
        f->dst[0] = a;
        f->dst[1] = b;
        f->stream = nullptr;
    }
    return queue_read(f);
}

bool disk_store::read(const std::shared_ptr<disk_file> & f, disk_stream & into) {
    {
        std::lock_guard<std::mutex> lk(mu_);
        if (f->busy || f->st != disk_file::status::written) {
            return false;
        }
        f->dst[0] = f->dst[1] = nullptr;
        f->stream = &into;
    }
    return queue_read(f);
}

bool disk_store::queue_read(const std::shared_ptr<disk_file> & f) {
    {
        std::lock_guard<std::mutex> lk(mu_);
        f->st   = disk_file::status::queued_read;
        f->busy = true;
        queue_.push_back(f);
    }
    cv_work_.notify_all();
    return true;
}

disk_file::status disk_store::settle(const std::shared_ptr<disk_file> & f) {
    std::unique_lock<std::mutex> lk(mu_);
    cv_done_.wait(lk, [&] { return !f->busy; });
    return f->st;
}

bool disk_store::is_settled(const std::shared_ptr<disk_file> & f) const {
    std::lock_guard<std::mutex> lk(mu_);
    return !f->busy;
}

void disk_store::uncount(disk_file & f) {
    if (f.counted) {
        bytes_held_ -= std::min(bytes_held_, f.total());
        f.counted = false;
    }
    settle_unwritten(f);
}

void disk_store::settle_unwritten(disk_file & f) {
    if (f.unwritten) {
        bytes_unwritten_ -= std::min(bytes_unwritten_, f.total());
        f.unwritten = false;
    }
}

void disk_store::remove(const std::shared_ptr<disk_file> & f) {
    if (!f) {
        return;
    }
    std::unique_lock<std::mutex> lk(mu_);
    if (f->st == disk_file::status::removed) {
        return;
    }
    auto it = std::find(queue_.begin(), queue_.end(), f);
    if (it != queue_.end()) {
        queue_.erase(it);
        n_writing_ -= f->st == disk_file::status::queued_write ? 1 : 0;
        f->busy = false;
    } else if (current_ == f) {
        cancel_ = true;
        cv_work_.notify_all();  // a write held in flight by the test knob stops waiting
        cv_done_.wait(lk, [&] { return current_ != f; });
    }
    uncount(*f);
    f->st = disk_file::status::removed;
    lk.unlock();
    unlinkat(dir_.fd, f->name.c_str(), 0);  // a link planted in its place goes, never what it points at
}

size_t disk_store::bytes_held() const {
    std::lock_guard<std::mutex> lk(mu_);
    return bytes_held_;
}

int32_t disk_store::n_writes_in_flight() const {
    std::lock_guard<std::mutex> lk(mu_);
    return n_writing_;
}

bool disk_store::cancelled() const {
    std::lock_guard<std::mutex> lk(mu_);
    return cancel_;
}

// under mu_: a streamed state first, then a read (a resume soon waits for it), else the oldest write that may start
std::deque<std::shared_ptr<disk_file>>::iterator disk_store::next_job() {
    // a streamed state first: the loop waits for it (it holds the contexts), not for a background write
    auto it = std::find_if(queue_.begin(), queue_.end(), [](const auto & f) { return f->stream != nullptr; });
    if (it == queue_.end()) {
        it = std::find_if(queue_.begin(), queue_.end(), [](const auto & f) { return f->st == disk_file::status::queued_read; });
    }
    if (it == queue_.end()) {
        it = std::find_if(queue_.begin(), queue_.end(), [](const auto & f) { return !f->held; });
    }
    return it;
}

void disk_store::run() {
    std::unique_lock<std::mutex> lk(mu_);
    while (true) {
        cv_work_.wait(lk, [&] { return stop_ || next_job() != queue_.end(); });
        if (stop_) {
            return;
        }
        auto it = next_job();
        std::shared_ptr<disk_file> f = *it;
        queue_.erase(it);
        const bool writing = f->st == disk_file::status::queued_write;
        f->st    = writing ? disk_file::status::writing : disk_file::status::reading;
        current_ = f;
        cancel_  = false;
        lk.unlock();

        std::string why;
        uint64_t    sum = 0;
        const int64_t t0  = now_us();
        disk_error    err = writing ? do_write(*f, why, sum) : do_read(*f, why);
        const int64_t t_us = now_us() - t0;

        lk.lock();
        if (writing && err == disk_error::none && knobs_.hold_us > 0) {
            // LLAMA_SERVER_PREEMPT_DISK_HOLD_MS: the write stays in flight (a resume reads from memory)
            cv_work_.wait_for(lk, std::chrono::microseconds(std::max<int64_t>(0, knobs_.hold_us - t_us)),
                              [&] { return cancel_ || stop_; });
        }
        if (cancel_) {
            err = disk_error::cancelled;
            why = "cancelled";
        }
        f->error = err;
        f->why   = why;
        f->t_us  = t_us;
        if (writing) {
            n_writing_ -= 1;
            settle_unwritten(*f);  // on the disk now, or gone
            if (err == disk_error::none) {
                f->checksum = sum;
                f->st       = disk_file::status::written;
                if (full_episode_) {
                    full_episode_ = false;  // a write succeeds again: the next full disk is a new episode
                    note(false, "preemption: the disk tier's filesystem has room again: a file was written");
                }
            } else {
                if (err == disk_error::full) {
                    count_full_locked(why);
                }
                f->st = disk_file::status::failed;
                uncount(*f);  // the file is gone: its budget comes back
                unlinkat(dir_.fd, f->name.c_str(), 0);
            }
        } else {
            // a read that failed leaves the file to its owner, who recomputes and removes it
            f->st = err == disk_error::none ? disk_file::status::read : disk_file::status::failed;
        }
        f->busy   = false;
        f->stream = nullptr;  // the caller's, gone once it has waited for this
        current_  = nullptr;
        cancel_  = false;
        cv_done_.notify_all();
    }
}

} // namespace llama_preempt
