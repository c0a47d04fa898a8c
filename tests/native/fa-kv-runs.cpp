// Flash attention with kv_runs (ggml_flash_attn_ext_set_kv_runs) against the same attention over every
// cell, on the CPU: a pool shared by many sequences whose cells interleave, each query row attending its
// own sequence's cells. Under the batch-invariant plan (the one-chunk loop, what --deterministic runs)
// and on the split-KV decode path the two agree byte for byte; on the tiled path they agree to rounding
// (the windows over the runs group the cells into other tiles). Built by tests/test_attn_own_cells.py.
#include "ggml.h"
#include "ggml-cpu.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

struct pool_case {
    const char * name;
    int64_t hs, nh, kv, rows, n_seq;
    bool grouped;        // a sequence's rows are consecutive (a prompt) rather than interleaved (decode)
    bool order;          // cells visited in a given order (ggml_flash_attn_ext_set_kv_order), as --deterministic
    bool dense_rows;     // some rows are marked to visit every cell (count -1)
    ggml_type type_kv;
    bool batch_invariant;
    int  n_threads;
};

struct pool_layout {
    std::vector<int32_t> seq_of_cell; // -1: empty
    std::vector<int32_t> seq_of_row;
    std::vector<int32_t> order;       // a permutation of the cells
};

static pool_layout make_layout(const pool_case & c, unsigned seed) {
    std::mt19937 gen(seed);
    pool_layout l;
    l.seq_of_cell.resize(c.kv);
    for (int64_t i = 0; i < c.kv; ++i) {
        // runs of a sequence's cells (a prompt) mixed with single cells (decode steps) and holes
        const int64_t r = gen() % (c.n_seq + 1);
        const int64_t len = gen() % 4 == 0 ? 1 + gen() % 24 : 1;
        for (int64_t j = 0; j < len && i + j < c.kv; ++j) {
            l.seq_of_cell[i + j] = r == c.n_seq ? -1 : (int32_t) r;
        }
        i += len - 1;
    }
    l.seq_of_row.resize(c.rows);
    for (int64_t r = 0; r < c.rows; ++r) {
        l.seq_of_row[r] = (int32_t) (c.grouped ? r*c.n_seq/c.rows : r % c.n_seq);
    }
    l.order.resize(c.kv);
    std::iota(l.order.begin(), l.order.end(), 0);
    if (c.order) {
        std::shuffle(l.order.begin(), l.order.end(), gen);
    }
    return l;
}

// each sequence's runs once, in the visiting order's index space, after the rows' (offset, count)
static std::vector<int32_t> make_runs(const pool_case & c, const pool_layout & l) {
    std::vector<int32_t> runs(2*c.rows + 2*c.kv, 0);
    std::vector<int32_t> off(c.n_seq), cnt(c.n_seq);
    int64_t pos = 2*c.rows;
    for (int64_t s = 0; s < c.n_seq; ++s) {
        off[s] = (int32_t) pos;
        for (int64_t j = 0; j < c.kv; ++j) {
            if (l.seq_of_cell[l.order[j]] != s) {
                continue;
            }
            if (pos > off[s] && runs[pos - 1] == j) {
                runs[pos - 1] = (int32_t) j + 1;
            } else {
                runs[pos++] = (int32_t) j;
                runs[pos++] = (int32_t) j + 1;
            }
        }
        cnt[s] = (int32_t) ((pos - off[s])/2);
    }
    for (int64_t r = 0; r < c.rows; ++r) {
        const bool dense = c.dense_rows && r % 5 == 2;
        runs[2*r]     = dense ? 0 : off[l.seq_of_row[r]];
        runs[2*r + 1] = dense ? -1 : cnt[l.seq_of_row[r]];
    }
    return runs;
}

struct attended {
    std::vector<float> out;
    std::vector<float> reference; // the attention in double over every cell, from the same stored values
};

