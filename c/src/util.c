/* UTF-8 validation and a set of byte strings (duplicate names and keys). */
#include "strset.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int hry__utf8_valid(const uint8_t *s, size_t n, size_t *bad_at)
{
    size_t i = 0;
    while (i < n) {
        uint8_t c = s[i];
        size_t len;
        uint32_t lo = 0x80, hi = 0xBF; /* range of the second byte */
        if (c < 0x80) {
            i++;
            continue;
        }
        if (c >= 0xC2 && c <= 0xDF) {
            len = 2;
        }
        else if (c >= 0xE0 && c <= 0xEF) {
            len = 3;
            if (c == 0xE0) {
                lo = 0xA0; /* no overlong */
            }
            else if (c == 0xED) {
                hi = 0x9F; /* no surrogates */
            }
        }
        else if (c >= 0xF0 && c <= 0xF4) {
            len = 4;
            if (c == 0xF0) {
                lo = 0x90;
            }
            else if (c == 0xF4) {
                hi = 0x8F; /* nothing above U+10FFFF */
            }
        }
        else {
            goto bad;
        }
        if (n - i < len || s[i + 1] < lo || s[i + 1] > hi) {
            goto bad;
        }
        for (size_t k = 2; k < len; k++) {
            if (s[i + k] < 0x80 || s[i + k] > 0xBF) {
                goto bad;
            }
        }
        i += len;
    }
    return 1;
bad:
    if (bad_at != NULL) {
        *bad_at = i;
    }
    return 0;
}

static uint64_t hash(const uint8_t *p, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++) {
        h = (h ^ p[i]) * 0x100000001b3ull;
    }
    return h;
}

int hry__strset_init(hry__strset *s, size_t expected)
{
    size_t cap = 16;
    while (cap < 2 * expected + 2) {
        cap *= 2;
    }
    s->slots = calloc(cap, sizeof *s->slots);
    s->cap = s->slots != NULL ? cap : 0;
    s->used = 0;
    return s->slots != NULL;
}

void hry__strset_free(hry__strset *s)
{
    free(s->slots);
    s->slots = NULL;
    s->cap = s->used = 0;
}

static int grow(hry__strset *s)
{
    hry__strset bigger;
    if (!hry__strset_init(&bigger, s->cap)) {
        return 0;
    }
    for (size_t i = 0; i < s->cap; i++) {
        if (s->slots[i].p != NULL) {
            size_t j = s->slots[i].h & (bigger.cap - 1);
            while (bigger.slots[j].p != NULL) {
                j = (j + 1) & (bigger.cap - 1);
            }
            bigger.slots[j] = s->slots[i];
        }
    }
    bigger.used = s->used;
    free(s->slots);
    *s = bigger;
    return 1;
}

int hry__strset_add(hry__strset *s, const uint8_t *p, size_t n, uint32_t value, uint32_t *existing)
{
    if (2 * (s->used + 1) > s->cap && !grow(s)) {
        return -1;
    }
    uint64_t h = hash(p, n);
    size_t j = h & (s->cap - 1);
    while (s->slots[j].p != NULL) {
        if (s->slots[j].h == h && s->slots[j].n == n && memcmp(s->slots[j].p, p, n) == 0) {
            if (existing != NULL) {
                *existing = s->slots[j].value;
            }
            return 0;
        }
        j = (j + 1) & (s->cap - 1);
    }
    s->slots[j].p = p;
    s->slots[j].n = n;
    s->slots[j].h = h;
    s->slots[j].value = value;
    s->used++;
    return 1;
}

int hry__strset_find(const hry__strset *s, const uint8_t *p, size_t n, uint32_t *value)
{
    if (s->cap == 0) {
        return 0;
    }
    uint64_t h = hash(p, n);
    size_t j = h & (s->cap - 1);
    while (s->slots[j].p != NULL) {
        if (s->slots[j].h == h && s->slots[j].n == n && memcmp(s->slots[j].p, p, n) == 0) {
            *value = s->slots[j].value;
            return 1;
        }
        j = (j + 1) & (s->cap - 1);
    }
    return 0;
}

hry_status hry__io_fail(hry_error *err, const char *what, const char *path)
{
    int e = errno;
    hry__fail(err, HRY_E_IO, "", "%s %.200s: %s", what, path, strerror(e));
    if (err != NULL) {
        err->os_errno = e;
    }
    return HRY_E_IO;
}

int hry__padded_high_bits(const hry_descriptor *d, const uint8_t *p, uint64_t length,
                          uint8_t mask, uint64_t *element, uint8_t *byte)
{
    uint64_t k = 0;
    while (k < length && !(p[k] & mask)) {
        k++;
    }
    if (k == length) {
        return 0;
    }
    if (d->layout != HRY_STRIDED) {
        *element = k;
        *byte = p[k];
        return 1;
    }
    /* A strided span: its gaps are no elements. Walk the elements in row-major order from
     * element [0, ..., 0] (where the negative strides' dimensions start). */
    uint32_t r = d->rank;
    uint64_t idx[HRY_MAX_RANK];
    int64_t off = 0;
    for (uint32_t i = 0; i < r; i++) {
        if (d->shape[i] == 0) {
            return 0;
        }
        if (d->strides[i] < 0) {
            off += (int64_t)(d->shape[i] - 1) * -d->strides[i];
        }
        idx[i] = 0;
    }
    for (uint64_t count = 0;; count++) {
        if (p[off] & mask) {
            *element = count;
            *byte = p[off];
            return 1;
        }
        uint32_t i = r;
        while (i > 0) {
            i--;
            if (++idx[i] < d->shape[i]) {
                off += d->strides[i];
                break;
            }
            off -= d->strides[i] * (int64_t)(d->shape[i] - 1);
            idx[i] = 0;
            if (i == 0) {
                return 0;
            }
        }
        if (r == 0) {
            return 0;
        }
    }
}
