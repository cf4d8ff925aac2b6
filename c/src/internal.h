/* Internal helpers shared by the library's source files (not installed). */
#ifndef HURRAY_INTERNAL_H
#define HURRAY_INTERNAL_H

#include "hurray.h"

#include <string.h>

#if defined(__GNUC__) || defined(__clang__)
#define HRY_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define HRY_PRINTF(a, b)
#endif

/* Fill *err (when not NULL) and return status. */
hry_status hry__fail(hry_error *err, hry_status status, const char *field, const char *fmt, ...)
    HRY_PRINTF(4, 5);
/* An I/O failure: HRY_E_IO naming the action, the path and errno (kept in err->os_errno). */
hry_status hry__io_fail(hry_error *err, const char *what, const char *path);
/* Clear *err to HRY_OK (when not NULL). */
void hry__ok(hry_error *err);

/* crc32.c: the number of ways this CPU can sum (1: the table only; 2: 128-bit carry-less
 * multiplication; 3: with AVX2; 4: with AVX-512); the sum by a given way below that number;
 * and the CRC-32 of A + B from A's, B's and B's length. */
int hry__crc32_ways(void);
uint32_t hry__crc32_by(int way, uint32_t crc, const void *data, size_t len);
uint32_t hry__crc32_combine(uint32_t crc1, uint32_t crc2, uint64_t len2);

static inline uint16_t hry__le16(const uint8_t *p)
{
    return (uint16_t)(p[0] | (p[1] << 8));
}

static inline uint32_t hry__le32(const uint8_t *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) |
           ((uint32_t)p[3] << 24);
}

static inline uint64_t hry__le64(const uint8_t *p)
{
    return (uint64_t)hry__le32(p) | ((uint64_t)hry__le32(p + 4) << 32);
}

static inline void hry__put16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static inline void hry__put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) {
        p[i] = (uint8_t)(v >> (8 * i));
    }
}

static inline void hry__put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) {
        p[i] = (uint8_t)(v >> (8 * i));
    }
}

/* An entry's 16 fixed bytes at p (container.md §4): name length, descriptor length, the
 * data CRC-32 (0 without checksums) and the reserved word. */
static inline void hry__put_entry_head(uint8_t *p, uint32_t name_length, uint32_t desc_length,
                                       uint32_t crc)
{
    hry__put32(p, name_length);
    hry__put32(p + 4, desc_length);
    hry__put32(p + 8, crc);
    hry__put32(p + 12, 0);
}

/* The file header at h (HRY_FILE_HEADER_SIZE bytes, its reserved ones already zero), with
 * the CRC-32 of the table and metadata that follow it at h + HRY_FILE_HEADER_SIZE (written
 * first) and its own: what writer.c and the Python extension's planner of small files
 * (hurray_bridge/_speedups_c/small_files.c) write, one description of the layout. */
static inline void hry__put_file_header(uint8_t *h, uint32_t n_entries, uint32_t n_meta,
                                        int checksums, uint64_t table_length,
                                        uint64_t meta_length, uint64_t data_offset,
                                        uint64_t data_length, uint32_t alignment)
{
    memcpy(h, "HRYF", 4);
    h[4] = HRY_FILE_VERSION_MAJOR;
    h[5] = HRY_FILE_VERSION_MINOR;
    hry__put16(h + 6, checksums ? HRY_FILE_FLAG_DATA_CHECKSUMS : 0);
    hry__put32(h + 8, n_entries);
    hry__put32(h + 12, n_meta);
    hry__put64(h + 16, HRY_FILE_HEADER_SIZE);
    hry__put64(h + 24, table_length);
    hry__put64(h + 32, HRY_FILE_HEADER_SIZE + table_length);
    hry__put64(h + 40, meta_length);
    hry__put64(h + 48, data_offset);
    hry__put64(h + 56, data_length);
    hry__put64(h + 64, data_offset + data_length);
    hry__put32(h + 72, alignment);
    hry__put32(h + 76, hry_crc32(0, h + HRY_FILE_HEADER_SIZE,
                                 (size_t)(table_length + meta_length)));
    hry__put32(h + 124, hry_crc32(0, h, 124));
}

/* 1 when a * b overflows 64 bits; else *r = a * b. */
static inline int hry__mul(uint64_t a, uint64_t b, uint64_t *r)
{
#if defined(__GNUC__) || defined(__clang__)
    uint64_t p;
    if (__builtin_mul_overflow(a, b, &p)) { /* no 64-bit division on the hot path */
        return 1;
    }
    *r = p;
    return 0;
#else
    if (a != 0 && b > UINT64_MAX / a) {
        return 1;
    }
    *r = a * b;
    return 0;
#endif
}

/* 1 when a + b overflows 64 bits; else *r = a + b. */
static inline int hry__add(uint64_t a, uint64_t b, uint64_t *r)
{
    if (b > UINT64_MAX - a) {
        return 1;
    }
    *r = a + b;
    return 0;
}

/* 1 on a little-endian host. */
static inline int hry__little_endian(void)
{
    const uint16_t one = 1;
    return *(const uint8_t *)&one == 1;
}

/* HRY_OK when a caller's struct_size is at least `min` (the 2.0 size of struct `what`), else
 * HRY_E_ARGUMENT naming struct_size and the fix. */
hry_status hry__struct_size(uint32_t size, size_t min, const char *what, hry_error *err);
/* A caller's descriptor as this library's struct (hurray.h, hry_descriptor.struct_size): *d
 * is left as it is when its size is this library's; else *d becomes `local`, a copy with the
 * fields the caller's struct lacks set to zero. Refuses a size below 2.0's and a newer
 * caller's field that is set. A NULL *d is left for the caller to refuse. */
hry_status hry__desc_in(const hry_descriptor **d, hry_descriptor *local, hry_error *err);

/* Valid UTF-8 as Python's strict decoder accepts it (no overlongs, no surrogates,
 * nothing above U+10FFFF). */
int hry__utf8_valid(const uint8_t *s, size_t n, size_t *bad_at);

/* Bits of the primary buffer's last byte after the last element (0 ... 7): non-zero only
 * for packed sub-byte data that ends inside a byte, whose high bits a writer writes as
 * zero (element-types.md section 4.1 rule 6). d is a valid static descriptor. */
unsigned hry__trailing_bits(const hry_descriptor *d);
/* Padded sub-byte data (element-types.md section 4.3): 1 and the first element (row-major
 * order; a strided span's gaps are none) whose byte has a bit of `mask` set, and that
 * byte; 0 when no element has. `p` holds the primary buffer's `length` bytes. */
int hry__padded_high_bits(const hry_descriptor *d, const uint8_t *p, uint64_t length,
                          uint8_t mask, uint64_t *element, uint8_t *byte);

#endif
