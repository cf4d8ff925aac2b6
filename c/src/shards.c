/*
 * The shard sets of one file (docs/spec/container.md section 4.1, sharding.md section 3), as
 * hurray_bridge's grouping reader (load, loads) checks them: the entries NAME[k] whose
 * descriptors have a shard section are the shards of NAME. A name may not also be an entry
 * of its own (field "name"); the shards of a set share the global shape and element type,
 * no two hold one box as one replica id, and distinct boxes do not overlap (field
 * "shards"). The set may be partial: coverage is not checked. hry_file_verify calls this
 * after the bytes, and the writer before it writes one, so that it never writes a file
 * that verify (or Python's load) refuses.
 */
#include "shards.h"

#include <stdlib.h>
#include <string.h>

/* printf arguments for a name given with its length (not NUL-terminated) */
#define SHOWN(p, n) (int)((n) < 100 ? (n) : 100), (const char *)(p)

typedef struct member {
    const uint8_t *group;  /* NAME of NAME[k], borrowed */
    uint32_t group_length;
    uint32_t entry;        /* position in the file or writer */
    const uint8_t *name;   /* the entry's own name */
    uint32_t name_length;
    uint32_t rank, replica;
    uint8_t dtype, padded;
    const uint64_t *offsets, *shape, *global; /* rank values each, in the pool */
} member;

/* The length of NAME when `name` is NAME[k] (k decimal, no leading zeros), else 0. */
static uint32_t group_length(const uint8_t *name, uint32_t n)
{
    if (n < 4 || name[n - 1] != ']') {
        return 0;
    }
    uint32_t open = n - 1;
    while (open > 0 && name[open - 1] >= '0' && name[open - 1] <= '9') {
        open--;
    }
    uint32_t digits = n - 1 - open;
    if (open < 2 || name[open - 1] != '[' || digits == 0 || (digits > 1 && name[open] == '0')) {
        return 0;
    }
    return open - 1;
}

static int by_group(const void *a_, const void *b_)
{
    const member *a = a_, *b = b_;
    uint32_t n = a->group_length < b->group_length ? a->group_length : b->group_length;
    int c = memcmp(a->group, b->group, n);
    if (c != 0) {
        return c;
    }
    if (a->group_length != b->group_length) {
        return a->group_length < b->group_length ? -1 : 1;
    }
    return a->entry < b->entry ? -1 : a->entry > b->entry;
}

static int lex(const uint64_t *a, const uint64_t *b, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        if (a[i] != b[i]) {
            return a[i] < b[i] ? -1 : 1;
        }
    }
    return 0;
}

/* Box order: offsets, then sizes, then replica id, then position (so that a duplicate
 * box and replica id sits next to its first holder, and distinct boxes sort as Python's
 * overlap check sorts them). All members of one set have one rank. */
static int by_box(const void *a_, const void *b_)
{
    const member *a = *(const member *const *)a_, *b = *(const member *const *)b_;
    int c = lex(a->offsets, b->offsets, a->rank);
    if (c == 0) {
        c = lex(a->shape, b->shape, a->rank);
    }
    if (c == 0 && a->replica != b->replica) {
        c = a->replica < b->replica ? -1 : 1;
    }
    return c != 0 ? c : (a->entry < b->entry ? -1 : a->entry > b->entry);
}

static int is_empty(const member *m)
{
    for (uint32_t i = 0; i < m->rank; i++) {
        if (m->shape[i] == 0) {
            return 1;
        }
    }
    return 0;
}

static int same_box(const member *a, const member *b)
{
    return lex(a->offsets, b->offsets, a->rank) == 0 && lex(a->shape, b->shape, a->rank) == 0;
}

static int overlap(const member *a, const member *b)
{
    for (uint32_t i = 0; i < a->rank; i++) {
        uint64_t lo = a->offsets[i] > b->offsets[i] ? a->offsets[i] : b->offsets[i];
        uint64_t ea = a->offsets[i] + a->shape[i], eb = b->offsets[i] + b->shape[i];
        if (lo >= (ea < eb ? ea : eb)) {
            return 0;
        }
    }
    return 1;
}