static attended attend(const pool_case & c, const pool_layout & l, bool with_runs) {
    ggml_init_params ip = { 512u*1024*1024, nullptr, false };
    ggml_context * ctx = ggml_init(ip);

    ggml_tensor * q = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, c.hs, c.rows, c.nh, 1);
    ggml_tensor * k = ggml_new_tensor_4d(ctx, c.type_kv, c.hs, c.kv, c.nh, 1);
    ggml_tensor * v = ggml_new_tensor_4d(ctx, c.type_kv, c.hs, c.kv, c.nh, 1);
    ggml_tensor * m = ggml_new_tensor_4d(ctx, GGML_TYPE_F16, c.kv, c.rows, 1, 1);

    std::mt19937 gen(42);
    std::uniform_real_distribution<float> dis(-1.0f, 1.0f);
    for (int64_t i = 0; i < ggml_nelements(q); ++i) {
        ((float *) q->data)[i] = dis(gen);
    }
    std::vector<float> tmp(ggml_nelements(k));
    for (ggml_tensor * t : {k, v}) {
        for (float & x : tmp) {
            x = dis(gen);
        }
        if (t->type == GGML_TYPE_F32) {
            memcpy(t->data, tmp.data(), ggml_nbytes(t));
        } else {
            ggml_quantize_chunk(t->type, tmp.data(), t->data, 0, ggml_nrows(t), t->ne[0], nullptr);
        }
    }
    ggml_fp16_t * mp = (ggml_fp16_t *) m->data;
    for (int64_t r = 0; r < c.rows; ++r) {
        for (int64_t i = 0; i < c.kv; ++i) {
            // its own sequence's cells, and causally: not every one of them (the runs are a superset)
            const bool own = l.seq_of_cell[i] == l.seq_of_row[r] && (i + r) % 7 != 0;
            mp[r*c.kv + i] = ggml_fp32_to_fp16(own ? 0.25f*dis(gen) : -INFINITY);
        }
    }

    ggml_tensor * out = ggml_flash_attn_ext(ctx, q, k, v, m, 1.0f/sqrtf((float) c.hs), 0.0f, 0.0f);
    ggml_prec_set_acc(out, GGML_PREC_F32);
    if (c.order) {
        ggml_tensor * o = ggml_new_tensor_2d(ctx, GGML_TYPE_I32, c.kv, 1);
        memcpy(o->data, l.order.data(), ggml_nbytes(o));
        ggml_flash_attn_ext_set_kv_order(out, o);
    }
    if (with_runs) {
        const std::vector<int32_t> runs = make_runs(c, l);
        ggml_tensor * t = ggml_new_tensor_2d(ctx, GGML_TYPE_I32, (int64_t) runs.size(), 1);
        memcpy(t->data, runs.data(), ggml_nbytes(t));
        ggml_flash_attn_ext_set_kv_runs(out, t);
    }

    ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, out);
    ggml_cplan plan = ggml_graph_plan(gf, c.n_threads, nullptr);
    std::vector<uint8_t> work(plan.work_size + 64);
    plan.work_data = work.data();
    plan.batch_invariant = c.batch_invariant;
    if (ggml_graph_compute(gf, &plan) != GGML_STATUS_SUCCESS) {
        fprintf(stderr, "compute failed\n");
        exit(2);
    }
    attended res;
    res.out.assign((float *) out->data, (float *) out->data + ggml_nelements(out));

    // out is [hs, nh, rows]: row r, head h at (r*nh + h)*hs
    const auto to_float = ggml_get_type_traits(c.type_kv)->to_float;
    std::vector<float> kf(c.hs), vf(c.hs);
    res.reference.assign(res.out.size(), 0.0f);
    for (int64_t h = 0; h < c.nh; ++h) {
        for (int64_t r = 0; r < c.rows; ++r) {
            const float * qr = (const float *) q->data + (h*c.rows + r)*c.hs;
            std::vector<double> s(c.kv, -INFINITY);
            double mx = -INFINITY;
            for (int64_t i = 0; i < c.kv; ++i) {
                const float mv = ggml_fp16_to_fp32(mp[r*c.kv + i]);
                if (mv == -INFINITY) {
                    continue;
                }
                const char * kr = (const char *) k->data + i*k->nb[1] + h*k->nb[2];
                if (c.type_kv == GGML_TYPE_F32) { memcpy(kf.data(), kr, c.hs*sizeof(float)); } else { to_float(kr, kf.data(), c.hs); }
                double dot = 0.0;
                for (int64_t d = 0; d < c.hs; ++d) {
                    // the kernel rounds q to the K cells' dot type first
                    const float qd = c.type_kv == GGML_TYPE_F32 ? qr[d] : ggml_fp16_to_fp32(ggml_fp32_to_fp16(qr[d]));
                    dot += (double) qd*kf[d];
                }
                s[i] = dot/sqrt((double) c.hs) + mv;
                mx = std::max(mx, s[i]);
            }
            double sum = 0.0;
            std::vector<double> acc(c.hs, 0.0);
            for (int64_t i = 0; i < c.kv; ++i) {
                if (s[i] == -INFINITY) {
                    continue;
                }
                const double p = exp(s[i] - mx);
                sum += p;
                const char * vr = (const char *) v->data + i*v->nb[1] + h*v->nb[2];
                if (c.type_kv == GGML_TYPE_F32) { memcpy(vf.data(), vr, c.hs*sizeof(float)); } else { to_float(vr, vf.data(), c.hs); }
                for (int64_t d = 0; d < c.hs; ++d) {
                    acc[d] += p*vf[d];
                }
            }
            for (int64_t d = 0; d < c.hs; ++d) {
                res.reference[(r*c.nh + h)*c.hs + d] = sum > 0 ? (float) (acc[d]/sum) : 0.0f;
            }
        }
    }
    ggml_free(ctx);
    return res;
}

