/*
 * Writing Hurray files (docs/spec/container.md §7): the one layout the format allows for
 * given entries, metadata, alignment and checksum choice — the same bytes hb.save writes.
 *
 * Buffers are placed in entry order and, within an entry, in buffer-table order, each on a
 * multiple of the alignment; the data region starts at the index end rounded up to
 * max(4096, alignment) (or at the index end when there is no data). hry_writer_save writes
 * the data first, computing the checksums as it goes, then the index, into a temporary file
 * that is fsynced and renamed over the target.
 */
#define _POSIX_C_SOURCE 200809L
#include "shards.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define PAGE 4096u
/* printf arguments for a name given with its length (not NUL-terminated) */
#define SHOWN(p, n) (int)((n) < 100 ? (n) : 100), (p)

typedef struct wentry {
    uint8_t *name;                    /* owned copy */
    uint32_t name_length;
    uint8_t desc[HRY_MAX_DESCRIPTOR_SIZE];
    uint32_t desc_length;
    uint32_t n;
    const uint8_t *src[HRY_MAX_BUFFERS];
    uint64_t length[HRY_MAX_BUFFERS], offset[HRY_MAX_BUFFERS];
    uint8_t keep;                     /* bits of buffer 0's last byte that hold elements */
    uint8_t *masked;                  /* owned: padded data with its high bits cleared */
} wentry;

static void wentry_free(wentry *e)
{
    if (e != NULL) {
        free(e->masked);
        free(e->name);
        free(e);
    }
}

/* Buffer j of e as the pieces to write (every writer below goes through this): the
 * source itself, or -- when it is packed sub-byte data whose last byte has a trailing bit
 * set -- all of it but that byte, then the byte masked (element-types.md section 4.1
 * rule 6: trailing bits are written as zero). The source is never modified. Returns the
 * length of the first piece (from e->src[j]); *last gets the masked byte and the result
 * is length - 1 when there is a second piece. */
static uint64_t pieces(const wentry *e, uint32_t j, int *has_last, uint8_t *last)
{
    uint64_t n = e->length[j];
    *has_last = 0;
    if (j == 0 && n && (e->src[0][n - 1] & (uint8_t)~e->keep)) {
        *has_last = 1;
        *last = e->src[0][n - 1] & e->keep;
        return n - 1;
    }
    return n;
}

struct hry_writer {
    uint32_t alignment;
    int checksums;
    wentry **entries;
    uint32_t n_entries, cap_entries;
    uint8_t *meta;                    /* the encoded metadata block */
    size_t meta_length, meta_cap;
    uint32_t n_meta;
    hry__strset names, keys;
    uint64_t cursor;                  /* end of the data placed so far */
    uint64_t table_length;
};

static uint64_t pad8(uint64_t n)
{
    return (n + 7) & ~(uint64_t)7;
}

hry_status hry_writer_new(uint32_t alignment, int checksums, hry_writer **out, hry_error *err)
{
    if (out == NULL) {
        return hry__fail(err, HRY_E_ARGUMENT, "", "out is NULL");
    }
    *out = NULL;
    if (alignment == 0) {
        alignment = HRY_ALIGNMENT;
    }
    if (alignment < HRY_ALIGNMENT || alignment > HRY_MAX_FILE_ALIGNMENT ||
        (alignment & (alignment - 1))) {
        return hry__fail(err, HRY_E_FORMAT, "alignment",
                         "alignment must be a power of two in [64, 2097152], got %u", alignment);
    }
    hry_writer *w = calloc(1, sizeof *w);
    if (w == NULL || !hry__strset_init(&w->names, 16) || !hry__strset_init(&w->keys, 16)) {
        hry_writer_free(w);
        return hry__fail(err, HRY_E_NOMEM, "", "out of memory");
    }
    w->alignment = alignment;
    w->checksums = checksums != 0;
    *out = w;
    hry__ok(err);
    return HRY_OK;
}

void hry_writer_free(hry_writer *w)
{
    if (w == NULL) {
        return;
    }
    for (uint32_t i = 0; i < w->n_entries; i++) {
        wentry_free(w->entries[i]);
    }
    free(w->entries);
    free(w->meta);
    hry__strset_free(&w->names);
    hry__strset_free(&w->keys);
    free(w);
}

