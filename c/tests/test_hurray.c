/*
 * The C library's test driver. tests/c/test_c_library.py builds it (plain and under
 * ASan+UBSan) and runs each mode; the modes that print JSON are checked against what
 * the Python reference computes, so the assertions compare two implementations.
 *
 *   test_hurray unit                 self-contained checks of the API (exit 0 = all passed)
 *   test_hurray vectors DIR          one JSON line per DIR/NAME.bin: decoded fields, re-encoding
 *   test_hurray files DIR            one JSON line per DIR/NAME.hurray: what the reader reports,
 *                                    the writer's re-serialisation, the DLPack hand-out
 *   test_hurray decode [prefix]      stdin: one hex descriptor per line; stdout: "ok SIZE HEX"
 *                                    (re-encoded with the decoded offsets) or "err FIELD"
 *   test_hurray check-files          stdin: one path per line; stdout: "ok" or "err FIELD"
 *   test_hurray make-files DIR       writes C-built files into DIR, prints their manifest (JSON)
 *   test_hurray bench HEX            median time of one strict decode of HEX, in ns (for
 *                                    benchmarks/c_decoder.py)
 */
#define _POSIX_C_SOURCE 200809L
#include "hurray.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------------------ helpers */

static int failures = 0, checks = 0;

#define CHECK(cond)                                                                         \
    do {                                                                                    \
        checks++;                                                                           \
        if (!(cond)) {                                                                      \
            failures++;                                                                     \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);        \
        }                                                                                   \
    } while (0)

#define CHECK_FIELD(status, err, want_status, want_field)                                   \
    do {                                                                                    \
        checks++;                                                                           \
        if ((status) != (want_status) || strcmp((err).field, (want_field)) != 0) {          \
            failures++;                                                                     \
            fprintf(stderr, "%s:%d: expected %d '%s', got %d '%s': %s\n", __FILE__,         \
                    __LINE__, (int)(want_status), (want_field), (int)(status), (err).field, \
                    (err).message);                                                         \
        }                                                                                   \
    } while (0)

static uint8_t *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        return NULL;
    }
    size_t cap = 4096, n = 0;
    uint8_t *b = malloc(cap);
    for (;;) {
        if (n == cap) {
            cap *= 2;
            b = realloc(b, cap);
        }
        size_t r = fread(b + n, 1, cap - n, f);
        if (r == 0) {
            break;
        }
        n += r;
    }
    fclose(f);
    *len = n;
    return b;
}

static void hex(FILE *o, const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        fprintf(o, "%02x", p[i]);
    }
}

static int unhex(const char *s, uint8_t *out, size_t cap, size_t *n)
{
    size_t len = strlen(s);
    while (len && (s[len - 1] == '\n' || s[len - 1] == '\r')) {
        len--;
    }
    if (len % 2 || len / 2 > cap) {
        return 0;
    }
    for (size_t i = 0; i < len / 2; i++) {
        unsigned v;
        if (sscanf(s + 2 * i, "%2x", &v) != 1) {
            return 0;
        }
        out[i] = (uint8_t)v;
    }
    *n = len / 2;
    return 1;
}

static void json_str(FILE *o, const char *s, size_t n)
{
    fputc('"', o);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') {
            fprintf(o, "\\%c", c);
        }
        else if (c < 0x20) {
            fprintf(o, "\\u%04x", c);
        }
        else {
            fputc(c, o);
        }
    }
    fputc('"', o);
}

static void u64s(FILE *o, const uint64_t *v, uint32_t n)
{
    fputc('[', o);
    for (uint32_t i = 0; i < n; i++) {
        fprintf(o, "%s%llu", i ? ", " : "", (unsigned long long)v[i]);
    }
    fputc(']', o);
}

static int has_suffix(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

static int cmp_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The sorted names in dir ending in suffix. */
static char **list_dir(const char *dir, const char *suffix, size_t *n)
{
    DIR *d = opendir(dir);
    char **names = NULL;
    size_t count = 0, cap = 0;
    struct dirent *de;
    if (d == NULL) {
        *n = 0;
        return NULL;
    }
    while ((de = readdir(d)) != NULL) {
        if (!has_suffix(de->d_name, suffix)) {
            continue;
        }
        if (count == cap) {
            cap = cap ? 2 * cap : 32;
            names = realloc(names, cap * sizeof *names);
        }
        names[count] = malloc(strlen(de->d_name) + 1);
        strcpy(names[count++], de->d_name);
    }
    closedir(d);
    qsort(names, count, sizeof *names, cmp_names);
    *n = count;
    return names;
}

/* ------------------------------------------------------------------ vectors */

static int mode_vectors(const char *dir)
{
    size_t n;
    char **names = list_dir(dir, ".bin", &n);
    if (n == 0) {
        fprintf(stderr, "no .bin vectors in %s\n", dir);
        return 1;
    }
    for (size_t k = 0; k < n; k++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, names[k]);
        size_t len;
        uint8_t *raw = read_file(path, &len);
        hry_descriptor d;
        hry_descriptor_init(&d);
        hry_buffer_table t;
        hry_error err;
        names[k][strlen(names[k]) - 4] = '\0';
        printf("{\"name\": \"%s\", ", names[k]);
        if (raw == NULL || hry_decode(raw, len, &d, &t, &err) != HRY_OK) {
            printf("\"error\": \"%s: %s\"}\n", raw ? err.field : "unreadable",
                   raw ? err.message : "");
            free(raw);
            continue;
        }
        const hry_dtype_info *ti = hry_dtype(d.dtype);
        int dyn = hry_descriptor_is_dynamic(&d);
        printf("\"fields\": {\"rank\": %u, \"shape\": ", d.rank);
        u64s(stdout, d.shape, d.rank);
        printf(", \"dtype\": \"%s\", \"type_tag\": %u, \"layout\": \"%s\", \"flags\": %u, "
               "\"dynamic\": %s, \"empty\": %s, ", ti->name, d.dtype, hry_layout_name(d.layout),
               hry_descriptor_flags(&d), dyn ? "true" : "false",
               hry_descriptor_is_empty(&d) ? "true" : "false");
        uint64_t count = 0, nbytes = 0;
        hry_status sc = hry_descriptor_element_count(&d, &count, &err);
        hry_status sn = hry_descriptor_nbytes(&d, &nbytes, &err);
        hry_buffer_spec specs[HRY_MAX_BUFFERS];
        uint32_t ns = 0;
        hry_status sl = hry_descriptor_buffer_layout(&d, specs, &ns, &err);
        if (dyn) {
            CHECK(sc == HRY_E_DYNAMIC && sn == HRY_E_DYNAMIC && sl == HRY_E_DYNAMIC);
            printf("\"element_count\": null, \"nbytes\": null, ");
        }
        else {
            CHECK(sc == HRY_OK && sn == HRY_OK && sl == HRY_OK);
            printf("\"element_count\": %llu, \"nbytes\": %llu, ", (unsigned long long)count,
                   (unsigned long long)nbytes);
        }
        printf("\"buffers\": [");
        for (uint32_t j = 0; j < t.count; j++) {
            printf("%s[\"%s\", %llu, %llu]", j ? ", " : "", hry_role_name(t.entry[j].role),
                   (unsigned long long)t.entry[j].offset, (unsigned long long)t.entry[j].length);
        }
        printf("], \"size\": %zu}", len);
        /* the computed layout: same roles and lengths as the table */
        printf(", \"layout\": [");
        for (uint32_t j = 0; j < ns; j++) {
            printf("%s[\"%s\", %llu]", j ? ", " : "", hry_role_name(specs[j].role),
                   (unsigned long long)specs[j].length);
        }
        printf("]");
        /* re-encoded canonically and with the table's offsets */
        uint8_t out[HRY_MAX_DESCRIPTOR_SIZE];
        size_t w = 0;
        CHECK(hry_encoded_size(&d) == len);
        if (hry_encode(&d, NULL, 0, out, sizeof out, &w, &err) == HRY_OK) {
            printf(", \"canonical\": \"");
            hex(stdout, out, w);
            printf("\"");
        }
        if (dyn) {
            /* resolving the dynamic dimensions with 0 gives an empty, valid descriptor */
            hry_descriptor r = d;
            for (uint32_t i = 0; i < r.rank; i++) {
                if (r.shape[i] == HRY_DYNAMIC) {
                    r.shape[i] = 0;
                }
            }
            uint64_t rb = 1;
            int ok = hry_descriptor_check(&r, &err) == HRY_OK && hry_descriptor_is_empty(&r) &&
                     hry_descriptor_nbytes(&r, &rb, &err) == HRY_OK && rb == 0;
            printf(", \"resolved_with_0\": %s", ok ? "true" : "false");
        }
        printf("}\n");
        free(raw);
    }
    for (size_t k = 0; k < n; k++) {
        free(names[k]);
    }
    free(names);
    return failures != 0;
}

