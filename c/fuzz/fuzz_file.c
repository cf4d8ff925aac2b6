/*
 * libFuzzer target: the file parser (hry_file_open_memory, hry_file_verify, the DLPack
 * hand-out) and, for what it accepts, the writer.
 *
 * Each input is read as it is and "resealed" (both CRCs recomputed, as a hostile writer
 * would), so that the checks behind the checksums are fuzzed too. Every input must be
 * accepted or refused with HRY_E_FORMAT naming a field. For an accepted file: every entry's
 * descriptor decodes, every buffer lies inside the input and is read byte by byte (ASan sees
 * any read outside libFuzzer's exact-size copy), every dense entry hands out through DLPack
 * (data NULL exactly when empty), hry_file_verify agrees with opening with HRY_OPEN_VERIFY,
 * and the writer's copy of the file opens and verifies.
 *
 *   make -C c CC=clang fuzz && c/build/fuzz_file CORPUS_DIR fuzz/c/file
 */
#include "hurray.h"

#include <stdlib.h>
#include <string.h>

#define REQUIRE(c)                                                                          \
    do {                                                                                    \
        if (!(c)) {                                                                         \
            abort();                                                                        \
        }                                                                                   \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) {
        p[i] = (uint8_t)(v >> (8 * i));
    }
}

static uint64_t get64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) {
        v = (v << 8) | p[i];
    }
    return v;
}

static volatile uint8_t sink;

static void check_accepted(hry_file *f, const uint8_t *data, size_t size)
{
    hry_error err;
    hry_file_info info;
    hry_file_info_init(&info);
    hry_file_get_info(f, &info, NULL);
    REQUIRE(info.file_size == size && info.data_offset + info.data_length == size);
    hry_writer *w;
    REQUIRE(hry_writer_new(info.alignment, info.flags & HRY_FILE_FLAG_DATA_CHECKSUMS, &w, &err) ==
            HRY_OK);
    for (uint32_t k = 0; k < hry_file_metadata_count(f); k++) {
        const char *key, *value;
        uint32_t kl, vl;
        REQUIRE(hry_file_metadata(f, k, &key, &kl, &value, &vl) == HRY_OK);
        REQUIRE(strlen(key) == kl && hry_writer_add_metadata(w, key, kl, value, vl, &err) == HRY_OK);
    }
    uint32_t refused = 0;
    for (uint32_t i = 0; i < hry_file_entry_count(f); i++) {
        const hry_entry *e = hry_file_entry(f, i);
        hry_descriptor d;
        hry_descriptor_init(&d);
        REQUIRE(hry_entry_descriptor(e, &d, &err) == HRY_OK);
        REQUIRE(hry_file_find(f, e->name, e->name_length) == e);
        const void *bufs[HRY_MAX_BUFFERS];
        for (uint32_t j = 0; j < e->buffers.count; j++) {
            const uint8_t *p = hry_file_buffer(f, e, j);
            uint64_t len = e->buffers.entry[j].length;
            bufs[j] = p;
            REQUIRE((p == NULL) == (len == 0));
            if (p != NULL) {
                REQUIRE(p >= data && p + len <= data + size);
                uint8_t acc = 0;
                for (uint64_t k = 0; k < len; k++) {
                    acc ^= p[k];
                }
                sink = acc;
            }
        }
        DLManagedTensorVersioned *m;
        hry_status s = hry_file_to_dlpack(f, i, &m, &err);
        REQUIRE(s == HRY_OK || s == HRY_E_UNSUPPORTED);
        if (s == HRY_OK) {
            REQUIRE(m->flags & DLPACK_FLAG_BITMASK_READ_ONLY);
            REQUIRE((m->dl_tensor.data == NULL) ==
                    (hry_descriptor_is_empty(&d) || e->buffers.entry[0].length == 0));
            if (m->dl_tensor.data != NULL) {
                REQUIRE((const uint8_t *)m->dl_tensor.data >= data &&
                        (const uint8_t *)m->dl_tensor.data < data + size);
                sink = *(const uint8_t *)m->dl_tensor.data;
            }
            m->deleter(m);
        }
        hry_status ws = hry_writer_add(w, e->name, e->name_length, &d, bufs, e->buffers.count,
                                       &err);
        /* a writer refuses bool8 bytes other than 0 and 1, which a reader need not detect */
        REQUIRE(ws == HRY_OK ||
                (ws == HRY_E_FORMAT && d.dtype == HRY_BOOL8 && strcmp(err.field, "data") == 0));
        refused += ws != HRY_OK;
    }
    uint64_t out_size = hry_writer_file_size(w);
    uint8_t *out = malloc(out_size ? (size_t)out_size : 1);
    REQUIRE(out != NULL && hry_writer_serialize(w, out, (size_t)out_size, &err) == HRY_OK);
    hry_writer_free(w);
    /* the copy is a valid file that verifies; it is byte-identical to a verified input
     * exactly when the input was laid out canonically */
    hry_file *g;
    REQUIRE(hry_file_open_memory(out, (size_t)out_size, HRY_OPEN_VERIFY, &g, &err) == HRY_OK);
    REQUIRE(hry_file_entry_count(g) + refused == hry_file_entry_count(f));
    hry_file_close(g);
    free(out);
}

static void one(const uint8_t *data, size_t size)
{
    hry_file *f;
    hry_error err;
    hry_status s = hry_file_open_memory(data, size, 0, &f, &err);
    if (s != HRY_OK) {
        REQUIRE(s == HRY_E_FORMAT && err.field[0] != '\0');
        REQUIRE(hry_file_open_memory(data, size, HRY_OPEN_VERIFY, &f, &err) == HRY_E_FORMAT);
        return;
    }
    hry_file *v;
    int verified = hry_file_open_memory(data, size, HRY_OPEN_VERIFY, &v, &err) == HRY_OK;
    if (verified) {
        hry_file_close(v);
    }
    else {
        REQUIRE(err.field[0] != '\0');
    }
    REQUIRE(verified == (hry_file_verify(f, &err) == HRY_OK));
    check_accepted(f, data, size);
    hry_file_close(f);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    one(data, size);
    if (size < 128 || memcmp(data, "HRYF", 4) != 0) {
        return 0;
    }
    /* resealed: index and header CRCs recomputed */
    uint8_t *copy = malloc(size);
    REQUIRE(copy != NULL);
    memcpy(copy, data, size);
    uint64_t t_len = get64(copy + 24), m_len = get64(copy + 40);
    if (t_len <= size - 128 && m_len <= size - 128 - t_len) {
        put32(copy + 76, hry_crc32(0, copy + 128, (size_t)(t_len + m_len)));
    }
    put32(copy + 124, hry_crc32(0, copy, 124));
    if (memcmp(copy, data, size) != 0) {
        one(copy, size);
    }
    free(copy);
    return 0;
}