static hry_status check_name(const char *what, const char *name, size_t n, size_t limit,
                             const char *field, hry_error *err)
{
    size_t bad;
    if (name == NULL && n != 0) {
        return hry__fail(err, HRY_E_ARGUMENT, field, "%s is NULL", what);
    }
    if (n < 1 || n > limit) {
        return hry__fail(err, HRY_E_FORMAT, field, "%s is %zu bytes of UTF-8; it must be 1 to %zu",
                         what, n, limit);
    }
    if (!hry__utf8_valid((const uint8_t *)name, n, &bad)) {
        return hry__fail(err, HRY_E_FORMAT, field, "%s is not valid UTF-8 (at byte %zu)", what,
                         bad);
    }
    if (memchr(name, 0, n) != NULL) {
        return hry__fail(err, HRY_E_FORMAT, field, "%s contains NUL", what);
    }
    return HRY_OK;
}

hry_status hry_writer_add_metadata(hry_writer *w, const char *key, size_t key_length,
                                   const char *value, size_t value_length, hry_error *err)
{
    size_t bad;
    if (w == NULL || (value == NULL && value_length != 0)) {
        return hry__fail(err, HRY_E_ARGUMENT, "metadata", "writer or value is NULL");
    }
    hry_status st = check_name("metadata key", key, key_length, HRY_MAX_KEY_BYTES, "name", err);
    if (st != HRY_OK) {
        return st;
    }
    if (!hry__utf8_valid((const uint8_t *)value, value_length, &bad)) {
        return hry__fail(err, HRY_E_FORMAT, "metadata",
                         "metadata value for '%.*s' is not valid UTF-8 (at byte %zu)", SHOWN(key, key_length), bad);
    }
    if (value_length > HRY_MAX_METADATA_BYTES || w->n_meta == UINT32_MAX) {
        return hry__fail(err, HRY_E_FORMAT, "metadata",
                         "metadata exceeds the limit of 16777216 bytes");
    }
    size_t item = 8 + (size_t)pad8(key_length + value_length);
    if (w->meta_length + item > HRY_MAX_METADATA_BYTES) {
        return hry__fail(err, HRY_E_FORMAT, "metadata",
                         "metadata exceeds the limit of 16777216 bytes");
    }
    if (w->meta_length + item > w->meta_cap) {
        size_t cap = w->meta_cap ? w->meta_cap : 256;
        while (cap < w->meta_length + item) {
            cap *= 2;
        }
        uint8_t *m = realloc(w->meta, cap);
        if (m == NULL) {
            return hry__fail(err, HRY_E_NOMEM, "", "out of memory");
        }
        /* the set points into the block: rebuild it over the moved bytes */
        if (m != w->meta) {
            hry__strset_free(&w->keys);
            if (!hry__strset_init(&w->keys, w->n_meta + 1)) {
                w->meta = m;
                w->meta_cap = cap;
                return hry__fail(err, HRY_E_NOMEM, "", "out of memory");
            }
            size_t pos = 0;
            for (uint32_t k = 0; k < w->n_meta; k++) {
                uint32_t kl = hry__le32(m + pos), vl = hry__le32(m + pos + 4);
                hry__strset_add(&w->keys, m + pos + 8, kl, k, NULL);
                pos += 8 + (size_t)pad8((uint64_t)kl + vl);
            }
        }
        w->meta = m;
        w->meta_cap = cap;
    }
    uint8_t *p = w->meta + w->meta_length;
    memset(p, 0, item);
    hry__put32(p, (uint32_t)key_length);
    hry__put32(p + 4, (uint32_t)value_length);
    memcpy(p + 8, key, key_length);
    if (value_length) {
        memcpy(p + 8 + key_length, value, value_length);
    }
    int added = hry__strset_add(&w->keys, p + 8, key_length, w->n_meta, NULL);
    if (added <= 0) {
        return added < 0 ? hry__fail(err, HRY_E_NOMEM, "", "out of memory")
                         : hry__fail(err, HRY_E_FORMAT, "name", "duplicate metadata key '%.*s'",
                                     SHOWN(key, key_length));
    }
    w->meta_length += item;
    w->n_meta++;
    hry__ok(err);
    return HRY_OK;
}