/* ------------------------------------------------------------------ files */

static void report_file(const char *stem, const uint8_t *raw, size_t len, const char *path)
{
    hry_file *f;
    hry_error err;
    printf("{\"name\": \"%s\", ", stem);
    if (hry_file_open(path, HRY_OPEN_VERIFY, &f, &err) != HRY_OK) {
        printf("\"error\": \"%s\"}\n", err.field);
        return;
    }
    hry_file_info info;
    hry_file_info_init(&info);
    hry_file_get_info(f, &info, NULL);
    printf("\"report\": {\"file_size\": %llu, \"version\": [%u, %u], \"flags\": %u, "
           "\"alignment\": %u, \"data_offset\": %llu, \"data_length\": %llu, \"metadata\": {",
           (unsigned long long)info.file_size, info.version_major, info.version_minor,
           info.flags, info.alignment, (unsigned long long)info.data_offset,
           (unsigned long long)info.data_length);
    for (uint32_t k = 0; k < hry_file_metadata_count(f); k++) {
        const char *key, *value;
        uint32_t kl, vl;
        hry_file_metadata(f, k, &key, &kl, &value, &vl);
        printf("%s", k ? ", " : "");
        json_str(stdout, key, kl);
        printf(": ");
        json_str(stdout, value, vl);
    }
    printf("}, \"entries\": [");
    hry_writer *w;
    CHECK(hry_writer_new(info.alignment, info.flags & HRY_FILE_FLAG_DATA_CHECKSUMS, &w, &err) ==
          HRY_OK);
    for (uint32_t k = 0; k < hry_file_metadata_count(f); k++) {
        const char *key, *value;
        uint32_t kl, vl;
        hry_file_metadata(f, k, &key, &kl, &value, &vl);
        CHECK(hry_writer_add_metadata(w, key, kl, value, vl, &err) == HRY_OK);
    }
    for (uint32_t i = 0; i < hry_file_entry_count(f); i++) {
        const hry_entry *e = hry_file_entry(f, i);
        hry_descriptor d;
        hry_descriptor_init(&d);
        CHECK(hry_entry_descriptor(e, &d, &err) == HRY_OK);
        CHECK(hry_file_find(f, e->name, e->name_length) == e);
        printf("%s{\"name\": ", i ? ", " : "");
        json_str(stdout, e->name, e->name_length);
        printf(", \"dtype\": \"%s\", \"type_tag\": %u, \"shape\": ", hry_dtype(d.dtype)->name,
               d.dtype);
        u64s(stdout, d.shape, d.rank);
        printf(", \"layout\": \"%s\", \"descriptor_flags\": %u, \"descriptor\": \"",
               hry_layout_name(d.layout), hry_descriptor_flags(&d));
        hex(stdout, e->descriptor_bytes, e->descriptor_length);
        printf("\", \"buffers\": [");
        const void *bufs[HRY_MAX_BUFFERS];
        for (uint32_t j = 0; j < e->buffers.count; j++) {
            const hry_buffer_entry *b = &e->buffers.entry[j];
            bufs[j] = hry_file_buffer(f, e, j);
            CHECK((bufs[j] == NULL) == (b->length == 0));
            printf("%s[\"%s\", %llu, %llu, \"", j ? ", " : "", hry_role_name(b->role),
                   (unsigned long long)b->offset, (unsigned long long)b->length);
            if (b->length) {
                hex(stdout, bufs[j], (size_t)b->length);
                /* every non-empty buffer lies on a 64-byte (alignment) boundary in memory */
                CHECK(((uintptr_t)bufs[j] % info.alignment) == 0);
            }
            printf("\"]");
        }
        printf("], \"checksum\": ");
        if (e->has_checksum) {
            printf("%u", e->checksum);
        }
        else {
            printf("null");
        }
        /* the DLPack hand-out */
        DLManagedTensorVersioned *m = NULL;
        hry_status ds = hry_file_to_dlpack(f, i, &m, &err);
        printf(", \"dlpack\": ");
        if (ds != HRY_OK) {
            printf("{\"error\": %d, \"field\": \"%s\"}", (int)ds, err.field);
        }
        else {
            const DLTensor *t = &m->dl_tensor;
            printf("{\"ndim\": %d, \"code\": %u, \"bits\": %u, \"lanes\": %u, \"flags\": %llu, "
                   "\"device\": [%d, %d], \"byte_offset\": %llu, \"version\": [%u, %u], "
                   "\"data\": ", t->ndim, t->dtype.code, t->dtype.bits, t->dtype.lanes,
                   (unsigned long long)m->flags, (int)t->device.device_type, t->device.device_id,
                   (unsigned long long)t->byte_offset, m->version.major, m->version.minor);
            if (t->data == NULL) {
                printf("null");
            }
            else {
                printf("%lld", (long long)((const uint8_t *)t->data - info.base));
            }
            printf(", \"shape\": [");
            for (int k = 0; k < t->ndim; k++) {
                printf("%s%lld", k ? ", " : "", (long long)t->shape[k]);
            }
            printf("], \"strides\": [");
            for (int k = 0; k < t->ndim; k++) {
                printf("%s%lld", k ? ", " : "", (long long)t->strides[k]);
            }
            printf("]}");
            m->deleter(m);
        }
        printf("}");
        CHECK(hry_writer_add(w, e->name, e->name_length, &d, bufs, e->buffers.count, &err) ==
              HRY_OK);
    }
    printf("]}");
    /* the writer reproduces the file byte for byte */
    uint64_t size = hry_writer_file_size(w);
    uint8_t *again = malloc(size ? (size_t)size : 1);
    int same = size == len && hry_writer_serialize(w, again, (size_t)size, &err) == HRY_OK &&
               memcmp(again, raw, len) == 0;
    printf(", \"reserialized_identical\": %s", same ? "true" : "false");
    free(again);
    hry_writer_free(w);
    /* the same bytes from memory give the same index */
    hry_file *g;
    int mem_ok = hry_file_open_memory(raw, len, HRY_OPEN_VERIFY, &g, &err) == HRY_OK;
    if (mem_ok) {
        mem_ok = hry_file_entry_count(g) == hry_file_entry_count(f);
        hry_file_close(g);
    }
    printf(", \"memory_open_ok\": %s}\n", mem_ok ? "true" : "false");
    hry_file_close(f);
}

