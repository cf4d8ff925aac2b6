/* A set of byte strings (open addressing), for duplicate names and keys. Internal. */
#ifndef HURRAY_STRSET_H
#define HURRAY_STRSET_H

#include "internal.h"

typedef struct hry__strslot {
    const uint8_t *p; /* borrowed; NULL = empty slot */
    size_t n;
    uint64_t h;
    uint32_t value;
} hry__strslot;

typedef struct hry__strset {
    hry__strslot *slots;
    size_t cap, used;
} hry__strset;

/* 1 on success, 0 when out of memory. */
int hry__strset_init(hry__strset *s, size_t expected);
void hry__strset_free(hry__strset *s);
/* 1: added; 0: already present (*existing = its value); -1: out of memory. */
int hry__strset_add(hry__strset *s, const uint8_t *p, size_t n, uint32_t value, uint32_t *existing);
/* 1 and *value when present, else 0. */
int hry__strset_find(const hry__strset *s, const uint8_t *p, size_t n, uint32_t *value);

#endif