hry_status hry_writer_add(hry_writer *w, const char *name, size_t name_length,
                          const hry_descriptor *d, const void *const *buffers, uint32_t n_buffers,
                          hry_error *err)
{
    if (w == NULL || d == NULL || (buffers == NULL && n_buffers != 0)) {
        return hry__fail(err, HRY_E_ARGUMENT, "", "writer, descriptor or buffers is NULL");
    }
    hry_descriptor local;
    hry_status st = hry__desc_in(&d, &local, err);
    if (st != HRY_OK) {
        return st;
    }
    st = check_name("entry name", name, name_length, HRY_MAX_NAME_BYTES, "name", err);
    if (st != HRY_OK) {
        return st;
    }
    if (w->n_entries == UINT32_MAX) {
        return hry__fail(err, HRY_E_ARGUMENT, "", "too many entries");
    }
    hry_buffer_spec specs[HRY_MAX_BUFFERS];
    uint32_t n;
    if ((st = hry_descriptor_buffer_layout(d, specs, &n, err)) != HRY_OK) {
        return st;
    }
    if (n_buffers != n) {
        return hry__fail(err, HRY_E_FORMAT, "buffers",
                         "entry '%.*s': %u buffers given, the descriptor calls for %u",
                         SHOWN(name, name_length), n_buffers, n);
    }
    wentry *e = calloc(1, sizeof *e);
    if (e == NULL) {
        return hry__fail(err, HRY_E_NOMEM, "", "out of memory");
    }
    uint64_t cursor = w->cursor, a = w->alignment;
    for (uint32_t j = 0; j < n; j++) {
        e->length[j] = specs[j].length;
        e->src[j] = buffers[j];
        if (specs[j].length == 0) {
            e->offset[j] = 0;
            continue;
        }
        if (buffers[j] == NULL) {
            free(e);
            return hry__fail(err, HRY_E_ARGUMENT, "buffers",
                             "entry '%.*s': buffer %u (%llu bytes) is NULL",
                             SHOWN(name, name_length), j,
                             (unsigned long long)specs[j].length);
        }
        uint64_t at;
        if (hry__add(cursor, a - 1, &at) || hry__add(at & ~(a - 1), specs[j].length, &cursor)) {
            free(e);
            return hry__fail(err, HRY_E_FORMAT, "buffers", "the file would exceed 2**64 bytes");
        }
        e->offset[j] = at & ~(a - 1);
    }
    /* element-types.md section 2: a writer must not write a bool8 byte other than 0 or 1
     * (only elements are read: a strided or tiled buffer's gaps are none). */
    if (d->dtype == HRY_BOOL8 && d->layout != HRY_STRIDED && d->layout != HRY_TILED && n &&
        specs[0].length) {
        const uint8_t *p = buffers[0];
        for (uint64_t k = 0; k < specs[0].length; k++) {
            if (p[k] > 1) {
                free(e);
                return hry__fail(err, HRY_E_FORMAT, "data",
                                 "entry '%.*s': bool8 element %llu holds the byte 0x%02x; only "
                                 "0x00 and 0x01 are bool8 values",
                                 SHOWN(name, name_length), (unsigned long long)k, p[k]);
            }
        }
    }
    /* element-types.md section 4.3: padded sub-byte elements are written with their high
     * bits zero. The value is the low bits' (a reader ignores the others), so clearing them
     * keeps it; a buffer with one set is written from a masked copy (the source is never
     * modified), one without from the source. */
    if (d->padded && n && specs[0].length) {
        uint8_t low = (uint8_t)((1u << hry_dtype(d->dtype)->bits) - 1u);
        const uint8_t *p = buffers[0];
        uint64_t k = 0;
        while (k < specs[0].length && !(p[k] & (uint8_t)~low)) {
            k++;
        }
        if (k < specs[0].length) {
            if ((e->masked = malloc((size_t)specs[0].length)) == NULL) {
                wentry_free(e);
                return hry__fail(err, HRY_E_NOMEM, "", "out of memory");
            }
            for (uint64_t j = 0; j < specs[0].length; j++) {
                e->masked[j] = p[j] & low;
            }
            e->src[0] = e->masked;
        }
    }
    e->n = n;
    e->keep = (uint8_t)(0xFFu >> hry__trailing_bits(d));
    size_t written;
    if ((st = hry_encode(d, e->offset, n, e->desc, sizeof e->desc, &written, err)) != HRY_OK) {
        wentry_free(e);
        return st;
    }
    e->desc_length = (uint32_t)written;
    e->name = malloc(name_length);
    if (e->name == NULL) {
        wentry_free(e);
        return hry__fail(err, HRY_E_NOMEM, "", "out of memory");
    }
    memcpy(e->name, name, name_length);
    e->name_length = (uint32_t)name_length;
    if (w->n_entries == w->cap_entries) {
        uint32_t cap = w->cap_entries ? 2 * w->cap_entries : 16;
        wentry **grown = realloc(w->entries, (size_t)cap * sizeof *grown);
        if (grown == NULL) {
            wentry_free(e);
            return hry__fail(err, HRY_E_NOMEM, "", "out of memory");
        }
        w->entries = grown;
        w->cap_entries = cap;
    }
    uint32_t other;
    int added = hry__strset_add(&w->names, e->name, name_length, w->n_entries, &other);
    if (added <= 0) {
        wentry_free(e);
        return added < 0 ? hry__fail(err, HRY_E_NOMEM, "", "out of memory")
                         : hry__fail(err, HRY_E_FORMAT, "name",
                                     "duplicate entry name '%.*s' (also entry %u)",
                                     SHOWN(name, name_length), other);
    }
    w->entries[w->n_entries++] = e;
    w->cursor = cursor;
    w->table_length += 16 + pad8(name_length) + e->desc_length;
    hry__ok(err);
    return HRY_OK;
}