static int mode_files(const char *dir)
{
    size_t n;
    char **names = list_dir(dir, ".hurray", &n);
    if (n == 0) {
        fprintf(stderr, "no .hurray files in %s\n", dir);
        return 1;
    }
    for (size_t k = 0; k < n; k++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, names[k]);
        size_t len;
        uint8_t *raw = read_file(path, &len);
        names[k][strlen(names[k]) - 7] = '\0';
        if (raw != NULL) {
            report_file(names[k], raw, len, path);
        }
        free(raw);
        free(names[k]);
    }
    free(names);
    return failures != 0;
}

/* ------------------------------------------------------------------ decode / check-files */

static int mode_decode(int prefix)
{
    static char line[1 << 20];
    static uint8_t buf[1 << 19];
    while (fgets(line, sizeof line, stdin) != NULL) {
        size_t n;
        if (!unhex(line, buf, sizeof buf, &n)) {
            printf("bad-input\n");
            continue;
        }
        /* an exact-size copy, so that ASan sees any read past the input */
        uint8_t *exact = malloc(n ? n : 1);
        memcpy(exact, buf, n);
        hry_descriptor d;
        hry_descriptor_init(&d);
        hry_buffer_table t;
        hry_error err;
        size_t size = n;
        hry_status s = prefix ? hry_decode_prefix(exact, n, &d, &t, &size, NULL, &err)
                              : hry_decode(exact, n, &d, &t, &err);
        if (s != HRY_OK) {
            printf("err %s\n", err.field);
            free(exact);
            continue;
        }
        uint64_t offs[HRY_MAX_BUFFERS];
        for (uint32_t j = 0; j < t.count; j++) {
            offs[j] = t.entry[j].offset;
        }
        uint8_t out[HRY_MAX_DESCRIPTOR_SIZE];
        size_t w = 0;
        if (hry_encode(&d, offs, t.count, out, sizeof out, &w, &err) != HRY_OK) {
            printf("ok %zu encode-error %s\n", size, err.field);
        }
        else {
            printf("ok %zu ", size);
            hex(stdout, out, w);
            printf("\n");
        }
        free(exact);
    }
    return 0;
}

static int mode_check_files(void)
{
    char path[8192];
    while (fgets(path, sizeof path, stdin) != NULL) {
        path[strcspn(path, "\r\n")] = '\0';
        hry_error e1, e2;
        hry_file *f;
        hry_status s1 = hry_file_open(path, HRY_OPEN_VERIFY, &f, &e1);
        if (s1 == HRY_OK) {
            hry_file_close(f);
        }
        /* and from memory, in an exact-size allocation */
        size_t len;
        uint8_t *raw = read_file(path, &len);
        hry_status s2 = hry_file_open_memory(raw, len, HRY_OPEN_VERIFY, &f, &e2);
        if (s2 == HRY_OK) {
            /* touch every buffer through the hand-out */
            for (uint32_t i = 0; i < hry_file_entry_count(f); i++) {
                DLManagedTensorVersioned *m;
                if (hry_file_to_dlpack(f, i, &m, NULL) == HRY_OK) {
                    m->deleter(m);
                }
            }
            hry_file_close(f);
        }
        free(raw);
        if (s1 != s2 || (s1 != HRY_OK && strcmp(e1.field, e2.field) != 0)) {
            printf("mismatch %s %s\n", e1.field, e2.field);
        }
        else if (s1 == HRY_OK) {
            printf("ok\n");
        }
        else {
            printf("err %s\n", e1.field);
        }
    }
    return 0;
}

/* ------------------------------------------------------------------ make-files */

static void pattern(uint8_t *p, uint64_t n, unsigned seed)
{
    for (uint64_t i = 0; i < n; i++) {
        p[i] = (uint8_t)((i * 37 + seed * 11 + 5) & 0xFF);
    }
}

typedef struct made {
    const char *name;
    hry_descriptor d;
} made;

static hry_descriptor dense(uint8_t dtype, uint32_t rank, const uint64_t *shape)
{
    hry_descriptor d;
    hry_descriptor_init(&d);
    d.dtype = dtype;
    d.layout = HRY_ROW_MAJOR;
    d.rank = rank;
    if (rank) {
        memcpy(d.shape, shape, rank * sizeof *shape);
    }
    return d;
}

static void manifest_entry(FILE *o, const char *name, const hry_descriptor *d, unsigned seed,
                           int first)
{
    fprintf(o, "%s{\"name\": ", first ? "" : ", ");
    json_str(o, name, strlen(name));
    fprintf(o, ", \"seed\": %u, \"dtype\": \"%s\", \"shape\": ", seed, hry_dtype(d->dtype)->name);
    u64s(o, d->shape, d->rank);
    fprintf(o, ", \"layout\": \"%s\", \"padded\": %s", hry_layout_name(d->layout),
            d->padded ? "true" : "false");
    if (d->layout == HRY_STRIDED) {
        fprintf(o, ", \"strides\": [");
        for (uint32_t i = 0; i < d->rank; i++) {
            fprintf(o, "%s%lld", i ? ", " : "", (long long)d->strides[i]);
        }
        fprintf(o, "]");
    }
    if (d->layout == HRY_TILED) {
        fprintf(o, ", \"tile\": ");
        u64s(o, d->tile, d->n_tile);
    }
    if (d->layout >= HRY_COO) {
        fprintf(o, ", \"sparse\": [%llu, \"%s\", %s]", (unsigned long long)d->sparse.nnz,
                hry_dtype(d->sparse.index_type)->name, d->sparse.canonical ? "true" : "false");
    }
    if (d->has_quantization) {
        fprintf(o, ", \"quantization\": [%u, \"%s\", %s%s%s, %ld, %llu]", d->quant.scheme,
                hry_dtype(d->quant.scale_type)->name, d->quant.zero_point_type ? "\"" : "",
                d->quant.zero_point_type ? hry_dtype(d->quant.zero_point_type)->name : "null",
                d->quant.zero_point_type ? "\"" : "", (long)d->quant.axis,
                (unsigned long long)d->quant.block_size);
    }
    if (d->has_shard) {
        fprintf(o, ", \"shard\": [");
        u64s(o, d->shard.global_shape, d->rank);
        fprintf(o, ", ");
        u64s(o, d->shard.offsets, d->rank);
        fprintf(o, ", %u, %ld, %ld]", d->shard.replica_id, (long)d->shard.device_type,
                (long)d->shard.device_id);
    }
    fprintf(o, "}");
}

/* Every element type (packed and padded), every layout, quantization, shards, empty
 * tensors, scalars and rank 64, built with the C API alone. */
