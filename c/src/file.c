/*
 * Reading Hurray files (docs/spec/container.md): header, entry table, metadata, the data
 * region by memory map, full verification, and the DLPack hand-out.
 *
 * The header and the index are read into private memory (ordinary reads for a path, a copy
 * for borrowed bytes) and checked there in full — every count bounded by the bytes that hold
 * it, every offset and length against the data region — before the data is mapped. The
 * checks and their order follow hurray_bridge/container.py, so both name the same field.
 */
#define _POSIX_C_SOURCE 200809L
#include "shards.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define PAGE 4096u
#define MIN_DESCRIPTOR 56u            /* rank 0, row-major, one buffer */
#define ENTRY_FIXED 16u
#define MIN_ENTRY (ENTRY_FIXED + 8u + MIN_DESCRIPTOR)
#define META_FIXED 8u
#define MIN_META (META_FIXED + 8u)

typedef struct meta_item {
    const char *key, *value;
    uint32_t key_length, value_length;
} meta_item;

struct hry_file {
    atomic_long refs;
    const uint8_t *base;      /* the file's bytes: the mapping, or the borrowed memory */
    void *map;                /* non-NULL when we mapped it */
    size_t map_length;
    uint8_t *head;            /* private copy of bytes [0, index_end) */
    char *strings;            /* names, keys and values, NUL-terminated */
    hry_file_info info;
    uint64_t index_end;
    uint32_t index_crc;
    hry_entry *entries;
    meta_item *meta;
    hry__strset names;
};

/* ------------------------------------------------------------------ errors */

static uint64_t pad8(uint64_t n)
{
    return (n + 7) & ~(uint64_t)7;
}