static double nmse(const std::vector<float> & a, const std::vector<float> & ref) {
    double err = 0.0, sq = 0.0;
    for (size_t i = 0; i < a.size(); ++i) {
        err += ((double) a[i] - ref[i])*((double) a[i] - ref[i]);
        sq  += (double) ref[i]*ref[i];
    }
    return sq > 0 ? err/sq : err;
}

int main() {
    const pool_case cases[] = {
        // name                          hs  nh  kv    rows n_seq grouped order  dense  type           b-inv  threads
        { "decode, one-chunk",           64,  4, 1024,  64, 64,   false, false, false, GGML_TYPE_F16,  true,  2 },
        { "decode, one-chunk, order",    64,  4, 1024,  64, 64,   false, true,  false, GGML_TYPE_F16,  true,  2 },
        { "prompt+decode, one-chunk",    64,  4, 2048, 200, 12,   true,  false, true,  GGML_TYPE_F16,  true,  2 },
        { "q8_0, one-chunk, order",      64,  2,  777,  33, 5,    false, true,  true,  GGML_TYPE_Q8_0, true,  2 },
        { "split-kv decode",             64,  4, 4096,   1, 1,    false, false, false, GGML_TYPE_F16,  false, 2 },
        { "split-kv decode, f32",        32,  2, 1500,   1, 3,    false, false, false, GGML_TYPE_F32,  false, 2 },
        { "decode, tiled",               64,  4, 2048,  96, 96,   false, false, false, GGML_TYPE_F16,  false, 2 },
        { "prompt, tiled",               64,  4, 2048, 256, 4,    true,  false, false, GGML_TYPE_F16,  false, 2 },
        { "prompt+dense rows, tiled",   128,  2, 1024, 130, 3,    true,  false, true,  GGML_TYPE_F16,  false, 2 },
        { "prompt, tiled, f32",          64,  2, 1024, 128, 2,    true,  false, false, GGML_TYPE_F32,  false, 2 },
        { "one thread, tiled",           64,  2,  512,  70, 7,    false, false, false, GGML_TYPE_F16,  false, 1 },
    };
    int passed = 0, failed = 0;
    for (const pool_case & c : cases) {
        const pool_layout l = make_layout(c, 7);
        const attended dense = attend(c, l, false);
        const attended runs  = attend(c, l, true);
        // the one-chunk and split-KV paths skip only masked cells, in the same order: byte for byte;
        // elsewhere within rounding of the attention in double (a cell missed or added in a row of tens
        // of cells is an error of the order of 1e-3; the one-chunk loop's f16 accumulator, 1e-7 to 1e-5)
        const bool exact = c.batch_invariant || c.rows == 1;
        const double e_dense = nmse(dense.out, dense.reference);
        const double e_runs  = nmse(runs.out, dense.reference);
        const bool ok = e_dense < 1e-4 && e_runs < std::max(1e-5, 4*e_dense) &&
            (!exact || memcmp(dense.out.data(), runs.out.data(), dense.out.size()*sizeof(float)) == 0);
        printf("%-28s %s (%s; nmse against double: dense %.2g, runs %.2g)\n", c.name, ok ? "ok" : "FAILED",
               exact ? "byte for byte" : "to rounding", e_dense, e_runs);
        (ok ? passed : failed)++;
    }
    printf("%d passed, %d failed\n", passed, failed);
    return failed == 0 ? 0 : 1;
}