static size_t build_set(made *out)
{
    size_t n = 0;
    static char names[64][40];
    uint64_t s23[] = {2, 3};
    for (unsigned tag = 1; tag <= HRY_LAST_DTYPE; tag++) {
        snprintf(names[tag], sizeof names[tag], "%s", hry_dtype(tag)->name);
        out[n++] = (made){names[tag], dense((uint8_t)tag, 2, s23)};
    }
    static const uint8_t sub[] = {HRY_INT4, HRY_UINT4, HRY_INT2, HRY_UINT2, HRY_FLOAT4_E2M1FN};
    for (unsigned k = 0; k < sizeof sub; k++) {
        snprintf(names[30 + k], sizeof names[30 + k], "%s.padded", hry_dtype(sub[k])->name);
        out[n] = (made){names[30 + k], dense(sub[k], 2, s23)};
        out[n++].d.padded = 1;
    }
    hry_descriptor d;
    hry_descriptor_init(&d);
    /* strided: negative, column-major, zero stride, padded sub-byte */
    d = dense(HRY_INT16, 2, s23);
    d.layout = HRY_STRIDED;
    d.strides[0] = -3;
    d.strides[1] = 1;
    out[n++] = (made){"strided/negative", d};
    uint64_t s34[] = {3, 4};
    d = dense(HRY_FLOAT32, 2, s34);
    d.layout = HRY_STRIDED;
    d.strides[0] = 1;
    d.strides[1] = 3;
    out[n++] = (made){"strided/column_major", d};
    d = dense(HRY_FLOAT64, 2, s34);
    d.layout = HRY_STRIDED;
    d.strides[0] = 0;
    d.strides[1] = -1;
    out[n++] = (made){"strided/broadcast", d};
    d = dense(HRY_INT4, 2, s23);
    d.layout = HRY_STRIDED;
    d.padded = 1;
    d.strides[0] = 1;
    d.strides[1] = 2;
    out[n++] = (made){"strided/int4_padded", d};
    /* tiled */
    uint64_t s57[] = {5, 7};
    d = dense(HRY_FLOAT32, 2, s57);
    d.layout = HRY_TILED;
    d.n_tile = 2;
    d.tile[0] = 2;
    d.tile[1] = 4;
    out[n++] = (made){"tiled/5x7_by_2x4", d};
    /* sparse */
    uint64_t s45[] = {4, 5}, s36[] = {3, 6};
    d = dense(HRY_FLOAT32, 2, s45);
    d.layout = HRY_COO;
    d.sparse.nnz = 3;
    d.sparse.index_type = HRY_INT64;
    d.sparse.canonical = 1;
    out[n++] = (made){"sparse/coo", d};
    d = dense(HRY_FLOAT16, 2, s45);
    d.layout = HRY_CSR;
    d.sparse.nnz = 2;
    d.sparse.index_type = HRY_INT32;
    out[n++] = (made){"sparse/csr", d};
    d = dense(HRY_INT8, 2, s36);
    d.layout = HRY_CSC;
    d.sparse.nnz = 4;
    d.sparse.index_type = HRY_UINT16;
    out[n++] = (made){"sparse/csc", d};
    /* quantization */
    uint64_t s4[] = {4}, s464[] = {4, 64};
    d = dense(HRY_INT8, 1, s4);
    d.has_quantization = 1;
    d.quant = (struct hry_quantization){HRY_PER_TENSOR, HRY_FLOAT32, 0, -1, 0};
    out[n++] = (made){"quant/per_tensor", d};
    d = dense(HRY_UINT8, 2, s34);
    d.has_quantization = 1;
    d.quant = (struct hry_quantization){HRY_PER_AXIS, HRY_FLOAT16, HRY_UINT8, 1, 0};
    out[n++] = (made){"quant/per_axis_zp", d};
    d = dense(HRY_INT4, 2, s464);
    d.has_quantization = 1;
    d.quant = (struct hry_quantization){HRY_PER_BLOCK, HRY_FLOAT8_E8M0FNU, 0, 1, 32};
    out[n++] = (made){"quant/per_block_mx", d};
    d = dense(HRY_FLOAT8_E4M3FN, 2, s34);
    d.has_quantization = 1;
    d.quant = (struct hry_quantization){HRY_PER_BLOCK, HRY_BFLOAT16, HRY_FLOAT32, 0, 2};
    out[n++] = (made){"quant/per_block_fp8", d};
    /* shard */
    d = dense(HRY_FLOAT16, 2, s23);
    d.has_shard = 1;
    d.shard.replica_id = 1;
    d.shard.device_type = 2;
    d.shard.device_id = 0;
    d.shard.offsets[0] = 2;
    d.shard.global_shape[0] = 4;
    d.shard.global_shape[1] = 3;
    out[n++] = (made){"shard/box", d};
    /* empty tensors */
    uint64_t s0[] = {0}, s305[] = {3, 0, 5}, s20[] = {2, 0}, s05[] = {0, 5}, s016[] = {0, 16};
    out[n++] = (made){"empty/shape_0", dense(HRY_FLOAT32, 1, s0)};
    out[n++] = (made){"empty/shape_3_0_5", dense(HRY_FLOAT32, 3, s305)};
    out[n++] = (made){"empty/int4", dense(HRY_INT4, 2, s20)};
    out[n++] = (made){"empty/bool", dense(HRY_BOOL, 2, s05)};
    d = dense(HRY_FLOAT32, 2, s05);
    d.layout = HRY_CSR;
    d.sparse.index_type = HRY_INT64;
    d.sparse.canonical = 1;
    out[n++] = (made){"empty/csr_0x5", d};
    d = dense(HRY_FLOAT32, 2, s45);
    d.layout = HRY_CSR;
    d.sparse.index_type = HRY_INT32;
    d.sparse.canonical = 1;
    out[n++] = (made){"empty/csr_nnz_0", d};
    d = dense(HRY_INT8, 2, s016);
    d.has_quantization = 1;
    d.quant = (struct hry_quantization){HRY_PER_AXIS, HRY_FLOAT32, HRY_INT8, 0, 0};
    out[n++] = (made){"empty/per_axis_axis_size_0", d};
    d = dense(HRY_FLOAT32, 2, s05);
    d.layout = HRY_STRIDED;
    d.strides[0] = -7;
    d.strides[1] = 3;
    out[n++] = (made){"empty/strided", d};
    /* scalars */
    out[n++] = (made){"scalar/float64", dense(HRY_FLOAT64, 0, NULL)};
    out[n++] = (made){"scalar/bool8", dense(HRY_BOOL8, 0, NULL)};
    out[n++] = (made){"scalar/int4", dense(HRY_INT4, 0, NULL)};
    /* rank 64 */
    uint64_t r64[64];
    for (int i = 0; i < 64; i++) {
        r64[i] = 1;
    }
    r64[63] = 2;
    out[n++] = (made){"rank64/int8", dense(HRY_INT8, 64, r64)};
    r64[0] = 0;
    out[n++] = (made){"rank64/empty", dense(HRY_FLOAT32, 64, r64)};
    r64[0] = 1;
    d = dense(HRY_COMPLEX64, 64, r64);
    d.layout = HRY_STRIDED;
    for (int i = 0; i < 64; i++) {
        d.strides[i] = i % 2 ? -1 : 1;
    }
    out[n++] = (made){"rank64/strided", d};
    out[n++] = (made){"名前 ünïcode/../x", dense(HRY_UINT32, 1, s4)};
    return n;
}