/* A FormatError naming entry i (and its name once known) and the field. */
HRY_PRINTF(6, 7)
static hry_status entry_fail(hry_error *err, uint32_t i, const char *name, const char *sub,
                             hry_status status, const char *fmt, ...)
{
    if (err == NULL) {
        return status;
    }
    char field[HRY_FIELD_MAX], msg[HRY_MESSAGE_MAX];
    if (sub != NULL && sub[0] != '\0') {
        snprintf(field, sizeof field, "entries[%u].%s", i, sub);
    }
    else {
        snprintf(field, sizeof field, "entries[%u]", i);
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (name != NULL) {
        return hry__fail(err, status, field, "entry '%.100s': %s", name, msg);
    }
    return hry__fail(err, status, field, "%s", msg);
}

/* ------------------------------------------------------------------ header */

static hry_status parse_header(const uint8_t *h, uint64_t actual, hry_file_info *info,
                               uint64_t *index_end, uint32_t *index_crc, hry_error *err)
{
    if (actual < HRY_FILE_HEADER_SIZE) {
        return hry__fail(err, HRY_E_FORMAT, "header",
                         "truncated: %llu bytes, the header alone needs 128",
                         (unsigned long long)actual);
    }
    if (memcmp(h, "HRYF", 4) != 0) {
        if (memcmp(h, "HRYD", 4) == 0) {
            return hry__fail(err, HRY_E_FORMAT, "magic",
                             "this is a bare Hurray descriptor (HRYD), not a Hurray file (HRYF)");
        }
        if (h[0] == 0x93 && memcmp(h + 1, "NUMPY", 5) == 0) {
            return hry__fail(err, HRY_E_FORMAT, "magic",
                             "this looks like a NumPy .npy file; convert it with "
                             "`hurray convert`");
        }
        if (h[8] == '{') {
            return hry__fail(err, HRY_E_FORMAT, "magic",
                             "this looks like a safetensors file; convert it with "
                             "`hurray convert`");
        }
        return hry__fail(err, HRY_E_FORMAT, "magic",
                         "bad magic %02x %02x %02x %02x, expected 'HRYF': not a Hurray file",
                         h[0], h[1], h[2], h[3]);
    }
    if (h[4] != HRY_FILE_VERSION_MAJOR) {
        return hry__fail(err, HRY_E_FORMAT, "version",
                         "unsupported major version %u.%u; this reader supports 1.x", h[4], h[5]);
    }
    if (hry_crc32(0, h, 124) != hry__le32(h + 124)) {
        return hry__fail(err, HRY_E_FORMAT, "header.checksum",
                         "header checksum mismatch: the header is corrupt");
    }
    uint16_t flags = hry__le16(h + 6);
    if (flags & ~HRY_FILE_FLAG_DATA_CHECKSUMS) {
        return hry__fail(err, HRY_E_FORMAT, "flags", "unknown flag bits 0x%04x",
                         flags & ~HRY_FILE_FLAG_DATA_CHECKSUMS);
    }
    for (int i = 80; i < 124; i++) {
        if (h[i]) {
            return hry__fail(err, HRY_E_FORMAT, "header.reserved",
                             "reserved header bytes (80-123) must be zero");
        }
    }
    uint32_t n_entries = hry__le32(h + 8), n_meta = hry__le32(h + 12);
    uint64_t t_off = hry__le64(h + 16), t_len = hry__le64(h + 24), m_off = hry__le64(h + 32),
             m_len = hry__le64(h + 40), d_off = hry__le64(h + 48), d_len = hry__le64(h + 56),
             f_size = hry__le64(h + 64);
    uint32_t align = hry__le32(h + 72);
    if (f_size != actual) {
        if (actual < f_size) {
            return hry__fail(err, HRY_E_FORMAT, "file_size",
                             "truncated: the header declares %llu bytes, %llu are present",
                             (unsigned long long)f_size, (unsigned long long)actual);
        }
        return hry__fail(err, HRY_E_FORMAT, "file_size",
                         "%llu bytes follow the declared end of the file (%llu bytes)",
                         (unsigned long long)(actual - f_size), (unsigned long long)f_size);
    }
    if (t_off != HRY_FILE_HEADER_SIZE) {
        return hry__fail(err, HRY_E_FORMAT, "table_offset",
                         "the entry table must start at 128, not %llu", (unsigned long long)t_off);
    }
    if (t_len > f_size - t_off) {
        return hry__fail(err, HRY_E_FORMAT, "table_length",
                         "the entry table (%llu bytes) extends past the end of the file",
                         (unsigned long long)t_len);
    }
    if (t_len % 8) {
        return hry__fail(err, HRY_E_FORMAT, "table_length",
                         "table length %llu is not a multiple of 8", (unsigned long long)t_len);
    }
    if (m_off != t_off + t_len) {
        return hry__fail(err, HRY_E_FORMAT, "metadata_offset",
                         "the metadata block must follow the table at %llu, not %llu",
                         (unsigned long long)(t_off + t_len), (unsigned long long)m_off);
    }
    if (m_len > HRY_MAX_METADATA_BYTES) {
        return hry__fail(err, HRY_E_FORMAT, "metadata_length",
                         "metadata block of %llu bytes exceeds the limit of %u",
                         (unsigned long long)m_len, HRY_MAX_METADATA_BYTES);
    }
    if (m_len > f_size - m_off) {
        return hry__fail(err, HRY_E_FORMAT, "metadata_length",
                         "the metadata block (%llu bytes) extends past the end of the file",
                         (unsigned long long)m_len);
    }
    if (m_len % 8) {
        return hry__fail(err, HRY_E_FORMAT, "metadata_length",
                         "metadata length %llu is not a multiple of 8", (unsigned long long)m_len);
    }
    if (align < HRY_ALIGNMENT || align > HRY_MAX_FILE_ALIGNMENT || (align & (align - 1))) {
        return hry__fail(err, HRY_E_FORMAT, "alignment",
                         "buffer alignment %u is not a power of two in [64, 2097152]", align);
    }
    uint64_t iend = m_off + m_len; /* <= f_size */
    uint64_t page = align > PAGE ? align : PAGE;
    int over = 0;
    uint64_t expected = iend;
    if (d_len != 0) {
        over = iend > UINT64_MAX - (page - 1);
        expected = over ? 0 : (iend + page - 1) & ~(page - 1);
    }
    if (over || d_off != expected) {
        return hry__fail(err, HRY_E_FORMAT, "data_offset",
                         "the data region must start at %llu (the end of the metadata, rounded "
                         "up to %llu when there is data), not %llu", (unsigned long long)expected,
                         (unsigned long long)page, (unsigned long long)d_off);
    }
    if (d_off > f_size || d_len != f_size - d_off) {
        return hry__fail(err, HRY_E_FORMAT, "data_length",
                         "data region [%llu, +%llu) does not end at the end of the file (%llu)",
                         (unsigned long long)d_off, (unsigned long long)d_len,
                         (unsigned long long)f_size);
    }
    if (n_entries > t_len / MIN_ENTRY) {
        return hry__fail(err, HRY_E_FORMAT, "n_entries",
                         "%u entries cannot fit in a %llu-byte table (an entry takes at least "
                         "80 bytes)", n_entries, (unsigned long long)t_len);
    }
    if (n_meta > m_len / MIN_META) {
        return hry__fail(err, HRY_E_FORMAT, "n_metadata",
                         "%u metadata items cannot fit in a %llu-byte block", n_meta,
                         (unsigned long long)m_len);
    }
    info->version_major = h[4];
    info->version_minor = h[5];
    info->flags = flags;
    info->n_entries = n_entries;
    info->n_metadata = n_meta;
    info->alignment = align;
    info->data_offset = d_off;
    info->data_length = d_len;
    info->file_size = f_size;
    info->base = NULL;
    *index_end = iend;
    *index_crc = hry__le32(h + 76);
    return HRY_OK;
}

/* ------------------------------------------------------------------ index */

typedef struct span {
    uint64_t offset, end;
    uint32_t entry, buffer;
} span;

static int span_cmp(const void *a_, const void *b_)
{
    const span *a = a_, *b = b_;
    if (a->offset != b->offset) {
        return a->offset < b->offset ? -1 : 1;
    }
    if (a->end != b->end) {
        return a->end < b->end ? -1 : 1;
    }
    if (a->entry != b->entry) {
        return a->entry < b->entry ? -1 : 1;
    }
    return a->buffer < b->buffer ? -1 : a->buffer > b->buffer;
}

/* Every non-empty buffer, sorted by (offset, end, entry, buffer). NULL + *n = 0 when none;
 * *oom when malloc failed. */
static span *sorted_spans(const hry_file *f, size_t *n, int *oom)
{
    size_t count = 0;
    *oom = 0;
    for (uint32_t i = 0; i < f->info.n_entries; i++) {
        for (uint32_t j = 0; j < f->entries[i].buffers.count; j++) {
            count += f->entries[i].buffers.entry[j].length != 0;
        }
    }
    *n = count;
    if (count == 0) {
        return NULL;
    }
    span *s = malloc(count * sizeof *s);
    if (s == NULL) {
        *oom = 1;
        return NULL;
    }
    size_t k = 0;
    for (uint32_t i = 0; i < f->info.n_entries; i++) {
        const hry_buffer_table *t = &f->entries[i].buffers;
        for (uint32_t j = 0; j < t->count; j++) {
            if (t->entry[j].length) {
                s[k++] = (span){t->entry[j].offset, t->entry[j].offset + t->entry[j].length, i, j};
            }
        }
    }
    qsort(s, count, sizeof *s, span_cmp);
    return s;
}

/* Buffers tile the data region: no overlap, no gap beyond alignment padding. */
static hry_status check_packing(const hry_file *f, hry_error *err)
{
    size_t n;
    int oom;
    span *s = sorted_spans(f, &n, &oom);
    if (oom) {
        return hry__fail(err, HRY_E_NOMEM, "", "out of memory sorting %zu buffers", n);
    }
    uint64_t prev_end = 0, a = f->info.alignment;
    hry_status st = HRY_OK;
    char sub[48];
    for (size_t k = 0; k < n && st == HRY_OK; k++) {
        const hry_entry *e = &f->entries[s[k].entry];
        snprintf(sub, sizeof sub, "buffers[%u].offset", s[k].buffer);
        if (s[k].offset < prev_end) {
            const hry_entry *p = &f->entries[s[k - 1].entry];
            st = entry_fail(err, s[k].entry, e->name, sub, HRY_E_FORMAT,
                            "buffer [%llu, %llu) overlaps entries[%u].buffers[%u] ('%.60s')",
                            (unsigned long long)s[k].offset, (unsigned long long)s[k].end,
                            s[k - 1].entry, s[k - 1].buffer, p->name);
        }
        else if (s[k].offset != ((prev_end + a - 1) & ~(a - 1))) {
            /* prev_end <= data_length, so rounding up cannot wrap */
            st = entry_fail(err, s[k].entry, e->name, sub, HRY_E_FORMAT,
                            "a gap of %llu bytes precedes this buffer; buffers follow each other "
                            "with only alignment padding between them",
                            (unsigned long long)(s[k].offset - prev_end));
        }
        prev_end = s[k].end;
    }
    free(s);
    if (st == HRY_OK && prev_end != f->info.data_length) {
        st = hry__fail(err, HRY_E_FORMAT, "data_length",
                       "the data region is %llu bytes but its buffers end at %llu",
                       (unsigned long long)f->info.data_length, (unsigned long long)prev_end);
    }
    return st;
}

static int any_nonzero(const uint8_t *p, uint64_t n)
{
    for (uint64_t i = 0; i < n; i++) {
        if (p[i]) {
            return 1;
        }
    }
    return 0;
}

/* Copy n bytes to the string arena, NUL-terminated. */
static char *arena_put(char **cursor, const uint8_t *p, size_t n)
{
    char *s = *cursor;
    memcpy(s, p, n);
    s[n] = '\0';
    *cursor += n + 1;
    return s;
}

static hry_status parse_metadata(hry_file *f, const uint8_t *index, char **arena, hry_error *err)
{
    uint64_t t_len = hry__le64(f->head + 24), m_len = hry__le64(f->head + 40);
    uint64_t pos = t_len, end = t_len + m_len; /* offsets within the index */
    char field[48];
    hry__strset keys;
    if (!hry__strset_init(&keys, f->info.n_metadata)) {
        return hry__fail(err, HRY_E_NOMEM, "", "out of memory");
    }
    hry_status st = HRY_OK;
    for (uint32_t k = 0; k < f->info.n_metadata; k++) {
        if (META_FIXED > end - pos) {
            snprintf(field, sizeof field, "metadata[%u]", k);
            st = hry__fail(err, HRY_E_FORMAT, field,
                           "truncated: the item needs 8 bytes at %llu", (unsigned long long)pos);
            break;
        }
        uint32_t key_len = hry__le32(index + pos), value_len = hry__le32(index + pos + 4);
        if (key_len < 1 || key_len > HRY_MAX_KEY_BYTES) {
            snprintf(field, sizeof field, "metadata[%u].key", k);
            st = hry__fail(err, HRY_E_FORMAT, field, "key length %u is outside [1, 4096]",
                           key_len);
            break;
        }
        uint64_t body = pos + META_FIXED;
        uint64_t stop = body + pad8((uint64_t)key_len + value_len);
        if (stop > end) {
            snprintf(field, sizeof field, "metadata[%u].value", k);
            st = hry__fail(err, HRY_E_FORMAT, field,
                           "truncated: the item needs bytes up to %llu of the metadata block",
                           (unsigned long long)stop);
            break;
        }
        const uint8_t *key = index + body, *value = key + key_len;
        size_t bad;
        snprintf(field, sizeof field, "metadata[%u].key", k);
        if (!hry__utf8_valid(key, key_len, &bad)) {
            st = hry__fail(err, HRY_E_FORMAT, field, "the key is not valid UTF-8 (at byte %zu)",
                           bad);
            break;
        }
        if (memchr(key, 0, key_len) != NULL) {
            st = hry__fail(err, HRY_E_FORMAT, field, "a key must not contain NUL");
            break;
        }
        uint32_t other;
        int added = hry__strset_add(&keys, key, key_len, k, &other);
        if (added < 0) {
            st = hry__fail(err, HRY_E_NOMEM, "", "out of memory");
            break;
        }
        if (added == 0) {
            st = hry__fail(err, HRY_E_FORMAT, field, "duplicate key '%.*s' (also metadata[%u])",
                           (int)(key_len < 100 ? key_len : 100), (const char *)key, other);
            break;
        }
        snprintf(field, sizeof field, "metadata[%u].value", k);
        if (!hry__utf8_valid(value, value_len, &bad)) {
            st = hry__fail(err, HRY_E_FORMAT, field,
                           "the value is not valid UTF-8 (at byte %zu)", bad);
            break;
        }
        if (any_nonzero(value + value_len, stop - body - key_len - value_len)) {
            st = hry__fail(err, HRY_E_FORMAT, field, "item padding must be zero");
            break;
        }
        f->meta[k].key = arena_put(arena, key, key_len);
        f->meta[k].key_length = key_len;
        f->meta[k].value = arena_put(arena, value, value_len);
        f->meta[k].value_length = value_len;
        pos = stop;
    }
    hry__strset_free(&keys);
    if (st == HRY_OK && pos != end) {
        st = hry__fail(err, HRY_E_FORMAT, "metadata_length",
                       "the metadata block is %llu bytes but its %u items take %llu",
                       (unsigned long long)m_len, f->info.n_metadata,
                       (unsigned long long)(pos - t_len));
    }
    return st;
}

/* Parse and check the table and metadata: index = bytes [128, index_end). */
static hry_status parse_index(hry_file *f, hry_error *err)
{
    const uint8_t *index = f->head + HRY_FILE_HEADER_SIZE;
    uint64_t isize = f->index_end - HRY_FILE_HEADER_SIZE;
    if (hry_crc32(0, index, (size_t)isize) != f->index_crc) {
        return hry__fail(err, HRY_E_FORMAT, "index.checksum",
                         "index checksum mismatch: the entry table or metadata is corrupt");
    }
    uint32_t n = f->info.n_entries;
    int checksums = (f->info.flags & HRY_FILE_FLAG_DATA_CHECKSUMS) != 0;
    /* names, keys and values with terminators: at most the index plus one byte per item */
    f->strings = malloc((size_t)isize + n + 2 * (size_t)f->info.n_metadata + 1);
    f->entries = calloc(n ? n : 1, sizeof *f->entries);
    f->meta = calloc(f->info.n_metadata ? f->info.n_metadata : 1, sizeof *f->meta);
    if (f->strings == NULL || f->entries == NULL || f->meta == NULL ||
        !hry__strset_init(&f->names, n)) {
        return hry__fail(err, HRY_E_NOMEM, "", "out of memory for a %u-entry index", n);
    }
    char *arena = f->strings;
    uint64_t pos = 0, end = hry__le64(f->head + 24);
    uint64_t d_len = f->info.data_length, align = f->info.alignment;
    char sub[48];
    for (uint32_t i = 0; i < n; i++) {
        if (ENTRY_FIXED > end - pos) {
            return entry_fail(err, i, NULL, NULL, HRY_E_FORMAT,
                              "truncated: the table ends at %llu, the entry needs 16 bytes at "
                              "%llu", (unsigned long long)end, (unsigned long long)pos);
        }
        const uint8_t *p = index + pos;
        uint32_t name_len = hry__le32(p), desc_len = hry__le32(p + 4), crc = hry__le32(p + 8);
        if (hry__le32(p + 12) != 0) {
            return entry_fail(err, i, NULL, "reserved", HRY_E_FORMAT,
                              "reserved entry bytes must be zero");
        }
        if (name_len < 1 || name_len > HRY_MAX_NAME_BYTES) {
            return entry_fail(err, i, NULL, "name_length", HRY_E_FORMAT,
                              "name length %u is outside [1, 4096]", name_len);
        }
        if (desc_len < MIN_DESCRIPTOR || desc_len % 8) {
            return entry_fail(err, i, NULL, "descriptor_length", HRY_E_FORMAT,
                              "descriptor length %u is not a multiple of 8 of at least 56",
                              desc_len);
        }
        if (crc != 0 && !checksums) {
            return entry_fail(err, i, NULL, "checksum", HRY_E_FORMAT,
                              "non-zero checksum in a file without data checksums");
        }
        uint64_t name_at = pos + ENTRY_FIXED, desc_at = name_at + pad8(name_len),
                 desc_end = desc_at + desc_len;
        if (desc_end > end) {
            return entry_fail(err, i, NULL, "descriptor_length", HRY_E_FORMAT,
                              "truncated: the entry needs bytes up to %llu of a %llu-byte table",
                              (unsigned long long)desc_end, (unsigned long long)end);
        }
        const uint8_t *name = index + name_at;
        if (any_nonzero(name + name_len, desc_at - name_at - name_len)) {
            return entry_fail(err, i, NULL, "name", HRY_E_FORMAT, "name padding must be zero");
        }
        size_t bad;
        if (!hry__utf8_valid(name, name_len, &bad)) {
            return entry_fail(err, i, NULL, "name", HRY_E_FORMAT,
                              "the name is not valid UTF-8 (at byte %zu)", bad);
        }
        hry_entry *e = &f->entries[i];
        e->position = i;
        e->name = arena_put(&arena, name, name_len);
        e->name_length = name_len;
        if (memchr(name, 0, name_len) != NULL) {
            return entry_fail(err, i, e->name, "name", HRY_E_FORMAT,
                              "a name must not contain NUL");
        }
        uint32_t other;
        int added = hry__strset_add(&f->names, (const uint8_t *)e->name, name_len, i, &other);
        if (added < 0) {
            return hry__fail(err, HRY_E_NOMEM, "", "out of memory");
        }
        if (added == 0) {
            return entry_fail(err, i, e->name, "name", HRY_E_FORMAT,
                              "duplicate name (also entries[%u])", other);
        }
        hry_descriptor d;
        hry_descriptor_init(&d);
        hry_error inner;
        size_t used;
        if (hry_decode_prefix(index + desc_at, desc_len, &d, &e->buffers, &used, NULL, &inner) !=
            HRY_OK) {
            return entry_fail(err, i, e->name, inner.field, inner.status, "%s", inner.message);
        }
        if (used != desc_len) {
            return entry_fail(err, i, e->name, "descriptor_length", HRY_E_FORMAT,
                              "descriptor takes %zu bytes, the entry says %u", used, desc_len);
        }
        if (hry_descriptor_is_dynamic(&d)) {
            return entry_fail(err, i, e->name, "shape", HRY_E_FORMAT,
                              "a stored tensor cannot have dynamic dimensions");
        }
        e->descriptor_bytes = index + desc_at;
        e->descriptor_length = desc_len;
        e->has_checksum = checksums;
        e->checksum = checksums ? crc : 0;
        e->nbytes = 0;
        for (uint32_t j = 0; j < e->buffers.count; j++) {
            const hry_buffer_entry *b = &e->buffers.entry[j];
            e->nbytes += b->length; /* fits: the buffers lie in the file (checked below) */
            if (b->length == 0) {
                continue;
            }
            snprintf(sub, sizeof sub, "buffers[%u].offset", j);
            if (b->offset % align) {
                return entry_fail(err, i, e->name, sub, HRY_E_FORMAT,
                                  "offset %llu is not a multiple of the file's alignment %llu",
                                  (unsigned long long)b->offset, (unsigned long long)align);
            }
            if (b->offset > d_len || b->length > d_len - b->offset) {
                return entry_fail(err, i, e->name, sub, HRY_E_FORMAT,
                                  "%s buffer [%llu, +%llu) extends past the %llu-byte data region",
                                  hry_role_name(b->role), (unsigned long long)b->offset,
                                  (unsigned long long)b->length, (unsigned long long)d_len);
            }
        }
        pos = desc_end;
    }
    if (pos != end) {
        return hry__fail(err, HRY_E_FORMAT, "table_length",
                         "the table is %llu bytes but its %u entries take %llu",
                         (unsigned long long)end, n, (unsigned long long)pos);
    }
    hry_status st = check_packing(f, err);
    if (st != HRY_OK) {
        return st;
    }
    return parse_metadata(f, index, &arena, err);
}

/* ------------------------------------------------------------------ open */

static void file_free(hry_file *f)
{
    if (f == NULL) {
        return;
    }
    if (f->map != NULL) {
        munmap(f->map, f->map_length);
    }
    hry__strset_free(&f->names);
    free(f->head);
    free(f->strings);
    free(f->entries);
    free(f->meta);
    free(f);
}

static hry_file *file_new(void)
{
    hry_file *f = calloc(1, sizeof *f);
    if (f != NULL) {
        atomic_init(&f->refs, 1);
        f->info.struct_size = (uint32_t)sizeof f->info;
    }
    return f;
}

/* The last step of every opener: verify on request, then hand f out, or free it on any failure. */
static hry_status finish_open(hry_file *f, hry_status st, unsigned flags, hry_file **out,
                              hry_error *err)
{
    if (st == HRY_OK && (flags & HRY_OPEN_VERIFY)) {
        st = hry_file_verify(f, err);
    }
    if (st != HRY_OK) {
        file_free(f);
        return st;
    }
    hry__ok(err);
    *out = f;
    return HRY_OK;
}

hry_status hry_file_open_memory(const void *data, size_t len, unsigned flags, hry_file **out,
                                hry_error *err)
{
    if (out == NULL || (data == NULL && len != 0)) {
        return hry__fail(err, HRY_E_ARGUMENT, "input", "data or out is NULL");
    }
    *out = NULL;
    const uint8_t *b = data;
    hry_file *f = file_new();
    if (f == NULL) {
        return hry__fail(err, HRY_E_NOMEM, "", "out of memory");
    }
    uint8_t hdr[HRY_FILE_HEADER_SIZE] = {0};
    if (len) {
        memcpy(hdr, b, len < sizeof hdr ? len : sizeof hdr);
    }
    hry_status st = parse_header(hdr, len, &f->info, &f->index_end, &f->index_crc, err);
    if (st == HRY_OK) {
        f->head = malloc((size_t)f->index_end);
        if (f->head == NULL) {
            st = hry__fail(err, HRY_E_NOMEM, "", "out of memory for the index");
        }
    }
    if (st == HRY_OK) {
        memcpy(f->head, b, (size_t)f->index_end); /* index_end <= file_size == len */
        f->base = b;
        f->info.base = b;
        st = parse_index(f, err);
    }
    return finish_open(f, st, flags, out, err);
}

static hry_status read_at(int fd, uint8_t *buf, size_t n, uint64_t at, hry_error *err)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = pread(fd, buf + got, n - got, (off_t)(at + got));
        if (r < 0) {
            if (errno == EINTR) {
                continue;
            }
            return hry__io_fail(err, "cannot read", "the file");
        }
        if (r == 0) {
            return hry__fail(err, HRY_E_FORMAT, "file_size",
                             "truncated: wanted %zu bytes, read %zu (did the file change while "
                             "it was read?)", n, got);
        }
        got += (size_t)r;
    }
    return HRY_OK;
}

