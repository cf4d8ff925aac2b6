/*
 * hurray-c: inspect, verify and copy Hurray files with the C library.
 *
 *   hurray-c inspect [--json] FILE   one line per entry (JSON objects with --json)
 *   hurray-c verify FILE...          exit 0 when every byte checks out
 *   hurray-c copy IN OUT             read through the C reader, write through the C writer
 *
 * Errors go to stderr as "hurray-c: error: FILE: FIELD: message"; the exit status is 2
 * (1 for a usage error), as for the Python tool `hurray`.
 */
#define _POSIX_C_SOURCE 200809L
#include "hurray.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fail(const char *path, const hry_error *e)
{
    if (e->field[0] != '\0') {
        fprintf(stderr, "hurray-c: error: %s: %s: %s\n", path, e->field, e->message);
    }
    else {
        fprintf(stderr, "hurray-c: error: %s: %s\n", path, e->message);
    }
    return 2;
}

static void json_string(FILE *o, const char *s, size_t n)
{
    fputc('"', o);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') {
            fputc('\\', o);
            fputc(c, o);
        }
        else if (c < 0x20 || c == 0x7F) {
            fprintf(o, "\\u%04x", c);
        }
        else {
            fputc(c, o); /* names are valid UTF-8 (checked by the reader) */
        }
    }
    fputc('"', o);
}

static void hex_digest(const uint8_t d[32], char out[65])
{
    for (int i = 0; i < 32; i++) {
        snprintf(out + 2 * i, 3, "%02x", d[i]);
    }
}

static void u64_list(FILE *o, const uint64_t *v, uint32_t n)
{
    fputc('[', o);
    for (uint32_t i = 0; i < n; i++) {
        fprintf(o, "%s%llu", i ? ", " : "", (unsigned long long)v[i]);
    }
    fputc(']', o);
}

static void inspect_json(FILE *o, const hry_file *f, const hry_entry *e, const hry_descriptor *d)
{
    const hry_dtype_info *t = hry_dtype(d->dtype);
    fputs("{\"name\": ", o);
    json_string(o, e->name, e->name_length);
    fprintf(o, ", \"dtype\": \"%s\", \"type_tag\": %u, \"shape\": ", t->name, d->dtype);
    u64_list(o, d->shape, d->rank);
    fprintf(o, ", \"layout\": \"%s\", \"flags\": %u", hry_layout_name(d->layout),
            hry_descriptor_flags(d));
    if (d->layout == HRY_STRIDED) {
        fputs(", \"strides\": [", o);
        for (uint32_t i = 0; i < d->rank; i++) {
            fprintf(o, "%s%lld", i ? ", " : "", (long long)d->strides[i]);
        }
        fputc(']', o);
    }
    if (d->layout == HRY_TILED) {
        fputs(", \"tile\": ", o);
        u64_list(o, d->tile, d->n_tile);
    }
    if (d->layout == HRY_COO || d->layout == HRY_CSR || d->layout == HRY_CSC) {
        fprintf(o, ", \"sparse\": {\"nnz\": %llu, \"index_dtype\": \"%s\", \"canonical\": %s}",
                (unsigned long long)d->sparse.nnz, hry_dtype(d->sparse.index_type)->name,
                d->sparse.canonical ? "true" : "false");
    }
    if (d->has_quantization) {
        static const char *const schemes[] = {"", "PER_TENSOR", "PER_AXIS", "PER_BLOCK"};
        fprintf(o, ", \"quantization\": {\"scheme\": \"%s\", \"scale_dtype\": \"%s\", "
                   "\"zero_point_dtype\": ", schemes[d->quant.scheme],
                hry_dtype(d->quant.scale_type)->name);
        if (d->quant.zero_point_type) {
            fprintf(o, "\"%s\"", hry_dtype(d->quant.zero_point_type)->name);
        }
        else {
            fputs("null", o);
        }
        fprintf(o, ", \"axis\": %ld, \"block_size\": %llu}", (long)d->quant.axis,
                (unsigned long long)d->quant.block_size);
    }
    if (d->has_shard) {
        fprintf(o, ", \"shard\": {\"replica_id\": %u, \"device_type\": %ld, \"device_id\": %ld, "
                   "\"offsets\": ", d->shard.replica_id, (long)d->shard.device_type,
                (long)d->shard.device_id);
        u64_list(o, d->shard.offsets, d->rank);
        fputs(", \"global_shape\": ", o);
        u64_list(o, d->shard.global_shape, d->rank);
        fputc('}', o);
    }
    /* sha256 of the entry's buffers as stored, concatenated in table order (for a dense
     * tensor: its one DATA buffer) */
    hry_sha256 all;
    hry_sha256_init(&all);
    fputs(", \"buffers\": [", o);
    for (uint32_t j = 0; j < e->buffers.count; j++) {
        const hry_buffer_entry *b = &e->buffers.entry[j];
        const void *p = hry_file_buffer(f, e, j);
        hry_sha256 one;
        uint8_t dig[32];
        char hex[65];
        hry_sha256_init(&one);
        if (b->length) {
            hry_sha256_update(&one, p, (size_t)b->length);
            hry_sha256_update(&all, p, (size_t)b->length);
        }
        hry_sha256_final(&one, dig);
        hex_digest(dig, hex);
        fprintf(o, "%s{\"role\": \"%s\", \"offset\": %llu, \"length\": %llu, \"sha256\": \"%s\"}",
                j ? ", " : "", hry_role_name(b->role), (unsigned long long)b->offset,
                (unsigned long long)b->length, hex);
    }
    uint8_t dig[32];
    char hex[65];
    hry_sha256_final(&all, dig);
    hex_digest(dig, hex);
    fprintf(o, "], \"nbytes\": %llu, \"sha256\": \"%s\", \"checksum\": ",
            (unsigned long long)e->nbytes, hex);
    if (e->has_checksum) {
        fprintf(o, "%u", e->checksum);
    }
    else {
        fputs("null", o);
    }
    fputs(", \"descriptor\": \"", o);
    for (uint32_t i = 0; i < e->descriptor_length; i++) {
        fprintf(o, "%02x", e->descriptor_bytes[i]);
    }
    fputs("\"}\n", o);
}