#define FAIL_SET(m, ...) \
    hry__fail(err, HRY_E_FORMAT, "shards", "sharded tensor '%.*s': " __VA_ARGS__)

/* One set: members[0 .. n) in table order. `sorted` is scratch for n pointers. */
static hry_status check_set(member *ms, uint32_t n, const member **sorted, hry_error *err)
{
    const member *g = &ms[0];
    /* The global descriptor (row-major, the first shard's type) must be one that exists. */
    uint64_t count = 1, bytes;
    const hry_dtype_info *t = hry_dtype(g->dtype);
    for (uint32_t i = 0; i < g->rank && count; i++) {
        count = g->global[i] == 0 ? 0 : count;
    }
    for (uint32_t i = 0; i < g->rank && count; i++) {
        if (hry__mul(count, g->global[i], &count)) {
            return FAIL_SET(g, "its global shape's element count overflows 64 bits",
                            SHOWN(g->group, g->group_length));
        }
    }
    if (t->bits >= 8 && hry__mul(count, t->bits / 8, &bytes)) { /* sub-byte: always fits */
        return FAIL_SET(g, "its global shape needs more than 2**64 - 1 bytes",
                        SHOWN(g->group, g->group_length));
    }
    for (uint32_t i = 0; i < n; i++) {
        const member *m = &ms[i];
        if (m->rank != g->rank || lex(m->global, g->global, g->rank) != 0) {
            return FAIL_SET(m, "entry '%.*s' belongs to another global shape than entry '%.*s'; "
                            "every shard of a set has the same global shape",
                            SHOWN(g->group, g->group_length), SHOWN(m->name, m->name_length),
                            SHOWN(g->name, g->name_length));
        }
        if (m->dtype != g->dtype || m->padded != g->padded) {
            return FAIL_SET(m, "entry '%.*s' holds %s%s but the global tensor is %s%s; every "
                            "shard of a set has the global element type",
                            SHOWN(g->group, g->group_length), SHOWN(m->name, m->name_length),
                            hry_dtype(m->dtype)->name, m->padded ? " (padded)" : "", t->name,
                            g->padded ? " (padded)" : "");
        }
    }
    uint32_t k = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (!is_empty(&ms[i])) { /* empty shards cover nothing: never a duplicate or overlap */
            sorted[k++] = &ms[i];
        }
    }
    qsort(sorted, k, sizeof *sorted, by_box);
    for (uint32_t i = 1; i < k; i++) {
        const member *a = sorted[i - 1], *b = sorted[i];
        if (same_box(a, b) && a->replica == b->replica) {
            return FAIL_SET(b, "entry '%.*s' and entry '%.*s' hold one box as replica %u; "
                            "copies of one box need distinct replica ids",
                            SHOWN(g->group, g->group_length), SHOWN(b->name, b->name_length),
                            SHOWN(a->name, a->name_length), b->replica);
        }
    }
    if (g->rank == 0) {
        return HRY_OK; /* every box of a scalar is the one box */
    }
    /* Distinct boxes, sorted by offsets: once a later box starts past a's end along
     * dimension 0, no box after it reaches back into a. */
    for (uint32_t i = 0; i < k; i++) {
        const member *a = sorted[i];
        if (i && same_box(sorted[i - 1], a)) {
            continue;
        }
        uint64_t end0 = a->offsets[0] + a->shape[0];
        for (uint32_t j = i + 1; j < k && sorted[j]->offsets[0] < end0; j++) {
            const member *b = sorted[j];
            if (!same_box(a, b) && overlap(a, b)) {
                return FAIL_SET(b, "entry '%.*s' and entry '%.*s' overlap without holding one "
                                "box; distinct boxes must not share elements",
                                SHOWN(g->group, g->group_length), SHOWN(a->name, a->name_length),
                                SHOWN(b->name, b->name_length));
            }
        }
    }
    return HRY_OK;
}