hry_status hry_file_open(const char *path, unsigned flags, hry_file **out, hry_error *err)
{
    if (out == NULL || path == NULL) {
        return hry__fail(err, HRY_E_ARGUMENT, "input", "path or out is NULL");
    }
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        return hry__io_fail(err, "cannot open", path);
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        hry_status s = hry__io_fail(err, "cannot stat", path);
        close(fd);
        return s;
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        errno = EINVAL;
        return hry__io_fail(err, "not a regular file:", path);
    }
    uint64_t size = (uint64_t)sb.st_size;
    hry_file *f = file_new();
    if (f == NULL) {
        close(fd);
        return hry__fail(err, HRY_E_NOMEM, "", "out of memory");
    }
    uint8_t hdr[HRY_FILE_HEADER_SIZE] = {0};
    hry_status st = HRY_OK;
    if (size >= HRY_FILE_HEADER_SIZE) {
        st = read_at(fd, hdr, sizeof hdr, 0, err);
    }
    if (st == HRY_OK) {
        st = parse_header(hdr, size, &f->info, &f->index_end, &f->index_crc, err);
    }
    if (st == HRY_OK && f->index_end > SIZE_MAX) {
        st = hry__fail(err, HRY_E_UNSUPPORTED, "file_size", "the index does not fit in memory");
    }
    if (st == HRY_OK && (f->head = malloc((size_t)f->index_end)) == NULL) {
        st = hry__fail(err, HRY_E_NOMEM, "", "out of memory for a %llu-byte index",
                       (unsigned long long)f->index_end);
    }
    if (st == HRY_OK) {
        memcpy(f->head, hdr, sizeof hdr);
        st = read_at(fd, f->head + HRY_FILE_HEADER_SIZE,
                     (size_t)(f->index_end - HRY_FILE_HEADER_SIZE), HRY_FILE_HEADER_SIZE, err);
    }
    if (st == HRY_OK) {
        st = parse_index(f, err);
    }
    if (st == HRY_OK && f->info.data_length > 0) {
        if (size > SIZE_MAX) {
            st = hry__fail(err, HRY_E_UNSUPPORTED, "file_size", "the file is too large to map");
        }
        else {
            void *m = mmap(NULL, (size_t)size, PROT_READ, MAP_SHARED, fd, 0);
            if (m == MAP_FAILED) {
                st = hry__io_fail(err, "cannot map", path);
            }
            else {
                f->map = m;
                f->map_length = (size_t)size;
                f->base = m;
                f->info.base = m;
                struct stat again;
                if (fstat(fd, &again) != 0 || (uint64_t)again.st_size != size) {
                    st = hry__fail(err, HRY_E_FORMAT, "file_size",
                                   "the file changed size while it was opened");
                }
            }
        }
    }
    close(fd); /* the mapping stays valid without the descriptor */
    return finish_open(f, st, flags, out, err);
}