static int mode_make_files(const char *dir)
{
    static made set[128];
    size_t n = build_set(set);
    static const struct {
        const char *file;
        uint32_t alignment;
        int checksums;
    } variants[] = {{"c_made.hurray", 64, 1}, {"c_made_4096_nocrc.hurray", 4096, 0}};
    printf("{\"files\": [");
    for (size_t v = 0; v < 2; v++) {
        hry_writer *w;
        hry_error err;
        if (hry_writer_new(variants[v].alignment, variants[v].checksums, &w, &err) != HRY_OK) {
            fprintf(stderr, "writer: %s\n", err.message);
            return 1;
        }
        hry_writer_add_metadata(w, "made_by", 7, "hurray C library", 16, &err);
        hry_writer_add_metadata(w, "empty", 5, "", 0, &err);
        hry_writer_add_metadata(w, "grüße", strlen("grüße"), "✓", strlen("✓"), &err);
        uint8_t *owned[128][HRY_MAX_BUFFERS] = {{0}};
        printf("%s{\"file\": \"%s\", \"alignment\": %u, \"checksums\": %s, "
               "\"metadata\": {\"made_by\": \"hurray C library\", \"empty\": \"\", "
               "\"grüße\": \"✓\"}, \"entries\": [", v ? ", " : "", variants[v].file,
               variants[v].alignment, variants[v].checksums ? "true" : "false");
        for (size_t i = 0; i < n; i++) {
            hry_buffer_spec specs[HRY_MAX_BUFFERS];
            uint32_t ns;
            if (hry_descriptor_buffer_layout(&set[i].d, specs, &ns, &err) != HRY_OK) {
                fprintf(stderr, "%s: %s: %s\n", set[i].name, err.field, err.message);
                return 1;
            }
            const void *bufs[HRY_MAX_BUFFERS];
            for (uint32_t j = 0; j < ns; j++) {
                owned[i][j] = specs[j].length ? malloc((size_t)specs[j].length) : NULL;
                pattern(owned[i][j], specs[j].length, (unsigned)(i * 8 + j));
                if (set[i].d.dtype == HRY_BOOL8 && j == 0) { /* only 0 and 1 are bool8 bytes */
                    for (uint64_t k = 0; k < specs[j].length; k++) {
                        owned[i][j][k] &= 1;
                    }
                }
                bufs[j] = owned[i][j];
            }
            if (hry_writer_add(w, set[i].name, strlen(set[i].name), &set[i].d, bufs, ns, &err) !=
                HRY_OK) {
                fprintf(stderr, "%s: %s: %s\n", set[i].name, err.field, err.message);
                return 1;
            }
            manifest_entry(stdout, set[i].name, &set[i].d, (unsigned)(i * 8), i == 0);
        }
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, variants[v].file);
        if (hry_writer_save(w, path, HRY_SAVE_NO_FSYNC, &err) != HRY_OK) {
            fprintf(stderr, "save: %s\n", err.message);
            return 1;
        }
        printf("]}");
        hry_writer_free(w);
        for (size_t i = 0; i < n; i++) {
            for (int j = 0; j < HRY_MAX_BUFFERS; j++) {
                free(owned[i][j]);
            }
        }
    }
    printf("]}\n");
    return 0;
}

/* ------------------------------------------------------------------ bench */

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int mode_bench(const char *hexstr)
{
    static uint8_t buf[1 << 16];
    size_t n;
    hry_descriptor d;
    hry_descriptor_init(&d);
    hry_buffer_table t;
    hry_error err;
    if (!unhex(hexstr, buf, sizeof buf, &n) || hry_decode(buf, n, &d, &t, &err) != HRY_OK) {
        fprintf(stderr, "bench: not a valid descriptor\n");
        return 1;
    }
    volatile uint32_t sink = 0;
    long loops = 1;
    for (;;) { /* a batch of at least 20 ms */
        double t0 = now_ns();
        for (long i = 0; i < loops; i++) {
            hry_decode(buf, n, &d, &t, NULL);
            sink += d.rank;
        }
        if (now_ns() - t0 >= 2e7 || loops >= (1L << 26)) {
            break;
        }
        loops *= 2;
    }
    double samples[15];
    for (int r = 0; r < 15; r++) {
        double t0 = now_ns();
        for (long i = 0; i < loops; i++) {
            hry_decode(buf, n, &d, &t, NULL);
            sink += d.rank;
        }
        samples[r] = (now_ns() - t0) / (double)loops;
    }
    qsort(samples, 15, sizeof samples[0], cmp_double);
    printf("{\"median_ns\": %.2f, \"iqr_ns\": %.2f, \"loops\": %ld}\n", samples[7],
           samples[11] - samples[3], loops);
    (void)sink;
    return 0;
}

/* ------------------------------------------------------------------ unit */

