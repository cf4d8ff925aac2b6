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