hry_status hry_file_verify(const hry_file *f, hry_error *err)
{
    if (f == NULL) {
        return hry__fail(err, HRY_E_ARGUMENT, "", "file is NULL");
    }
    const uint8_t *base = f->base;
    uint64_t pad_len = f->info.data_offset - f->index_end;
    if (pad_len && any_nonzero(base + f->index_end, pad_len)) {
        return hry__fail(err, HRY_E_FORMAT, "data_offset",
                         "the padding before the data region must be zero");
    }
    const uint8_t *data = base != NULL ? base + f->info.data_offset : NULL;
    for (uint32_t i = 0; i < f->info.n_entries; i++) {
        const hry_entry *e = &f->entries[i];
        if (!e->has_checksum) {
            continue;
        }
        uint32_t crc = 0;
        for (uint32_t j = 0; j < e->buffers.count; j++) {
            const hry_buffer_entry *b = &e->buffers.entry[j];
            if (b->length) {
                crc = hry_crc32(crc, data + b->offset, (size_t)b->length);
            }
        }
        if (crc != e->checksum) {
            return entry_fail(err, i, e->name, "checksum", HRY_E_FORMAT,
                              "data checksum mismatch (stored 0x%08x, computed 0x%08x): the "
                              "tensor's bytes are corrupt", e->checksum, crc);
        }
    }
    size_t n;
    int oom;
    span *s = sorted_spans(f, &n, &oom);
    if (oom) {
        return hry__fail(err, HRY_E_NOMEM, "", "out of memory");
    }
    hry_status st = HRY_OK;
    for (size_t k = 1; k < n; k++) {
        if (any_nonzero(data + s[k - 1].end, s[k].offset - s[k - 1].end)) {
            char sub[48];
            snprintf(sub, sizeof sub, "buffers[%u].offset", s[k].buffer);
            st = entry_fail(err, s[k].entry, f->entries[s[k].entry].name, sub, HRY_E_FORMAT,
                            "the padding before this buffer must be zero");
            break;
        }
    }
    free(s);
    /* Per entry, in Python's order: packed sub-byte data ends in zero bits (element-types.md
     * section 4.1 rule 6), padded sub-byte elements have their high bits zero (section 4.3). */
    for (uint32_t i = 0; st == HRY_OK && i < f->info.n_entries; i++) {
        const hry_entry *e = &f->entries[i];
        const hry_buffer_entry *b = &e->buffers.entry[0];
        hry_descriptor d;
        hry_descriptor_init(&d);
        if (e->buffers.count == 0 || b->length == 0 ||
                hry_decode(e->descriptor_bytes, e->descriptor_length, &d, NULL, NULL) != HRY_OK) {
            continue; /* the index was checked when the file was opened */
        }
        unsigned k = hry__trailing_bits(&d);
        uint8_t last = data[b->offset + b->length - 1];
        uint8_t tmask = (uint8_t)(0xFFu & ~(0xFFu >> k));
        if (k && (last & tmask)) {
            st = entry_fail(err, i, e->name, "buffers[0].trailing_bits", HRY_E_FORMAT,
                            "the last byte of its packed %s %s buffer is 0x%02x: the trailing "
                            "bits after the last element (mask 0x%02x) must be zero",
                            hry_dtype(d.dtype)->name, hry_role_name(b->role), last, tmask);
        }
        if (st != HRY_OK || !d.padded) {
            continue;
        }
        unsigned bits = hry_dtype(d.dtype)->bits;
        uint8_t mask = (uint8_t)(0xFFu & ~((1u << bits) - 1u));
        uint64_t element;
        uint8_t byte;
        if (hry__padded_high_bits(&d, data + b->offset, b->length, mask, &element, &byte)) {
            st = entry_fail(err, i, e->name, "buffers[0].high_bits", HRY_E_FORMAT,
                            "element %llu of its padded %s %s buffer is the byte 0x%02x: the "
                            "%u high bits of each element (mask 0x%02x) must be zero",
                            (unsigned long long)element, hry_dtype(d.dtype)->name,
                            hry_role_name(b->role), byte, 8 - bits, mask);
        }
    }
    if (st == HRY_OK) { /* after the bytes, as Python's load(verify=True) */
        hry__named *named = malloc((f->info.n_entries ? f->info.n_entries : 1) * sizeof *named);
        if (named == NULL) {
            return hry__fail(err, HRY_E_NOMEM, "", "out of memory");
        }
        for (uint32_t i = 0; i < f->info.n_entries; i++) {
            const hry_entry *e = &f->entries[i];
            named[i] = (hry__named){(const uint8_t *)e->name, e->name_length,
                                    e->descriptor_bytes, e->descriptor_length};
        }
        st = hry__check_shard_sets(named, f->info.n_entries, &f->names, err);
        free(named);
    }
    if (st == HRY_OK) {
        hry__ok(err);
    }
    return st;
}

