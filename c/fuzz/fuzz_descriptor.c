/*
 * libFuzzer target: the descriptor decoder (hry_decode_prefix / hry_decode).
 *
 * Every input must be accepted or refused with HRY_E_FORMAT and a field name; built with
 * ASan + UBSan, any out-of-bounds read, overflow or leak aborts. What is accepted is checked
 * further: its sizes compute, it re-encodes with the offsets it was read with to the input
 * bytes (the minor version and a zero-length buffer's offset aside: a reader ignores both),
 * the strict decoder agrees, and the re-encoding decodes to an equal descriptor.
 *
 *   make -C c CC=clang fuzz && c/build/fuzz_descriptor CORPUS_DIR fuzz/c/descriptor
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

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    hry_descriptor d, again;
    hry_descriptor_init(&d);
    hry_descriptor_init(&again);
    hry_buffer_table t, t2;
    hry_error err;
    size_t used = 0;
    uint8_t minor = 0;
    hry_status s = hry_decode_prefix(data, size, &d, &t, &used, &minor, &err);
    if (s != HRY_OK) {
        REQUIRE(s == HRY_E_FORMAT && err.field[0] != '\0' && err.message[0] != '\0');
        /* the strict decoder refuses it too */
        REQUIRE(hry_decode(data, size, &again, &t2, &err) == HRY_E_FORMAT);
        return 0;
    }
    REQUIRE(used >= 32 && used <= size && used <= HRY_MAX_DESCRIPTOR_SIZE && used % 8 == 0);
    REQUIRE(hry_descriptor_check(&d, &err) == HRY_OK);
    s = hry_decode(data, size, &again, &t2, &err);
    REQUIRE(used == size ? s == HRY_OK && hry_descriptor_equal(&d, &again)
                         : s == HRY_E_FORMAT && strcmp(err.field, "total_size") == 0);
    /* sizes */
    uint64_t count, nbytes;
    hry_buffer_spec specs[HRY_MAX_BUFFERS];
    uint32_t n = 0;
    if (hry_descriptor_is_dynamic(&d)) {
        REQUIRE(t.count == 0);
        REQUIRE(hry_descriptor_element_count(&d, &count, &err) == HRY_E_DYNAMIC);
        REQUIRE(hry_descriptor_buffer_layout(&d, specs, &n, &err) == HRY_E_DYNAMIC);
    }
    else {
        REQUIRE(hry_descriptor_element_count(&d, &count, &err) == HRY_OK);
        REQUIRE(hry_descriptor_nbytes(&d, &nbytes, &err) == HRY_OK);
        REQUIRE(hry_descriptor_buffer_layout(&d, specs, &n, &err) == HRY_OK);
        REQUIRE(n == t.count && n >= 1 && n <= HRY_MAX_BUFFERS && specs[0].length == nbytes);
        for (uint32_t j = 0; j < n; j++) {
            REQUIRE(specs[j].role == t.entry[j].role && specs[j].length == t.entry[j].length);
        }
        REQUIRE(!hry_descriptor_is_empty(&d) || count == 0);
    }
    /* canonical: re-encoding with the same offsets gives the input back */
    uint64_t offs[HRY_MAX_BUFFERS];
    for (uint32_t j = 0; j < t.count; j++) {
        offs[j] = t.entry[j].offset;
    }
    uint8_t out[HRY_MAX_DESCRIPTOR_SIZE], expect[HRY_MAX_DESCRIPTOR_SIZE];
    size_t w = 0;
    REQUIRE(hry_encoded_size(&d) == used);
    REQUIRE(hry_encode(&d, offs, t.count, out, sizeof out, &w, &err) == HRY_OK && w == used);
    memcpy(expect, data, used);
    expect[5] = 0; /* the minor version is written as 0 */
    size_t table_at = used - 24 * (size_t)t.count;
    for (uint32_t j = 0; j < t.count; j++) {
        if (t.entry[j].length == 0) {
            memset(expect + table_at + 24 * j + 8, 0, 8); /* written as 0, ignored on read */
        }
    }
    REQUIRE(memcmp(out, expect, used) == 0);
    REQUIRE(hry_decode(out, w, &again, &t2, &err) == HRY_OK && hry_descriptor_equal(&d, &again));
    /* canonical placement encodes too */
    REQUIRE(hry_encode(&d, NULL, 0, out, sizeof out, &w, &err) == HRY_OK && w == used);
    return 0;
}
