// llama-preempt: upstream's prompt cache, one tier down (preempt-prompt-disk.h).
#include "preempt-prompt-disk.h"

#include "preempt-disk-io.h"

#include <algorithm>
#include <cstring>
#include <type_traits>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace llama_preempt {

prompt_disk::~prompt_disk() {
    forget_ahead();  // the I/O thread lets go of a read ahead's buffers before they go
    // --cache-persist: the files written stay for the next run, listed in the index
    std::vector<std::string> keep;
    if (!keep_key_.empty() && store_->persistent()) {
        for (size_t i = 0; i < files_.size();) {
            if (files_[i].written || store_->settle(files_[i].file) == disk_file::status::written) {
                keep.push_back(files_[i].file->name);
                ++i;
            } else {
                drop(i);
            }
        }
        if (!save_index()) {
            keep.clear();
        }
        store_->keep_at_close(keep);
    }
    if (keep.empty()) {
        while (!files_.empty()) {
            drop(files_.size() - 1);
        }
    }
}

namespace {

constexpr char INDEX_MAGIC[8] = { 'L', 'P', 'P', 'C', 'I', 'D', 'X', '2' };  // 2: each file's tail

uint64_t hash_of(const uint8_t * p, size_t n) {
    disk_hasher h;
    h.update(p, n);
    return h.digest();
}

} // namespace

bool prompt_disk::save_index() {
    std::vector<uint8_t> out;
    put_bytes(out, INDEX_MAGIC, sizeof(INDEX_MAGIC));
    put_value(out, (uint32_t) keep_key_.size());
    put_bytes(out, keep_key_.data(), keep_key_.size());
    put_value(out, (uint32_t) files_.size());
    for (const auto & e : files_) {
        put_value(out, (uint32_t) e.file->name.size());
        put_bytes(out, e.file->name.data(), e.file->name.size());
        put_value(out, (uint64_t) e.file->n_bytes[0]);
        put_value(out, (uint64_t) e.file->n_bytes[1]);
        put_value(out, e.file->checksum);
        put_value(out, (uint64_t) e.n_tail);
        put_value(out, (uint32_t) e.tokens.size());
        put_bytes(out, e.tokens.data(), e.tokens.size() * sizeof(llama_token));
    }
    put_value(out, hash_of(out.data(), out.size()));
    const int dir = store_->dir_fd();
    const int fd = openat(dir, "index.new", O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) {
        return false;
    }
    const bool ok = write_all(fd, out.data(), out.size(), 0) && fsync(fd) == 0;
    close(fd);
    return ok && renameat(dir, "index.new", dir, "index") == 0;
}