hry_status hry_verify_path(const char *path, hry_error *err)
{
    hry_file *f;
    hry_status st = hry_file_open(path, HRY_OPEN_VERIFY, &f, err);
    if (st == HRY_OK) {
        hry_file_close(f);
    }
    return st;
}

void hry_file_retain(hry_file *f)
{
    if (f != NULL) {
        atomic_fetch_add_explicit(&f->refs, 1, memory_order_relaxed);
    }
}

void hry_file_release(hry_file *f)
{
    if (f != NULL && atomic_fetch_sub_explicit(&f->refs, 1, memory_order_acq_rel) == 1) {
        file_free(f);
    }
}

void hry_file_close(hry_file *f)
{
    hry_file_release(f);
}

/* ------------------------------------------------------------------ access */

/* The hry_file_info of 2.0, the first with struct_size: later versions append after base. */
#define FILE_INFO_MIN_SIZE (offsetof(hry_file_info, base) + sizeof(const uint8_t *))

hry_status hry_file_get_info(const hry_file *f, hry_file_info *info, hry_error *err)
{
    if (f == NULL || info == NULL) {
        return hry__fail(err, HRY_E_ARGUMENT, "", "file or info is NULL");
    }
    uint32_t size = info->struct_size;
    hry_status st = hry__struct_size(size, FILE_INFO_MIN_SIZE, "hry_file_info", err);
    if (st != HRY_OK) {
        return st;
    }
    /* what the caller's size covers; fields of a later version it has read as zero */
    memcpy(info, &f->info, size < sizeof *info ? size : sizeof *info);
    if (size > sizeof *info) {
        memset((uint8_t *)info + sizeof *info, 0, size - sizeof *info);
    }
    info->struct_size = size;
    hry__ok(err);
    return HRY_OK;
}

