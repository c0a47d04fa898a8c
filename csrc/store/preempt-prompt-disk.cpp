// llama-preempt: upstream's prompt cache, one tier down (preempt-prompt-disk.h).
#include "preempt-prompt-disk.h"

#include "preempt-disk-io.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
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

// 3: the index lists names only, in order (each file carries its own tokens); 2 listed them too
constexpr char INDEX_MAGIC[8] = { 'L', 'P', 'P', 'C', 'I', 'D', 'X', '3' };

uint64_t hash_of(const uint8_t * p, size_t n) {
    disk_hasher h;
    h.update(p, n);
    return h.digest();
}

// a prompt file's record (disk_file::meta): the tail's bytes, then its tokens
std::vector<uint8_t> prompt_meta(const std::vector<llama_token> & tokens, size_t n_tail) {
    std::vector<uint8_t> out;
    put_value(out, (uint64_t) n_tail);
    put_value(out, (uint32_t) tokens.size());
    put_bytes(out, tokens.data(), tokens.size() * sizeof(llama_token));
    return out;
}

bool parse_prompt_meta(const std::vector<uint8_t> & meta, size_t n1, std::vector<llama_token> & tokens, size_t & n_tail) {
    byte_reader r { meta };
    uint64_t tail = 0;
    uint32_t n_tok = 0;
    if (!r.get(tail) || tail > n1 || !r.get(n_tok) || n_tok == 0 || (size_t) n_tok * sizeof(llama_token) != r.left()) {
        return false;
    }
    tokens.resize(n_tok);
    n_tail = (size_t) tail;
    return r.get(tokens.data(), n_tok * sizeof(llama_token));
}

// the park-<n>.kv name's number: the order files were written in (oldest first)
unsigned long long file_number(const std::string & name) {
    unsigned long long n = 0;
    return sscanf(name.c_str(), "park-%llu.kv", &n) == 1 ? n : 0;
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

// The last run's index: the names it kept, oldest first. False with `why` when there is none, or
// it cannot be read, is cut short, fails its checksum, or is of another version or key.
static bool read_index(int dir, const std::string & key, std::vector<std::string> & names, std::string & why) {
    std::vector<uint8_t> in;
    const int fd = openat(dir, "index", O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    struct stat st;
    if (fd < 0) {
        why = errno == ELOOP ? "a link in its place, not read" : "missing";
        unlinkat(dir, "index", 0);  // a link goes, never what it points at
        return false;
    }
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid() && st.st_size >= 16 && st.st_size < (64 << 20)) {
        in.resize((size_t) st.st_size);
        if (!read_all(fd, in.data(), in.size(), 0)) {
            in.clear();
        }
    }
    close(fd);
    unlinkat(dir, "index", 0);  // used once: a run that crashes leaves no index that lists files it removed
    uint64_t sum = 0;
    if (in.size() >= 16) {
        memcpy(&sum, in.data() + in.size() - 8, 8);
    }
    if (in.size() < 16 || sum != hash_of(in.data(), in.size() - 8)) {
        why = "damaged (cut short, or changed: its checksum fails)";
        return false;
    }
    if (memcmp(in.data(), INDEX_MAGIC, 8) != 0) {
        why = "of an older version";
        return false;
    }
    in.resize(in.size() - 8);
    byte_reader r { in, 8 };
    uint32_t n_key = 0, n = 0;
    std::string k;
    if (!(r.get(n_key) && n_key < 256 && (k.resize(n_key), r.get(k.data(), n_key)) && k == key && r.get(n))) {
        why = "of another model or flags";
        return false;
    }
    for (uint32_t i = 0; i < n; ++i) {
        uint32_t n_name = 0;
        std::string name;
        if (!(r.get(n_name) && n_name < 64 && (name.resize(n_name), r.get(name.data(), n_name)))) {
            why = "damaged (its entries do not parse)";
            names.clear();
            return false;
        }
        names.push_back(std::move(name));
    }
    return true;
}

prompt_disk::load_result prompt_disk::load_index(const std::string & key) {
    load_result res;
    const int dir = store_->dir_fd();
    std::vector<std::string> listed;
    res.index_ok = read_index(dir, key, listed, res.index_why);
    // the listed files first, in the index's order (oldest first); then the others by the order
    // they were written in: each carries its own tokens, so a file the index does not list (the
    // index damaged or missing, a crash) is taken back from itself when it checks out
    std::vector<std::string> names = store_->file_names();
    std::sort(names.begin(), names.end(), [](const std::string & a, const std::string & b) {
        return file_number(a) < file_number(b);
    });
    std::vector<std::string> order;
    for (const auto & name : listed) {
        if (std::find(names.begin(), names.end(), name) != names.end() && std::find(order.begin(), order.end(), name) == order.end()) {
            order.push_back(name);
        }
    }
    for (const auto & name : names) {
        if (std::find(order.begin(), order.end(), name) == order.end()) {
            order.push_back(name);
        }
    }
    for (const auto & name : order) {
        const bool is_listed = std::find(listed.begin(), listed.end(), name) != listed.end();
        std::vector<uint8_t> meta;
        std::string why;
        entry e;
        if ((e.file = store_->adopt(name, meta, why))) {
            if (meta.empty()) {
                why = "";  // a parked slot's file (a crashed run's): no tokens, never a cached prompt
            } else if (parse_prompt_meta(meta, e.file->n_bytes[1], e.tokens, e.n_tail)) {
                e.written = true;
                res.n_rebuilt += is_listed ? 0 : 1;
                files_.push_back(std::move(e));
                continue;
            } else {
                why = "its tokens do not parse";
            }
            store_->remove(e.file);
        } else {
            struct stat fs;  // what it is, gone: a link is unlinked, never followed
            if (fstatat(dir, name.c_str(), &fs, AT_SYMLINK_NOFOLLOW) == 0 && (S_ISREG(fs.st_mode) || S_ISLNK(fs.st_mode))) {
                unlinkat(dir, name.c_str(), 0);
            }
        }
        if (why.empty()) {
            ++res.n_unlisted;
        } else {
            ++res.n_dropped;
            if (res.why_dropped.find(why) == std::string::npos) {
                res.why_dropped += (res.why_dropped.empty() ? "" : "; ") + name + ": " + why;
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
    e.file = store_->write(e.tgt.data(), e.tgt.size(), e.dft.data(), e.dft.size(), false, why, error,
                           prompt_meta(e.tokens, e.n_tail));
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
    e.file = store_->write(from, n0, n1, why, error, prompt_meta(e.tokens, n_tail));
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