prompt_disk::load_result prompt_disk::load_index(const std::string & key) {
    load_result res;
    const int dir = store_->dir_fd();
    std::vector<uint8_t> in;
    const int fd = openat(dir, "index", O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    struct stat st;
    if (fd >= 0 && fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid() && st.st_size >= 16) {
        in.resize((size_t) st.st_size);
        if (!read_all(fd, in.data(), in.size(), 0)) {
            in.clear();
        }
    }
    if (fd >= 0) {
        close(fd);
    }
    unlinkat(dir, "index", 0);  // used once: a run that crashes leaves no index that lists files it removed
    std::vector<std::string> taken;
    uint64_t sum = 0;
    if (in.size() >= 16) {
        memcpy(&sum, in.data() + in.size() - 8, 8);
    }
    if (in.size() >= 16 && sum == hash_of(in.data(), in.size() - 8) && memcmp(in.data(), INDEX_MAGIC, 8) == 0) {
        in.resize(in.size() - 8);
        byte_reader r { in, 8 };
        uint32_t n_key = 0, n = 0;
        std::string k;
        bool ok = r.get(n_key) && n_key < 256 && (k.resize(n_key), r.get(k.data(), n_key)) && k == key && r.get(n);
        for (uint32_t i = 0; ok && i < n; ++i) {
            uint32_t n_name = 0, n_tok = 0;
            uint64_t n0 = 0, n1 = 0, checksum = 0, n_tail = 0;
            std::string name;
            entry e;
            ok = r.get(n_name) && n_name < 64 && (name.resize(n_name), r.get(name.data(), n_name)) && r.get(n0) && r.get(n1) &&
                 r.get(checksum) && r.get(n_tail) && n_tail <= n1 && r.get(n_tok) && n_tok <= r.left() / sizeof(llama_token) &&
                 (e.tokens.resize(n_tok), r.get(e.tokens.data(), n_tok * sizeof(llama_token)));
            if (ok && (e.file = store_->adopt(name, n0, n1, checksum))) {
                e.written = true;
                e.n_tail  = (size_t) n_tail;
                taken.push_back(name);
                files_.push_back(std::move(e));
            }
        }
    }
    // what no index lists (a crashed run's files, a park's) goes
    for (const auto & name : store_->file_names()) {
        if (std::find(taken.begin(), taken.end(), name) == taken.end()) {
            struct stat fs;
            if (fstatat(dir, name.c_str(), &fs, AT_SYMLINK_NOFOLLOW) == 0 && (S_ISREG(fs.st_mode) || S_ISLNK(fs.st_mode)) &&
                unlinkat(dir, name.c_str(), 0) == 0) {
                ++res.n_unlisted;
            }
        }
    }
    // a smaller --preempt-disk-mib than the last run's, or a run without one: the oldest go first
    while (!files_.empty() && bytes_held() > store_->budget()) {
        res.n_over++;
        res.bytes_over += files_.front().file->total();
        drop(0);
    }
    res.n_taken = (int32_t) files_.size();
    res.bytes   = bytes_held();
    return res;
}

void prompt_disk::drop(size_t i) {
    store_->remove(files_[i].file);  // waits for the I/O thread to let go of its bytes
    files_.erase(files_.begin() + (std::ptrdiff_t) i);
}

prompt_disk::step_result prompt_disk::finish_writes() {
    for (auto & w : files_) {
        if (!w.written) {
            store_->settle(w.file);
        }
    }
    return step();
}

bool prompt_disk::spill(std::vector<llama_token> tokens, std::vector<uint8_t> && tgt, std::vector<uint8_t> && dft,
                        std::vector<uint8_t> && tail, std::string & why) {
    entry e;
    e.tokens = std::move(tokens);
    e.tgt    = std::move(tgt);
    e.dft    = std::move(dft);
    e.n_tail = tail.size();
    if (e.dft.empty()) {
        e.dft = std::move(tail);  // no draft context: the tail is the whole second part, not copied
    } else {
        e.dft.insert(e.dft.end(), tail.begin(), tail.end());
    }
    disk_error error = disk_error::none;
    e.file = store_->write(e.tgt.data(), e.tgt.size(), e.dft.data(), e.dft.size(), false, why, error);
    if (!e.file) {
        return false;
    }
    static_assert(std::is_nothrow_move_constructible<entry>::value, "files_ must move its entries' buffers, never copy them");
    files_.push_back(std::move(e));  // the vectors' buffers move with it: the store's pointers stay valid
    return true;
}

bool prompt_disk::write_streamed(std::vector<llama_token> tokens, disk_stream & from, size_t n0, size_t n1, size_t n_tail,
                                 stream_layout layout, std::string & why, disk_error & error) {
    entry e;
    e.tokens = std::move(tokens);
    e.n_tail = n_tail;
    e.layout = std::move(layout);
    e.file = store_->write(from, n0, n1, why, error);
    if (!e.file) {
        return false;
    }
    if (store_->settle(e.file) != disk_file::status::written) {
        why   = e.file->why;
        error = e.file->error;
        store_->remove(e.file);
        return false;
    }
    e.written = true;
    files_.push_back(std::move(e));
    return true;
}

bool prompt_disk::take_streamed(int32_t i, disk_stream & into, std::vector<llama_token> & tokens, int64_t & t_us,
                                std::string & why, disk_error & error) {
    auto & e = files_[i];
    if (e.reading_ahead) {
        // its bytes read ahead into host RAM are not wanted: the file is streamed into the slot instead
        store_->settle(e.file);
        store_->unread(e.file);
        e.ahead = {};
        e.reading_ahead = false;
    }
    const bool ok = store_->settle(e.file) == disk_file::status::written && store_->read(e.file, into) &&
                    store_->settle(e.file) == disk_file::status::read;
    if (!ok) {
        why   = e.file->why.empty() ? "its file was not written" : e.file->why;
        error = e.file->error == disk_error::none ? disk_error::read : e.file->error;
    } else {
        tokens = std::move(e.tokens);
        t_us   = e.file->t_us;
    }
    drop((size_t) i);
    return ok;
}

std::vector<prompt_file_view> prompt_disk::views() const {
    std::vector<prompt_file_view> v;
    v.reserve(files_.size());
    for (const auto & e : files_) {
        v.push_back({ e.tokens.data(), e.tokens.size(), e.file->total(), e.written });
    }
    return v;
}

bool prompt_disk::read_ahead(int32_t i) {
    auto & e = files_[i];
    if (!e.written) {
        return false;
    }
    e.ahead.tgt.resize(e.file->n_bytes[0]);
    e.ahead.dft.resize(e.file->n_bytes[1]);
    e.reading_ahead = store_->read(e.file, e.ahead.tgt.data(), e.ahead.dft.data());
    if (!e.reading_ahead) {
        e.ahead = {};
    }
    return e.reading_ahead;
}

int32_t prompt_disk::find(const std::shared_ptr<disk_file> & f) const {
    for (size_t i = 0; i < files_.size(); ++i) {
        if (files_[i].file == f) {
            return (int32_t) i;
        }
    }
    return -1;
}

int32_t prompt_disk::ahead() const {
    for (size_t i = 0; i < files_.size(); ++i) {
        if (files_[i].reading_ahead) {
            return (int32_t) i;
        }
    }
    return -1;
}

size_t prompt_disk::bytes_ahead() const {
    const int32_t i = ahead();
    return i < 0 ? 0 : files_[i].file->total();
}

bool prompt_disk::forget_ahead() {
    const int32_t i = ahead();
    if (i < 0) {
        return false;
    }
    auto & e = files_[i];
    const bool failed = store_->settle(e.file) != disk_file::status::read;  // the I/O thread lets go of the buffers first
    if (failed) {
        drop((size_t) i);
    } else {
        store_->unread(e.file);  // written, and only that again
        e.ahead = {};
        e.reading_ahead = false;
    }
    return failed;
}

bool prompt_disk::take(int32_t i, prompt_read & out, std::string & why, disk_error & error) {
    auto & e = files_[i];
    bool ok = false;
    if (e.reading_ahead) {  // read while its request waited: what is left of the read, if anything
        ok = store_->settle(e.file) == disk_file::status::read;
        out.tgt = std::move(e.ahead.tgt);
        out.dft = std::move(e.ahead.dft);
    } else if (store_->settle(e.file) == disk_file::status::written) {  // a write still running finishes first
        out.tgt.resize(e.file->n_bytes[0]);
        out.dft.resize(e.file->n_bytes[1]);
        ok = store_->read(e.file, out.tgt.data(), out.dft.data()) && store_->settle(e.file) == disk_file::status::read;
    }
    if (!ok) {
        why   = e.file->why.empty() ? "its file was not written" : e.file->why;
        error = e.file->error == disk_error::none ? disk_error::read : e.file->error;
    } else {
        out.tail.assign(out.dft.end() - (std::ptrdiff_t) e.n_tail, out.dft.end());
        out.dft.resize(out.dft.size() - e.n_tail);
        out.dft.shrink_to_fit();  // the cache counts its size: no tail's capacity left behind
        out.tokens = std::move(e.tokens);
        out.t_us   = e.file->t_us;
    }
    drop((size_t) i);
    return ok;
}

prompt_disk::step_result prompt_disk::step() {
    step_result r;
    for (size_t i = 0; i < files_.size();) {
        auto & e = files_[i];
        if (!e.written && store_->is_settled(e.file)) {
            if (store_->settle(e.file) != disk_file::status::written) {
                drop(i);
                ++r.n_failed;
                continue;
            }
            e.written = true;
            // on disk now: the host copy goes (swapped out: `v = {}` would keep the vector's capacity)
            std::vector<uint8_t>().swap(e.tgt);
            std::vector<uint8_t>().swap(e.dft);
            ++r.n_freed;
        }
        ++i;
    }
    return r;
}

size_t prompt_disk::drop_oldest(size_t n) {
    size_t freed = 0;
    for (; n > 0 && !files_.empty(); --n) {
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