uint32_t hry_file_entry_count(const hry_file *f)
{
    return f->info.n_entries;
}

const hry_entry *hry_file_entry(const hry_file *f, uint32_t i)
{
    return i < f->info.n_entries ? &f->entries[i] : NULL;
}

const hry_entry *hry_file_find(const hry_file *f, const char *name, size_t name_length)
{
    uint32_t i;
    if (name == NULL || !hry__strset_find(&f->names, (const uint8_t *)name, name_length, &i)) {
        return NULL;
    }
    return &f->entries[i];
}

hry_status hry_entry_descriptor(const hry_entry *e, hry_descriptor *out, hry_error *err)
{
    return hry_decode(e->descriptor_bytes, e->descriptor_length, out, NULL, err);
}

const void *hry_file_buffer(const hry_file *f, const hry_entry *e, uint32_t j)
{
    if (j >= e->buffers.count || e->buffers.entry[j].length == 0 || f->base == NULL) {
        return NULL;
    }
    return f->base + f->info.data_offset + e->buffers.entry[j].offset;
}

uint32_t hry_file_metadata_count(const hry_file *f)
{
    return f->info.n_metadata;
}

hry_status hry_file_metadata(const hry_file *f, uint32_t k, const char **key, uint32_t *key_length,
                             const char **value, uint32_t *value_length)
{
    if (k >= f->info.n_metadata) {
        return HRY_E_ARGUMENT;
    }
    if (key != NULL) {
        *key = f->meta[k].key;
    }
    if (key_length != NULL) {
        *key_length = f->meta[k].key_length;
    }
    if (value != NULL) {
        *value = f->meta[k].value;
    }
    if (value_length != NULL) {
        *value_length = f->meta[k].value_length;
    }
    return HRY_OK;
}