static int cmd_inspect(int json, const char *path)
{
    hry_error err;
    hry_file *f;
    if (hry_file_open(path, 0, &f, &err) != HRY_OK) {
        return fail(path, &err);
    }
    hry_file_info info;
    hry_file_info_init(&info);
    hry_file_get_info(f, &info, NULL);
    if (!json) {
        printf("%s: Hurray %u.%u, %u entries, %llu bytes of data, %u-byte alignment, %s\n", path,
               info.version_major, info.version_minor, info.n_entries,
               (unsigned long long)info.data_length, info.alignment,
               info.flags & HRY_FILE_FLAG_DATA_CHECKSUMS ? "CRC-32 data checksums"
                                                         : "no data checksums");
    }
    int rc = 0;
    for (uint32_t i = 0; i < hry_file_entry_count(f); i++) {
        const hry_entry *e = hry_file_entry(f, i);
        hry_descriptor d;
        hry_descriptor_init(&d);
        if (hry_entry_descriptor(e, &d, &err) != HRY_OK) {
            rc = fail(path, &err);
            break;
        }
        if (json) {
            inspect_json(stdout, f, e, &d);
            continue;
        }
        printf("  %s  %s  ", e->name, hry_dtype(d.dtype)->name);
        u64_list(stdout, d.shape, d.rank);
        printf("  %s  %llu bytes\n", hry_layout_name(d.layout), (unsigned long long)e->nbytes);
    }
    if (!json) {
        for (uint32_t k = 0; k < hry_file_metadata_count(f); k++) {
            const char *key, *value;
            hry_file_metadata(f, k, &key, NULL, &value, NULL);
            printf("  metadata %s = %s\n", key, value);
        }
    }
    hry_file_close(f);
    return rc;
}

static int cmd_verify(const char *path)
{
    hry_error err;
    hry_file *f;
    if (hry_file_open(path, HRY_OPEN_VERIFY, &f, &err) != HRY_OK) {
        return fail(path, &err);
    }
    hry_file_info info;
    hry_file_info_init(&info);
    hry_file_get_info(f, &info, NULL);
    printf("%s: OK (%u entries, %llu bytes, %s)\n", path, info.n_entries,
           (unsigned long long)info.file_size,
           info.flags & HRY_FILE_FLAG_DATA_CHECKSUMS ? "data checksums verified"
                                                     : "no data checksums; structure and padding verified");
    hry_file_close(f);
    return 0;
}