hry_status hry__check_shard_sets(const hry__named *entries, uint32_t n, const hry__strset *names,
                                 hry_error *err)
{
    hry_descriptor *d = malloc(sizeof *d);
    member *ms = NULL;
    uint64_t *pool = NULL;
    const member **sorted = NULL;
    hry_status st = HRY_OK;
    uint32_t count = 0;
    size_t values = 0;
    if (d == NULL) {
        return hry__fail(err, HRY_E_NOMEM, "", "out of memory");
    }
    hry_descriptor_init(d);
    /* Pass 1: which entries are shards, and how much room their boxes take. */
    for (uint32_t i = 0; i < n; i++) {
        if (group_length(entries[i].name, entries[i].name_length) &&
            hry_decode(entries[i].desc, entries[i].desc_length, d, NULL, NULL) == HRY_OK &&
            d->has_shard) {
            count++;
            values += 3 * (size_t)d->rank;
        }
    }
    if (count == 0) {
        free(d);
        return HRY_OK;
    }
    ms = calloc(count, sizeof *ms);
    pool = malloc((values ? values : 1) * sizeof *pool);
    sorted = malloc(count * sizeof *sorted);
    if (ms == NULL || pool == NULL || sorted == NULL) {
        st = hry__fail(err, HRY_E_NOMEM, "", "out of memory");
        goto done;
    }
    uint32_t m = 0;
    size_t at = 0;
    for (uint32_t i = 0; i < n && m < count; i++) {
        uint32_t gl = group_length(entries[i].name, entries[i].name_length);
        if (!gl || hry_decode(entries[i].desc, entries[i].desc_length, d, NULL, NULL) != HRY_OK ||
            !d->has_shard) {
            continue;
        }
        member *x = &ms[m++];
        x->group = entries[i].name;
        x->group_length = gl;
        x->entry = i;
        x->name = entries[i].name;
        x->name_length = entries[i].name_length;
        x->rank = d->rank;
        x->replica = d->shard.replica_id;
        x->dtype = d->dtype;
        x->padded = d->padded;
        uint64_t *v = pool + at;
        memcpy(v, d->shard.offsets, d->rank * sizeof *v);
        memcpy(v + d->rank, d->shape, d->rank * sizeof *v);
        memcpy(v + 2 * d->rank, d->shard.global_shape, d->rank * sizeof *v);
        x->offsets = v;
        x->shape = v + d->rank;
        x->global = v + 2 * d->rank;
        at += 3 * (size_t)d->rank;
    }
    /* A sharded tensor's name is not also an entry of its own (in table order of the
     * shards, as Python's _check_shard_names). */
    for (uint32_t i = 0; i < count; i++) {
        uint32_t j;
        const member *x = &ms[i];
        if (hry__strset_find(names, x->group, x->group_length, &j) &&
            !(group_length(entries[j].name, entries[j].name_length) &&
              hry_decode(entries[j].desc, entries[j].desc_length, d, NULL, NULL) == HRY_OK &&
              d->has_shard)) {
            st = hry__fail(err, HRY_E_FORMAT, "name",
                           "entry '%.*s' and the shard entry '%.*s' both claim the name '%.*s' "
                           "(entries NAME[k] with shard sections are the shards of NAME); "
                           "rename one", SHOWN(x->group, x->group_length),
                           SHOWN(x->name, x->name_length), SHOWN(x->group, x->group_length));
            goto done;
        }
    }
    qsort(ms, count, sizeof *ms, by_group);
    for (uint32_t lo = 0, hi; lo < count && st == HRY_OK; lo = hi) {
        for (hi = lo + 1; hi < count && ms[hi].group_length == ms[lo].group_length &&
                          memcmp(ms[hi].group, ms[lo].group, ms[lo].group_length) == 0;
             hi++) {
        }
        st = check_set(ms + lo, hi - lo, sorted, err);
    }
done:
    free(sorted);
    free(pool);
    free(ms);
    free(d);
    return st;
}