static uint64_t index_end(const hry_writer *w)
{
    return HRY_FILE_HEADER_SIZE + w->table_length + w->meta_length;
}

static uint64_t data_offset(const hry_writer *w)
{
    uint64_t end = index_end(w), page = w->alignment > PAGE ? w->alignment : PAGE;
    return w->cursor ? (end + page - 1) & ~(page - 1) : end;
}

uint64_t hry_writer_file_size(const hry_writer *w)
{
    return data_offset(w) + w->cursor;
}

/* Header, table, metadata and the zero padding up to the data region (data_offset bytes). */
static uint8_t *build_head(const hry_writer *w, const uint32_t *crcs, size_t *size)
{
    uint64_t d_off = data_offset(w);
    uint8_t *h = calloc(1, (size_t)d_off);
    if (h == NULL) {
        return NULL;
    }
    uint8_t *p = h + HRY_FILE_HEADER_SIZE;
    for (uint32_t i = 0; i < w->n_entries; i++) {
        const wentry *e = w->entries[i];
        hry__put_entry_head(p, e->name_length, e->desc_length, w->checksums ? crcs[i] : 0);
        memcpy(p + 16, e->name, e->name_length);
        p += 16 + pad8(e->name_length);
        memcpy(p, e->desc, e->desc_length);
        p += e->desc_length;
    }
    if (w->meta_length) {
        memcpy(p, w->meta, w->meta_length);
    }
    hry__put_file_header(h, w->n_entries, w->n_meta, w->checksums, w->table_length,
                         w->meta_length, d_off, w->cursor, w->alignment);
    *size = (size_t)d_off;
    return h;
}

static void compute_crcs(const hry_writer *w, uint32_t *crcs)
{
    for (uint32_t i = 0; i < w->n_entries; i++) {
        const wentry *e = w->entries[i];
        uint32_t crc = 0;
        for (uint32_t j = 0; j < e->n; j++) {
            int has_last;
            uint8_t last;
            uint64_t n = pieces(e, j, &has_last, &last);
            if (n) {
                crc = hry_crc32(crc, e->src[j], (size_t)n);
            }
            if (has_last) {
                crc = hry_crc32(crc, &last, 1);
            }
        }
        crcs[i] = crc;
    }
}

/* The shard sets of the entries added, checked as verify (and Python's load) checks them:
 * a writer never writes a file its own reader refuses. */
static hry_status check_shards(const hry_writer *w, hry_error *err)
{
    hry__named *named = malloc((w->n_entries ? w->n_entries : 1) * sizeof *named);
    if (named == NULL) {
        return hry__fail(err, HRY_E_NOMEM, "", "out of memory");
    }
    for (uint32_t i = 0; i < w->n_entries; i++) {
        const wentry *e = w->entries[i];
        named[i] = (hry__named){e->name, e->name_length, e->desc, e->desc_length};
    }
    hry_status st = hry__check_shard_sets(named, w->n_entries, &w->names, err);
    free(named);
    return st;
}