/* ------------------------------------------------------------------ DLPack */

typedef struct export_block {
    DLManagedTensorVersioned managed; /* first: the deleter's argument is the block */
    hry_file *file;
    int64_t dims[]; /* shape, then strides */
} export_block;

static void export_deleter(DLManagedTensorVersioned *self)
{
    if (self == NULL) {
        return;
    }
    export_block *blk = (export_block *)self;
    hry_file *f = blk->file;
    free(blk);
    hry_file_release(f);
}

hry_status hry_file_to_dlpack(hry_file *f, uint32_t i, DLManagedTensorVersioned **out,
                              hry_error *err)
{
    if (f == NULL || out == NULL || i >= f->info.n_entries) {
        return hry__fail(err, HRY_E_ARGUMENT, "", "no entry %u", i);
    }
    *out = NULL;
    if (!hry__little_endian()) {
        return hry__fail(err, HRY_E_UNSUPPORTED, "",
                         "tensor bytes are little-endian; this host is big-endian");
    }
    const hry_entry *e = &f->entries[i];
    hry_descriptor d;
    hry_descriptor_init(&d);
    hry_status st = hry_entry_descriptor(e, &d, err);
    if (st != HRY_OK) {
        return st;
    }
    const hry_dtype_info *t = hry_dtype(d.dtype);
    if ((d.layout != HRY_ROW_MAJOR && d.layout != HRY_STRIDED) || d.has_quantization) {
        return entry_fail(err, i, e->name, "layout", HRY_E_UNSUPPORTED,
                          "a %s tensor has no DLPack form (only dense, unquantized tensors do)",
                          d.has_quantization ? "quantized" : hry_layout_name(d.layout));
    }
    if (!t->has_dlpack) {
        return entry_fail(err, i, e->name, "dtype", HRY_E_UNSUPPORTED,
                          "element type %s has no DLPack equivalent", t->name);
    }
    int empty = hry_descriptor_is_empty(&d);
    int64_t strides[HRY_MAX_RANK];
    uint64_t acc = 1, origin = 0;
    for (uint32_t k = d.rank; k-- > 0;) {
        if (d.shape[k] > (uint64_t)INT64_MAX) {
            return entry_fail(err, i, e->name, "shape", HRY_E_UNSUPPORTED,
                              "dimension %u (%llu) exceeds DLPack's int64 shape", k,
                              (unsigned long long)d.shape[k]);
        }
        if (d.layout == HRY_STRIDED) {
            strides[k] = d.strides[k];
            if (d.strides[k] < 0 && d.shape[k] > 0) {
                origin += (d.shape[k] - 1) * (uint64_t)(-d.strides[k]); /* < span: fits */
            }
        }
        else {
            if (acc > (uint64_t)INT64_MAX) {
                return entry_fail(err, i, e->name, "shape", HRY_E_UNSUPPORTED,
                                  "the compact strides of this shape exceed int64");
            }
            strides[k] = (int64_t)acc;
            uint64_t dim = d.shape[k] > 0 ? d.shape[k] : 1;
            if (hry__mul(acc, dim, &acc)) {
                acc = UINT64_MAX; /* only an error if a stride further out needs it */
            }
        }
    }
    export_block *blk = malloc(sizeof *blk + 2 * (size_t)d.rank * sizeof(int64_t));
    if (blk == NULL) {
        return hry__fail(err, HRY_E_NOMEM, "", "out of memory");
    }
    DLManagedTensorVersioned *m = &blk->managed;
    m->version.major = 1;
    m->version.minor = 3;
    m->manager_ctx = f;
    m->deleter = export_deleter;
    m->flags = DLPACK_FLAG_BITMASK_READ_ONLY |
               (d.padded ? DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED : 0);
    DLTensor *dl = &m->dl_tensor;
    const hry_buffer_entry *b = &e->buffers.entry[0];
    if (empty || b->length == 0) {
        dl->data = NULL; /* an empty tensor points nowhere: nothing is allocated for it */
    }
    else {
        uint64_t item = t->bits >= 8 ? t->bits / 8 : 1;
        /* read-only memory: DLPack has no const pointer, the READ_ONLY flag says it */
        dl->data = (void *)(uintptr_t)(f->base + f->info.data_offset + b->offset + origin * item);
    }
    dl->device.device_type = kDLCPU;
    dl->device.device_id = 0;
    dl->ndim = (int32_t)d.rank;
    dl->dtype.code = t->dlpack_code;
    dl->dtype.bits = t->dlpack_bits;
    dl->dtype.lanes = 1;
    dl->shape = blk->dims;
    dl->strides = blk->dims + d.rank;
    for (uint32_t k = 0; k < d.rank; k++) {
        blk->dims[k] = (int64_t)d.shape[k];
        blk->dims[d.rank + k] = strides[k];
    }
    dl->byte_offset = 0;
    blk->file = f;
    hry_file_retain(f);
    *out = m;
    hry__ok(err);
    return HRY_OK;
}