static int cmd_copy(const char *in, const char *out)
{
    hry_error err;
    hry_file *f;
    /* verified first: a copy must not launder damaged bytes under fresh checksums */
    if (hry_file_open(in, HRY_OPEN_VERIFY, &f, &err) != HRY_OK) {
        return fail(in, &err);
    }
    hry_file_info info;
    hry_file_info_init(&info);
    hry_file_get_info(f, &info, NULL);
    hry_writer *w;
    int rc = 0;
    if (hry_writer_new(info.alignment, info.flags & HRY_FILE_FLAG_DATA_CHECKSUMS, &w, &err) !=
        HRY_OK) {
        hry_file_close(f);
        return fail(out, &err);
    }
    for (uint32_t k = 0; k < info.n_metadata && rc == 0; k++) {
        const char *key, *value;
        uint32_t kl, vl;
        hry_file_metadata(f, k, &key, &kl, &value, &vl);
        if (hry_writer_add_metadata(w, key, kl, value, vl, &err) != HRY_OK) {
            rc = fail(out, &err);
        }
    }
    for (uint32_t i = 0; i < info.n_entries && rc == 0; i++) {
        const hry_entry *e = hry_file_entry(f, i);
        hry_descriptor d;
        hry_descriptor_init(&d);
        const void *bufs[HRY_MAX_BUFFERS];
        for (uint32_t j = 0; j < e->buffers.count; j++) {
            bufs[j] = hry_file_buffer(f, e, j);
        }
        if (hry_entry_descriptor(e, &d, &err) != HRY_OK ||
            hry_writer_add(w, e->name, e->name_length, &d, bufs, e->buffers.count, &err) !=
                HRY_OK) {
            rc = fail(in, &err);
        }
    }
    if (rc == 0 && hry_writer_save(w, out, 0, &err) != HRY_OK) {
        rc = fail(out, &err);
    }
    hry_writer_free(w);
    hry_file_close(f);
    return rc;
}

static int usage(FILE *o, int rc)
{
    fputs("usage: hurray-c inspect [--json] FILE\n"
          "       hurray-c verify FILE...\n"
          "       hurray-c copy IN OUT\n"
          "       hurray-c --version\n", o);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        return usage(stderr, 1);
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0) {
        return usage(stdout, 0);
    }
    if (strcmp(cmd, "--version") == 0) {
        uint32_t v = hry_library_version();
        printf("hurray-c %u.%u.%u (file format %u.%u, descriptor encoding %u.%u)\n", v >> 16,
               (v >> 8) & 0xFF, v & 0xFF, HRY_FILE_VERSION_MAJOR, HRY_FILE_VERSION_MINOR,
               HRY_WIRE_VERSION_MAJOR, HRY_WIRE_VERSION_MINOR);
        return 0;
    }
    if (strcmp(cmd, "inspect") == 0) {
        if (argc == 4 && strcmp(argv[2], "--json") == 0) {
            return cmd_inspect(1, argv[3]);
        }
        if (argc == 4 && strcmp(argv[3], "--json") == 0) {
            return cmd_inspect(1, argv[2]);
        }
        if (argc == 3) {
            return cmd_inspect(0, argv[2]);
        }
        return usage(stderr, 1);
    }
    if (strcmp(cmd, "verify") == 0) {
        if (argc < 3) {
            return usage(stderr, 1);
        }
        int rc = 0;
        for (int i = 2; i < argc; i++) {
            int r = cmd_verify(argv[i]);
            rc = r ? r : rc;
        }
        return rc;
    }
    if (strcmp(cmd, "copy") == 0) {
        if (argc != 4) {
            return usage(stderr, 1);
        }
        return cmd_copy(argv[2], argv[3]);
    }
    fprintf(stderr, "hurray-c: unknown command '%s'\n", cmd);
    return usage(stderr, 1);
}
