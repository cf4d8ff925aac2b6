/* The shard sets of a file's entries (shards.c). Internal. */
#ifndef HURRAY_SHARDS_H
#define HURRAY_SHARDS_H

#include "strset.h"

typedef struct hry__named {
    const uint8_t *name; /* borrowed */
    uint32_t name_length;
    const uint8_t *desc; /* the encoded descriptor, borrowed */
    uint32_t desc_length;
} hry__named;

/* What Python's grouping reader refuses in one file: a name that is a sharded tensor's and
 * an entry's (field "name"), a broken shard set (field "shards"). `names` maps each
 * entry's name to its position in `entries`. */
hry_status hry__check_shard_sets(const hry__named *entries, uint32_t n, const hry__strset *names,
                                 hry_error *err);

#endif