hry_status hry_writer_serialize(hry_writer *w, void *out, size_t cap, hry_error *err)
{
    if (w == NULL || out == NULL) {
        return hry__fail(err, HRY_E_ARGUMENT, "", "writer or out is NULL");
    }
    hry_status shards = check_shards(w, err);
    if (shards != HRY_OK) {
        return shards;
    }
    uint64_t total = hry_writer_file_size(w);
    if (cap < total) {
        return hry__fail(err, HRY_E_ARGUMENT, "", "the file needs %llu bytes, %zu given",
                         (unsigned long long)total, cap);
    }
    uint32_t *crcs = calloc(w->n_entries ? w->n_entries : 1, sizeof *crcs);
    if (crcs == NULL) {
        return hry__fail(err, HRY_E_NOMEM, "", "out of memory");
    }
    if (w->checksums) {
        compute_crcs(w, crcs);
    }
    size_t hsize;
    uint8_t *head = build_head(w, crcs, &hsize);
    free(crcs);
    if (head == NULL) {
        return hry__fail(err, HRY_E_NOMEM, "", "out of memory");
    }
    uint8_t *o = out;
    memcpy(o, head, hsize);
    free(head);
    uint8_t *data = o + hsize;
    memset(data, 0, (size_t)w->cursor);
    for (uint32_t i = 0; i < w->n_entries; i++) {
        const wentry *e = w->entries[i];
        for (uint32_t j = 0; j < e->n; j++) {
            int has_last;
            uint8_t last;
            uint64_t n = pieces(e, j, &has_last, &last);
            if (n) {
                memcpy(data + e->offset[j], e->src[j], (size_t)n);
            }
            if (has_last) {
                data[e->offset[j] + n] = last;
            }
        }
    }
    hry__ok(err);
    return HRY_OK;
}

/* ------------------------------------------------------------------ saving */

static int write_all(int fd, const uint8_t *p, uint64_t n)
{
    while (n) {
        size_t chunk = n > (1u << 30) ? (1u << 30) : (size_t)n;
        ssize_t r = write(fd, p, chunk);
        if (r < 0) {
            if (errno == EINTR) {
                continue;
            }
            return -1;
        }
        p += r;
        n -= (uint64_t)r;
    }
    return 0;
}

static void random_hex(char out[13])
{
    uint8_t raw[6] = {0};
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    int ok = 0;
    if (fd >= 0) {
        ok = read(fd, raw, sizeof raw) == (ssize_t)sizeof raw;
        close(fd);
    }
    if (!ok) {
        static unsigned long counter;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        uint64_t v = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20) ^
                     ((uint64_t)getpid() << 40) ^ (uint64_t)(++counter * 0x9E3779B97F4A7C15ull);
        for (int i = 0; i < 6; i++) {
            raw[i] = (uint8_t)(v >> (8 * i));
        }
    }
    for (int i = 0; i < 6; i++) {
        snprintf(out + 2 * i, 3, "%02x", raw[i]);
    }
}