static void unit_checksums(void)
{
    /* CRC-32 check value and the container.md §11 example; SHA-256 FIPS vectors */
    CHECK(hry_crc32(0, "123456789", 9) == 0xCBF43926u);
    CHECK(hry_crc32(0, "", 0) == 0);
    uint32_t c = hry_crc32(0, "1234", 4);
    CHECK(hry_crc32(c, "56789", 5) == 0xCBF43926u);
    static const uint8_t f123[12] = {0, 0, 0x80, 0x3f, 0, 0, 0, 0x40, 0, 0, 0x40, 0x40};
    CHECK(hry_crc32(0, f123, 12) == 0xb20e96b1u);
    static uint8_t big[100000];
    for (size_t i = 0; i < sizeof big; i++) {
        big[i] = (uint8_t)(i * 7 + 3);
    }
    uint32_t whole = hry_crc32(0, big, sizeof big), parts = 0;
    for (size_t i = 0; i < sizeof big; i += 333) {
        parts = hry_crc32(parts, big + i, sizeof big - i < 333 ? sizeof big - i : 333);
    }
    CHECK(whole == parts);
    struct {
        const char *in;
        const char *hex;
    } v[] = {
        {"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
        {"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
        {"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
         "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
    };
    for (size_t k = 0; k < 3; k++) {
        hry_sha256 s;
        uint8_t dig[32];
        char got[65];
        hry_sha256_init(&s);
        for (const char *p = v[k].in; *p; p++) {
            hry_sha256_update(&s, p, 1); /* byte by byte: the buffering path */
        }
        hry_sha256_final(&s, dig);
        for (int i = 0; i < 32; i++) {
            snprintf(got + 2 * i, 3, "%02x", dig[i]);
        }
        CHECK(strcmp(got, v[k].hex) == 0);
    }
    /* a million 'a' */
    hry_sha256 s;
    uint8_t dig[32], a[1000];
    memset(a, 'a', sizeof a);
    hry_sha256_init(&s);
    for (int i = 0; i < 1000; i++) {
        hry_sha256_update(&s, a, sizeof a);
    }
    hry_sha256_final(&s, dig);
    CHECK(dig[0] == 0xcd && dig[1] == 0xc7 && dig[31] == 0xd0);
}

static void unit_descriptors(void)
{
    hry_error err;
    hry_descriptor d;
    hry_descriptor_init(&d);
    uint8_t out[HRY_MAX_DESCRIPTOR_SIZE];
    size_t w;
    /* metadata.md §11: float32 [3, 0, 5] is 80 bytes */
    uint64_t s305[] = {3, 0, 5};
    d = dense(HRY_FLOAT32, 3, s305);
    CHECK(hry_encode(&d, NULL, 0, out, sizeof out, &w, &err) == HRY_OK && w == 80);
    CHECK(memcmp(out, "HRYD\x01\x00\x00\x00\x03\x00\x00\x00\x0d\x01\x01\x00\x50", 17) == 0);
    /* an output too small is an argument error, never an overflow */
    CHECK(hry_encode(&d, NULL, 0, out, 79, &w, &err) == HRY_E_ARGUMENT);
    /* rank 65 is refused on write as on read */
    d.rank = 65;
    CHECK_FIELD(hry_descriptor_check(&d, &err), err, HRY_E_FORMAT, "rank");
    CHECK(hry_encoded_size(&d) == 0);
    /* DYNAMIC is not 0 */
    uint64_t dyn[] = {HRY_DYNAMIC, 128};
    d = dense(HRY_BFLOAT16, 2, dyn);
    uint64_t count;
    CHECK(hry_descriptor_check(&d, &err) == HRY_OK);
    CHECK(hry_descriptor_element_count(&d, &count, &err) == HRY_E_DYNAMIC);
    CHECK(hry_encode(&d, NULL, 0, out, sizeof out, &w, &err) == HRY_OK && w == 48);
    /* overflow: 2^32 x 2^32 elements */
    uint64_t huge[] = {1ull << 32, 1ull << 32};
    d = dense(HRY_INT8, 2, huge);
    CHECK_FIELD(hry_descriptor_check(&d, &err), err, HRY_E_FORMAT, "shape");
    /* ... but an empty shape never overflows */
    uint64_t huge0[] = {1ull << 63, 1ull << 63, 0};
    d = dense(HRY_COMPLEX128, 3, huge0);
    CHECK(hry_descriptor_check(&d, &err) == HRY_OK);
    /* 2^63 int8 elements fit, 2^63 int16 do not */
    uint64_t big1[] = {1ull << 63};
    d = dense(HRY_INT8, 1, big1);
    CHECK(hry_descriptor_check(&d, &err) == HRY_OK);
    d.dtype = HRY_INT16;
    CHECK_FIELD(hry_descriptor_check(&d, &err), err, HRY_E_FORMAT, "shape");
    /* packed sub-byte: 2^64 - 1 int4 elements take ceil(... / 2) bytes */
    uint64_t maxd[] = {UINT64_MAX - 1};
    d = dense(HRY_INT4, 1, maxd);
    uint64_t nb;
    CHECK(hry_descriptor_nbytes(&d, &nb, &err) == HRY_OK && nb == (UINT64_MAX - 1) / 2);
    /* strided packed sub-byte is refused, padded accepted */
    uint64_t s23[] = {2, 3};
    d = dense(HRY_INT4, 2, s23);
    d.layout = HRY_STRIDED;
    d.strides[0] = 3;
    d.strides[1] = 1;
    CHECK_FIELD(hry_descriptor_check(&d, &err), err, HRY_E_FORMAT, "strides");
    d.padded = 1;
    CHECK(hry_descriptor_check(&d, &err) == HRY_OK);
    /* INT64_MIN stride */
    d.strides[0] = INT64_MIN;
    CHECK_FIELD(hry_descriptor_check(&d, &err), err, HRY_E_FORMAT, "strides");
    /* span over int64 */
    uint64_t s2big[] = {3, 2};
    d = dense(HRY_INT8, 2, s2big);
    d.layout = HRY_STRIDED;
    d.strides[0] = INT64_MAX / 2 + 1;
    d.strides[1] = 1;
    CHECK_FIELD(hry_descriptor_check(&d, &err), err, HRY_E_FORMAT, "strides");
    /* padded on a full-byte type */
    d = dense(HRY_INT8, 2, s23);
    d.padded = 1;
    CHECK_FIELD(hry_descriptor_check(&d, &err), err, HRY_E_FORMAT, "flags");
    /* strided scalar */
    d = dense(HRY_INT8, 0, NULL);
    d.layout = HRY_STRIDED;
    CHECK_FIELD(hry_descriptor_check(&d, &err), err, HRY_E_FORMAT, "layout");
    /* explicit offsets: misaligned, overlapping and wrong count are refused */
    uint64_t s1000[] = {1000};
    d = dense(HRY_INT8, 1, s1000);
    d.has_quantization = 1;
    d.quant = (struct hry_quantization){HRY_PER_TENSOR, HRY_FLOAT32, HRY_INT8, -1, 0};
    uint64_t offs[3] = {0, 1024, 2048};
    CHECK(hry_encode(&d, offs, 3, out, sizeof out, &w, &err) == HRY_OK);
    offs[1] = 1000;
    CHECK_FIELD(hry_encode(&d, offs, 3, out, sizeof out, &w, &err), err, HRY_E_FORMAT,
                "buffers.offset");
    offs[1] = 960; /* aligned, but inside the DATA buffer [0, 1000) */
    CHECK_FIELD(hry_encode(&d, offs, 3, out, sizeof out, &w, &err), err, HRY_E_FORMAT,
                "buffers.offset");
    CHECK_FIELD(hry_encode(&d, offs, 2, out, sizeof out, &w, &err), err, HRY_E_FORMAT,
                "buffers");
    /* the canonical placement */
    uint64_t lens[] = {1000, 0, 4, 1}, got[4];
    hry_canonical_offsets(lens, 4, got);
    CHECK(got[0] == 0 && got[1] == 0 && got[2] == 1024 && got[3] == 1088);
    /* decoding: every truncation of a large descriptor is an error naming a field */
    uint64_t r64[64];
    for (int i = 0; i < 64; i++) {
        r64[i] = (uint64_t)i + 1;
    }
    d = dense(HRY_INT4, 64, r64);
    for (int i = 0; i < 64; i++) {
        d.shape[i] = 1;
    }
    d.shape[63] = 64;
    d.layout = HRY_TILED;
    d.n_tile = 64;
    for (int i = 0; i < 64; i++) {
        d.tile[i] = 1; /* with 2, 63 dimensions of 1 would pad to 2^63 elements: an overflow */
    }
    d.tile[63] = 32;
    d.has_quantization = 1;
    d.quant = (struct hry_quantization){HRY_PER_BLOCK, HRY_FLOAT16, HRY_UINT8, 63, 16};
    d.has_shard = 1;
    d.shard.device_type = 1;
    memcpy(d.shard.global_shape, d.shape, sizeof d.shape);
    CHECK(hry_encode(&d, NULL, 0, out, sizeof out, &w, &err) == HRY_OK);
    if (err.status != HRY_OK) {
        fprintf(stderr, "largest descriptor: %s: %s\n", err.field, err.message);
    }
    CHECK(w == HRY_MAX_DESCRIPTOR_SIZE);
    hry_descriptor back;
    hry_descriptor_init(&back);
    hry_buffer_table t;
    CHECK(hry_decode(out, w, &back, &t, &err) == HRY_OK && hry_descriptor_equal(&d, &back));
    CHECK(t.count == 3);
    for (size_t cut = 0; cut < w; cut++) {
        uint8_t *exact = malloc(cut ? cut : 1);
        memcpy(exact, out, cut);
        hry_status s = hry_decode(exact, cut, &back, &t, &err);
        CHECK(s == HRY_E_FORMAT && err.field[0] != '\0');
        free(exact);
    }
    /* trailing bytes: strict refuses, prefix accepts */
    uint8_t longer[HRY_MAX_DESCRIPTOR_SIZE + 8] = {0};
    memcpy(longer, out, w);
    CHECK_FIELD(hry_decode(longer, w + 8, &back, &t, &err), err, HRY_E_FORMAT, "total_size");
    size_t used;
    CHECK(hry_decode_prefix(longer, w + 8, &back, &t, &used, NULL, &err) == HRY_OK && used == w);
    /* a claimed rank of 2^32 - 1 with no bytes behind it */
    uint8_t hdr[32] = {'H', 'R', 'Y', 'D', 1, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF, 13, 1, 1, 0, 32};
    CHECK_FIELD(hry_decode(hdr, 32, &back, &t, &err), err, HRY_E_FORMAT, "rank");
    /* any minor version is read */
    CHECK(hry_encode(&d, NULL, 0, out, sizeof out, &w, &err) == HRY_OK);
    out[5] = 7;
    uint8_t minor = 0;
    CHECK(hry_decode_prefix(out, w, &back, &t, &used, &minor, &err) == HRY_OK && minor == 7);
    /* names */
    CHECK(hry_dtype_by_name("bfloat16")->tag == HRY_BFLOAT16);
    CHECK(hry_dtype_by_name("nope") == NULL && hry_dtype(0) == NULL && hry_dtype(27) == NULL);
    CHECK(strcmp(hry_layout_name(HRY_CSC), "CSC") == 0 && hry_role_name(7) == NULL);
    CHECK(hry_library_version() == 0x020000u && HRY_LIB_VERSION == 0x020000u);
    CHECK(hry_version_check());
}

static void unit_files(const char *dir)
{
    hry_error err;
    hry_writer *w;
    char path[4096];
    snprintf(path, sizeof path, "%s/unit.hurray", dir);
    /* writer refusals */
    CHECK_FIELD(hry_writer_new(100, 1, &w, &err), err, HRY_E_FORMAT, "alignment");
    CHECK(hry_writer_new(0, 1, &w, &err) == HRY_OK);
    uint64_t s3[] = {3};
    hry_descriptor d = dense(HRY_FLOAT32, 1, s3);
    static const float xs[3] = {1, 2, 3};
    const void *bufs[1] = {xs};
    CHECK_FIELD(hry_writer_add(w, "", 0, &d, bufs, 1, &err), err, HRY_E_FORMAT, "name");
    CHECK_FIELD(hry_writer_add(w, "a\0b", 3, &d, bufs, 1, &err), err, HRY_E_FORMAT, "name");
    CHECK_FIELD(hry_writer_add(w, "\xff", 1, &d, bufs, 1, &err), err, HRY_E_FORMAT, "name");
    CHECK_FIELD(hry_writer_add(w, "x", 1, &d, bufs, 0, &err), err, HRY_E_FORMAT, "buffers");
    CHECK(hry_writer_add(w, "x", 1, &d, bufs, 1, &err) == HRY_OK);
    CHECK_FIELD(hry_writer_add(w, "x", 1, &d, bufs, 1, &err), err, HRY_E_FORMAT, "name");
    uint64_t dyn[] = {HRY_DYNAMIC};
    hry_descriptor dd = dense(HRY_FLOAT32, 1, dyn);
    CHECK(hry_writer_add(w, "dyn", 3, &dd, NULL, 0, &err) == HRY_E_DYNAMIC);
    /* bool8 bytes other than 0 and 1 are refused, 0 and 1 written */
    hry_descriptor db = dense(HRY_BOOL8, 1, s3);
    static const uint8_t bad_bools[3] = {1, 0, 2}, bools[3] = {1, 0, 1};
    const void *bb[1] = {bad_bools}, *gb[1] = {bools};
    CHECK_FIELD(hry_writer_add(w, "b", 1, &db, bb, 1, &err), err, HRY_E_FORMAT, "data");
    CHECK(strstr(err.message, "element 2 holds the byte 0x02") != NULL);
    hry_writer *wb;
    CHECK(hry_writer_new(0, 1, &wb, &err) == HRY_OK);
    CHECK(hry_writer_add(wb, "b", 1, &db, gb, 1, &err) == HRY_OK);
    hry_writer_free(wb);
    /* the empty tensor: a NULL buffer, no bytes */
    uint64_t s0[] = {0};
    hry_descriptor de = dense(HRY_FLOAT32, 1, s0);
    const void *none[1] = {NULL};
    CHECK(hry_writer_add(w, "empty", 5, &de, none, 1, &err) == HRY_OK);
    CHECK(hry_writer_add_metadata(w, "k", 1, "v", 1, &err) == HRY_OK);
    CHECK_FIELD(hry_writer_add_metadata(w, "k", 1, "w", 1, &err), err, HRY_E_FORMAT, "name");
    CHECK(hry_writer_file_size(w) == 4096 + 12);
    CHECK(hry_writer_save(w, path, 0, &err) == HRY_OK);
    /* a failed save leaves nothing behind and the old file intact */
    char bad[4096];
    snprintf(bad, sizeof bad, "%s/no/such/dir/x.hurray", dir);
    CHECK(hry_writer_save(w, bad, 0, &err) == HRY_E_IO && err.os_errno == ENOENT);
    hry_writer_free(w);

    /* the DLPack tensor keeps the mapping alive after the file is closed */
    hry_file *f;
    CHECK(hry_file_open(path, HRY_OPEN_VERIFY, &f, &err) == HRY_OK);
    if (f == NULL) {
        return;
    }
    DLManagedTensorVersioned *m, *me;
    CHECK(hry_file_to_dlpack(f, 0, &m, &err) == HRY_OK);
    CHECK(hry_file_to_dlpack(f, 2, &me, &err) == HRY_E_ARGUMENT);
    CHECK(hry_file_to_dlpack(f, 1, &me, &err) == HRY_OK);
    const hry_entry *e = hry_file_find(f, "x", 1);
    CHECK(e != NULL && e->position == 0 && hry_file_find(f, "y", 1) == NULL);
    hry_file_close(f);
    CHECK(m->flags & DLPACK_FLAG_BITMASK_READ_ONLY);
    CHECK(m->dl_tensor.ndim == 1 && m->dl_tensor.shape[0] == 3 && m->dl_tensor.strides[0] == 1);
    CHECK(m->dl_tensor.dtype.code == kDLFloat && m->dl_tensor.dtype.bits == 32);
    CHECK(((uintptr_t)m->dl_tensor.data % 64) == 0);
    const float *p = m->dl_tensor.data;
    CHECK(p[0] == 1.0f && p[1] == 2.0f && p[2] == 3.0f); /* read after the close */
    CHECK(me->dl_tensor.data == NULL && me->dl_tensor.shape[0] == 0);
    m->deleter(m);
    me->deleter(me);

    /* the written file is exactly the golden container.md §11 example plus the others */
    CHECK(hry_file_open(path, 0, &f, &err) == HRY_OK);
    hry_file_info info;
    hry_file_info_init(&info);
    hry_file_get_info(f, &info, NULL);
    CHECK(info.n_entries == 2 && info.n_metadata == 1 && info.data_offset == 4096);
    const char *key, *value;
    uint32_t kl, vl;
    CHECK(hry_file_metadata(f, 0, &key, &kl, &value, &vl) == HRY_OK && strcmp(key, "k") == 0 &&
          strcmp(value, "v") == 0);
    CHECK(hry_file_metadata(f, 1, &key, &kl, &value, &vl) == HRY_E_ARGUMENT);
    hry_file_close(f);

    /* a changed data byte: open succeeds (data is not read), verify names the checksum */
    size_t len;
    uint8_t *raw = read_file(path, &len);
    raw[4096] ^= 1;
    CHECK(hry_file_open_memory(raw, len, 0, &f, &err) == HRY_OK);
    CHECK_FIELD(hry_file_verify(f, &err), err, HRY_E_FORMAT, "entries[0].checksum");
    hry_file_close(f);
    raw[4096] ^= 1;
    /* every truncation is an error */
    for (size_t cut = 0; cut < len; cut += (cut < 300 ? 1 : 97)) {
        uint8_t *exact = malloc(cut ? cut : 1);
        memcpy(exact, raw, cut);
        hry_status s = hry_file_open_memory(exact, cut, HRY_OPEN_VERIFY, &f, &err);
        CHECK(s == HRY_E_FORMAT && (strcmp(err.field, "header") == 0 ||
                                    strcmp(err.field, "file_size") == 0));
        free(exact);
    }
    free(raw);
    /* no bytes at all, NULL included (UBSan: no memcpy from NULL) */
    CHECK_FIELD(hry_file_open_memory(NULL, 0, 0, &f, &err), err, HRY_E_FORMAT, "header");
    CHECK_FIELD(hry_decode(NULL, 0, &d, NULL, &err), err, HRY_E_FORMAT, "header");
    /* not a file */
    CHECK(hry_file_open(dir, 0, &f, &err) == HRY_E_IO);
    snprintf(bad, sizeof bad, "%s/missing.hurray", dir);
    CHECK(hry_file_open(bad, 0, &f, &err) == HRY_E_IO && err.os_errno == ENOENT);
}

/* The writer refuses a shard set that verify refuses (one box twice as one replica id, a
 * name that is a sharded tensor's and an entry's) before it writes a byte. */
static void unit_shard_sets(const char *dir)
{
    hry_error err;
    hry_writer *w;
    char path[4096];
    snprintf(path, sizeof path, "%s/shards.hurray", dir);
    unlink(path); /* left by an earlier run in this folder */
    uint64_t s3[] = {3};
    static const float xs[3] = {1, 2, 3};
    const void *bufs[1] = {xs};
    hry_descriptor d = dense(HRY_FLOAT32, 1, s3);
    d.has_shard = 1;
    d.shard.global_shape[0] = 6;
    d.shard.device_type = 1;
    CHECK(hry_writer_new(0, 1, &w, &err) == HRY_OK);
    CHECK(hry_writer_add(w, "w[0]", 4, &d, bufs, 1, &err) == HRY_OK);
    CHECK(hry_writer_add(w, "w[1]", 4, &d, bufs, 1, &err) == HRY_OK);
    CHECK_FIELD(hry_writer_save(w, path, HRY_SAVE_NO_FSYNC, &err), err, HRY_E_FORMAT, "shards");
    CHECK(strstr(err.message, "replica 0") != NULL);
    CHECK(access(path, F_OK) != 0);
    static uint8_t out[8192];
    CHECK_FIELD(hry_writer_serialize(w, out, sizeof out, &err), err, HRY_E_FORMAT, "shards");
    hry_writer_free(w);
    /* another replica id, or the other half, is a valid (partial or complete) set */
    for (int k = 0; k < 2; k++) {
        CHECK(hry_writer_new(0, 1, &w, &err) == HRY_OK);
        CHECK(hry_writer_add(w, "w[0]", 4, &d, bufs, 1, &err) == HRY_OK);
        hry_descriptor d2 = d;
        if (k == 0) {
            d2.shard.replica_id = 1;
        } else {
            d2.shard.offsets[0] = 3;
        }
        CHECK(hry_writer_add(w, "w[1]", 4, &d2, bufs, 1, &err) == HRY_OK);
        CHECK(hry_writer_save(w, path, HRY_SAVE_NO_FSYNC, &err) == HRY_OK);
        CHECK(hry_verify_path(path, &err) == HRY_OK);
        hry_writer_free(w);
    }
    /* a plain entry under the sharded tensor's name */
    hry_descriptor plain = dense(HRY_FLOAT32, 1, s3);
    CHECK(hry_writer_new(0, 1, &w, &err) == HRY_OK);
    CHECK(hry_writer_add(w, "w", 1, &plain, bufs, 1, &err) == HRY_OK);
    CHECK(hry_writer_add(w, "w[0]", 4, &d, bufs, 1, &err) == HRY_OK);
    CHECK_FIELD(hry_writer_serialize(w, out, sizeof out, &err), err, HRY_E_FORMAT, "name");
    hry_writer_free(w);
}

/* Padded sub-byte data is written with its high bits zero (element-types.md section 4.3),
 * from a masked copy: the source keeps its bytes. */
static void unit_padded(void)
{
    hry_error err;
    hry_writer *w;
    uint64_t s3[] = {3};
    hry_descriptor d = dense(HRY_INT4, 1, s3);
    d.padded = 1;
    static uint8_t dirty[3] = {0xff, 0xf1, 0x80};
    const void *bufs[1] = {dirty};
    static uint8_t out[8192];
    CHECK(hry_writer_new(0, 0, &w, &err) == HRY_OK);
    CHECK(hry_writer_add(w, "q", 1, &d, bufs, 1, &err) == HRY_OK);
    uint64_t size = hry_writer_file_size(w);
    CHECK(size == 4096 + 3 && hry_writer_serialize(w, out, sizeof out, &err) == HRY_OK);
    CHECK(out[4096] == 0x0f && out[4097] == 0x01 && out[4098] == 0x00);
    CHECK(dirty[0] == 0xff && dirty[1] == 0xf1 && dirty[2] == 0x80);
    hry_file *f;
    CHECK(hry_file_open_memory(out, (size_t)size, HRY_OPEN_VERIFY, &f, &err) == HRY_OK);
    hry_file_close(f);
    hry_writer_free(w);
}

static int mode_unit(const char *dir)
{
    unit_padded();
    unit_checksums();
    unit_descriptors();
    unit_files(dir);
    unit_shard_sets(dir);
    printf("%d checks, %d failures\n", checks, failures);
    return failures != 0;
}

int main(int argc, char **argv)
{
    if (argc >= 2 && strcmp(argv[1], "unit") == 0) {
        return mode_unit(argc >= 3 ? argv[2] : ".");
    }
    if (argc == 3 && strcmp(argv[1], "vectors") == 0) {
        return mode_vectors(argv[2]);
    }
    if (argc == 3 && strcmp(argv[1], "files") == 0) {
        return mode_files(argv[2]);
    }
    if (argc >= 2 && strcmp(argv[1], "decode") == 0) {
        return mode_decode(argc >= 3 && strcmp(argv[2], "prefix") == 0);
    }
    if (argc == 2 && strcmp(argv[1], "check-files") == 0) {
        return mode_check_files();
    }
    if (argc == 3 && strcmp(argv[1], "make-files") == 0) {
        return mode_make_files(argv[2]);
    }
    if (argc == 3 && strcmp(argv[1], "bench") == 0) {
        return mode_bench(argv[2]);
    }
    fprintf(stderr, "usage: test_hurray unit [TMPDIR] | vectors DIR | files DIR | decode [prefix] "
                    "| check-files | make-files DIR | bench HEX\n");
    return 1;
}
