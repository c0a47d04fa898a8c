// llama-preempt: slot files written whole and checked before they are read (preempt-slot-file.h).
#include "preempt-slot-file.h"

#include "preempt-disk-io.h"  // disk_hasher, write_all, read_all

#include "common.h"
#include "log.h"

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <vector>

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

namespace llama_preempt {

namespace {

constexpr char     TRAILER_MAGIC[8] = { 'L', 'P', 'S', 'L', 'O', 'T', '\0', '\1' };
constexpr uint32_t TRAILER_VERSION  = 1;
constexpr size_t   TRAILER          = slot_files::TRAILER_BYTES;
constexpr size_t   CHUNK            = 1 << 20;
constexpr size_t   SEQ_HEADER       = 3 * sizeof(uint32_t);  // upstream's magic, version and token count

struct trailer {
    char     magic[8];
    uint32_t version;
    uint32_t zero;
    uint64_t n_body;
    uint64_t checksum;
    char     model[16];
    char     pad[16];
};
static_assert(sizeof(trailer) == TRAILER, "the trailer is 64 bytes");

std::string mib(uint64_t n) {
    return string_format("%.1f MiB", n / 1048576.0);
}

struct fd_guard {
    int fd = -1;
    ~fd_guard() {
        if (fd >= 0) {
            close(fd);
        }
    }
};

// the checksum of the first n bytes of fd
bool hash_prefix(int fd, uint64_t n, uint64_t & sum) {
    disk_hasher h;
    std::vector<uint8_t> buf(CHUNK);
    for (uint64_t at = 0; at < n;) {
        const size_t k = (size_t) std::min<uint64_t>(CHUNK, n - at);
        if (!read_all(fd, buf.data(), k, (off_t) at)) {
            return false;
        }
        h.update(buf.data(), k);
        at += k;
    }
    sum = h.digest();
    return true;
}

std::string dir_of(const std::string & path) {
    const size_t slash = path.find_last_of('/');
    return slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
}

// Why a file of `need` bytes cannot be written in `dir`, or "" when it may be: the filesystem's free
// space and the process's file-size limit (ulimit -f), asked before a byte is written and again
// after a write failed, so the client hears the cause rather than "write error"
std::string no_room_for(const std::string & dir, uint64_t need) {
    struct statvfs vfs;
    if (statvfs(dir.c_str(), &vfs) == 0) {
        const uint64_t avail = (uint64_t) vfs.f_bavail * vfs.f_frsize;
        if (avail < need) {
            return "no space left on the filesystem of --slot-save-path: the file needs " + mib(need) + ", " + mib(avail) +
                   " is free";
        }
    }
    struct rlimit rl;
    if (getrlimit(RLIMIT_FSIZE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && (uint64_t) rl.rlim_cur < need) {
        return "the file needs " + mib(need) + ", more than the server's file-size limit (ulimit -f) of " +
               mib((uint64_t) rl.rlim_cur);
    }
    return "";
}

slot_file_outcome failed(slot_file_fault f, std::string why) {
    slot_file_outcome o;
    o.fault = f;
    o.why   = std::move(why);
    return o;
}

} // namespace

const char * slot_file_fault_name(slot_file_fault f) {
    switch (f) {
        case slot_file_fault::none:      return "none";
        case slot_file_fault::missing:   return "missing";
        case slot_file_fault::truncated: return "truncated";
        case slot_file_fault::corrupt:   return "corrupt";
        case slot_file_fault::foreign:   return "foreign";
        case slot_file_fault::no_space:  return "no_space";
        case slot_file_fault::write:     return "write";
        case slot_file_fault::n_faults:  break;
    }
    return "?";
}

std::string model_state_identity(const common_params & params, llama_context * ctx) {
    const llama_model * model = llama_get_model(ctx);
    disk_hasher h;
    auto add = [&h](const std::string & s) { h.update((const uint8_t *) s.data(), s.size()); };
    char desc[256] = "";
    llama_model_desc(model, desc, sizeof(desc));
    add(string_format("%s|ctk=%s|ctv=%s|n_layer=%d|n_embd=%d", desc, ggml_type_name(params.cache_type_k),
                      ggml_type_name(params.cache_type_v), llama_model_n_layer(model), llama_model_n_embd(model)));
    if (FILE * f = fopen(params.model.path.c_str(), "rb")) {
        std::vector<uint8_t> buf(1 << 20);
        fseek(f, 0, SEEK_END);
        const long size = ftell(f);
        add(std::to_string(size));
        for (long at : { 0L, std::max(0L, size - (long) buf.size()) }) {
            fseek(f, at, SEEK_SET);
            h.update(buf.data(), fread(buf.data(), 1, buf.size(), f));
        }
        fclose(f);
    }
    return string_format("%016" PRIx64, h.digest());
}

slot_file_outcome slot_files::save(llama_context * ctx, llama_seq_id seq, const std::string & path,
                                   const llama_token * tokens, size_t n_tokens) {
    const std::string dir  = dir_of(path);
    const uint64_t    need = SEQ_HEADER + n_tokens * sizeof(llama_token) + llama_state_seq_get_size(ctx, seq) + TRAILER;
    slot_file_outcome out;
    if (std::string why = no_room_for(dir, need); !why.empty()) {
        out = failed(slot_file_fault::no_space, std::move(why));
    } else {
        // beside the requested name (one filesystem, so the rename is atomic), hidden, never reused
        const std::string tmp = dir + "/." + path.substr(dir.size() + 1) + string_format(".%d.%" PRIu64 ".tmp", (int) getpid(), ++n_saved_);
        const size_t n_body = llama_state_seq_save_file(ctx, tmp.c_str(), seq, tokens, n_tokens);
        int err = n_body == 0 ? EIO : 0;
        if (err == 0) {
            fd_guard g;
            g.fd = open(tmp.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW);
            trailer t = {};
            memcpy(t.magic, TRAILER_MAGIC, sizeof(t.magic));
            t.version = TRAILER_VERSION;
            t.n_body  = n_body;
            memcpy(t.model, model_.data(), std::min(model_.size(), sizeof(t.model)));
            if (g.fd < 0 || !hash_prefix(g.fd, n_body, t.checksum) ||
                !write_all(g.fd, (const uint8_t *) &t, sizeof(t), (off_t) n_body) || fsync(g.fd) != 0) {
                err = errno ? errno : EIO;
            }
        }
        if (err == 0 && rename(tmp.c_str(), path.c_str()) != 0) {
            err = errno;
        }
        if (err != 0) {
            unlink(tmp.c_str());
            std::string why = no_room_for(dir, need);  // the likeliest cause, asked once the partial file is gone
            if (!why.empty() || err == ENOSPC || err == EDQUOT || err == EFBIG) {
                out = failed(slot_file_fault::no_space, why.empty() ? std::string(strerror(err)) : why);
            } else {
                out = failed(slot_file_fault::write, n_body == 0 ? "writing the state failed (see the server's log)"
                                                                 : std::string(strerror(err)));
            }
        } else {
            // the rename itself survives a crash only once the directory is on the disk
            fd_guard d;
            d.fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
            if (d.fd >= 0) {
                fsync(d.fd);
            }
            out.n_bytes = n_body + TRAILER;
        }
    }
    if (!out.ok()) {
        LOG_WRN("slot_files: saving %s failed (%s): %s\n", path.c_str(), slot_file_fault_name(out.fault), out.why.c_str());
    }
    return out;
}

slot_file_outcome slot_files::check(const std::string & path) const {
    fd_guard g;
    g.fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (g.fd < 0 || fstat(g.fd, &st) != 0) {
        return failed(slot_file_fault::missing, std::string("cannot open the file: ") + strerror(errno));
    }
    if (!S_ISREG(st.st_mode)) {
        return failed(slot_file_fault::missing, "not a regular file");
    }
    const uint64_t size = (uint64_t) st.st_size;
    trailer t = {};
    if (size < SEQ_HEADER + TRAILER || !read_all(g.fd, (uint8_t *) &t, sizeof(t), (off_t) (size - TRAILER)) ||
        memcmp(t.magic, TRAILER_MAGIC, sizeof(t.magic)) != 0) {
        return failed(slot_file_fault::truncated, string_format("the file (%" PRIu64 " bytes) does not end with a slot file's "
                      "check trailer: it was cut short, or not saved by this server's slot API", size));
    }
    if (t.version != TRAILER_VERSION) {
        return failed(slot_file_fault::foreign, string_format("the file's check trailer is version %u; this server reads version %u",
                      t.version, TRAILER_VERSION));
    }
    if (t.n_body + TRAILER != size) {
        return failed(slot_file_fault::truncated, string_format("the file is %" PRIu64 " bytes, its trailer says %" PRIu64
                      ": it was cut or appended to", size, t.n_body + TRAILER));
    }
    const std::string model(t.model, strnlen(t.model, sizeof(t.model)));
    if (model != model_) {
        return failed(slot_file_fault::foreign, "the file was saved with another model or other KV cache types (model identity " +
                      model + ", this server's " + model_ + ")");
    }
    uint64_t sum = 0;
    uint32_t magic = 0;
    if (!hash_prefix(g.fd, t.n_body, sum) || !read_all(g.fd, (uint8_t *) &magic, sizeof(magic), 0)) {
        return failed(slot_file_fault::truncated, std::string("reading the file failed: ") + (errno ? strerror(errno) : "short read"));
    }
    if (sum != t.checksum || magic != LLAMA_STATE_SEQ_MAGIC) {
        return failed(slot_file_fault::corrupt, "the file's bytes do not match their checksum: it is damaged");
    }
    return {};
}

} // namespace llama_preempt