hry_status hry_writer_save(hry_writer *w, const char *path, unsigned flags, hry_error *err)
{
    if (w == NULL || path == NULL || path[0] == '\0') {
        return hry__fail(err, HRY_E_ARGUMENT, "", "writer or path is NULL");
    }
    if (!hry__little_endian()) {
        return hry__fail(err, HRY_E_UNSUPPORTED, "",
                         "Hurray files are little-endian; this host is big-endian");
    }
    hry_status shards = check_shards(w, err);
    if (shards != HRY_OK) {
        return shards;
    }
    int do_sync = !(flags & HRY_SAVE_NO_FSYNC);
    /* the temporary lives next to the target, so that the rename cannot cross file systems */
    const char *slash = strrchr(path, '/');
    size_t dir_len = slash ? (size_t)(slash - path) : 0;
    const char *base = slash ? slash + 1 : path;
    size_t base_len = strlen(base);
    if (base_len == 0) {
        errno = EISDIR;
        return hry__io_fail(err, "cannot write", path);
    }
    if (base_len > 200) {
        base_len = 200;
    }
    char *tmp = malloc(dir_len + base_len + 32);
    char *dir = malloc(dir_len + 2);
    if (tmp == NULL || dir == NULL) {
        free(tmp);
        free(dir);
        return hry__fail(err, HRY_E_NOMEM, "", "out of memory");
    }
    if (slash) {
        memcpy(dir, path, dir_len);
        dir[dir_len] = '\0';
        if (dir_len == 0) {
            strcpy(dir, "/");
        }
    }
    else {
        strcpy(dir, ".");
    }
    int fd = -1;
    for (int attempt = 0; attempt < 16 && fd < 0; attempt++) {
        char hex[13];
        random_hex(hex);
        snprintf(tmp, dir_len + base_len + 32, "%.*s%s.%.*s.%s.tmp", (int)dir_len, path,
                 slash ? "/" : "", (int)base_len, base, hex);
        fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (fd < 0 && errno != EEXIST) {
            break;
        }
    }
    hry_status st = HRY_OK;
    uint32_t *crcs = NULL;
    uint8_t *head = NULL;
    if (fd < 0) {
        st = hry__io_fail(err, "cannot create a temporary file for", path);
        goto done;
    }
    crcs = calloc(w->n_entries ? w->n_entries : 1, sizeof *crcs);
    if (crcs == NULL) {
        st = hry__fail(err, HRY_E_NOMEM, "", "out of memory");
        goto done;
    }
    /* the data first, checksummed as it goes; the head, which holds the checksums, last */
    uint64_t d_off = data_offset(w), pos = 0;
    if (lseek(fd, (off_t)d_off, SEEK_SET) < 0) {
        st = hry__io_fail(err, "cannot seek in", tmp);
        goto done;
    }
    static const uint8_t zeros[4096];
    for (uint32_t i = 0; i < w->n_entries && st == HRY_OK; i++) {
        const wentry *e = w->entries[i];
        for (uint32_t j = 0; j < e->n; j++) {
            if (!e->length[j]) {
                continue;
            }
            while (pos < e->offset[j]) {
                uint64_t gap = e->offset[j] - pos;
                uint64_t k = gap < sizeof zeros ? gap : sizeof zeros;
                if (write_all(fd, zeros, k) != 0) {
                    st = hry__io_fail(err, "cannot write", tmp);
                    goto done;
                }
                pos += k;
            }
            const uint8_t *src = e->src[j];
            int has_last;
            uint8_t last;
            uint64_t body = pieces(e, j, &has_last, &last);
            for (uint64_t k = 0; k < body; k += 4u << 20) {
                uint64_t n = body - k < (4u << 20) ? body - k : (4u << 20);
                if (w->checksums) {
                    crcs[i] = hry_crc32(crcs[i], src + k, (size_t)n);
                }
                if (write_all(fd, src + k, n) != 0) {
                    st = hry__io_fail(err, "cannot write", tmp);
                    goto done;
                }
            }
            if (has_last) {
                if (w->checksums) {
                    crcs[i] = hry_crc32(crcs[i], &last, 1);
                }
                if (write_all(fd, &last, 1) != 0) {
                    st = hry__io_fail(err, "cannot write", tmp);
                    goto done;
                }
            }
            pos = e->offset[j] + e->length[j];
        }
    }
    size_t hsize;
    head = build_head(w, crcs, &hsize);
    if (head == NULL) {
        st = hry__fail(err, HRY_E_NOMEM, "", "out of memory");
        goto done;
    }
    if (lseek(fd, 0, SEEK_SET) < 0 || write_all(fd, head, hsize) != 0) {
        st = hry__io_fail(err, "cannot write", tmp);
        goto done;
    }
    if (do_sync && fsync(fd) != 0) {
        st = hry__io_fail(err, "cannot fsync", tmp);
        goto done;
    }
done:
    if (fd >= 0) {
        if (close(fd) != 0 && st == HRY_OK) {
            st = hry__io_fail(err, "cannot close", tmp);
        }
        if (st == HRY_OK && rename(tmp, path) != 0) {
            st = hry__io_fail(err, "cannot rename the temporary file onto", path);
        }
        if (st != HRY_OK) {
            unlink(tmp);
        }
    }
    if (st == HRY_OK && do_sync) {
        int dfd = open(dir, O_RDONLY | O_CLOEXEC);
        if (dfd >= 0) {
            fsync(dfd); /* best effort: some file systems refuse to fsync a directory */
            close(dfd);
        }
    }
    free(crcs);
    free(head);
    free(tmp);
    free(dir);
    if (st == HRY_OK) {
        hry__ok(err);
    }
    return st;
}
