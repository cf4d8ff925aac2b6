/*
 * Read a file that Python's hb.save wrote and print a tensor, with the Hurray C library.
 *
 *   python -c "import numpy as np, hurray_bridge as hb; \
 *              hb.save('w.hurray', {'w': np.arange(6, dtype=np.float32).reshape(2, 3)})"
 *   make -C c example && c/build/print_tensor w.hurray w
 *
 * The tensor is handed out as a DLPack DLManagedTensorVersioned that points straight into the
 * file's memory map (zero-copy, read-only); it keeps the file mapped until its deleter runs,
 * even after hry_file_close.
 */
#include "hurray.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

/* One element at p, printed as its type. */
static void print_element(const DLTensor *t, const uint8_t *p)
{
    if (t->dtype.code == kDLFloat && t->dtype.bits == 32) {
        float v;
        memcpy(&v, p, 4);
        printf("%g", (double)v);
    }
    else if (t->dtype.code == kDLFloat && t->dtype.bits == 64) {
        double v;
        memcpy(&v, p, 8);
        printf("%g", v);
    }
    else if ((t->dtype.code == kDLInt || t->dtype.code == kDLUInt) && t->dtype.bits >= 8) {
        uint64_t u = 0;
        memcpy(&u, p, t->dtype.bits / 8); /* little-endian host */
        if (t->dtype.code == kDLInt && t->dtype.bits < 64 && (u >> (t->dtype.bits - 1)) & 1) {
            u |= ~(uint64_t)0 << t->dtype.bits; /* sign-extend */
        }
        if (t->dtype.code == kDLInt) {
            printf("%" PRId64, (int64_t)u);
        }
        else {
            printf("%" PRIu64, u);
        }
    }
    else if (t->dtype.code == kDLBool) {
        printf("%s", *p ? "true" : "false");
    }
    else {
        printf("0x");
        for (int i = (t->dtype.bits + 7) / 8 - 1; i >= 0; i--) {
            printf("%02x", p[i]);
        }
    }
}

/* Print the tensor as nested lists, walking its (element) strides. */
static void print_dims(const DLTensor *t, int dim, const uint8_t *p, size_t item)
{
    if (dim == t->ndim) {
        print_element(t, p);
        return;
    }
    printf("[");
    for (int64_t i = 0; i < t->shape[dim]; i++) {
        if (i) {
            printf(", ");
        }
        if (i == 6 && t->shape[dim] > 8) {
            printf("...");
            i = t->shape[dim] - 3; /* then the last two */
            continue;
        }
        print_dims(t, dim + 1, p + i * t->strides[dim] * (int64_t)item, item);
    }
    printf("]");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s FILE [NAME]\n", argv[0]);
        return 1;
    }
    hry_error err;
    hry_file *f;
    if (hry_file_open(argv[1], 0, &f, &err) != HRY_OK) {
        fprintf(stderr, "%s: %s: %s\n", argv[1], err.field, err.message);
        return 2;
    }
    uint32_t index = 0;
    if (argc >= 3) {
        const hry_entry *e = hry_file_find(f, argv[2], strlen(argv[2]));
        if (e == NULL) {
            fprintf(stderr, "%s: no entry named '%s'\n", argv[1], argv[2]);
            hry_file_close(f);
            return 2;
        }
        index = e->position;
    }
    for (uint32_t i = 0; i < hry_file_entry_count(f); i++) {
        const hry_entry *e = hry_file_entry(f, i);
        hry_descriptor d;
        hry_entry_descriptor(e, &d, NULL);
        printf("%s %s [", i == index ? "*" : " ", e->name);
        for (uint32_t k = 0; k < d.rank; k++) {
            printf("%s%" PRIu64, k ? ", " : "", d.shape[k]);
        }
        printf("] %s %s, %" PRIu64 " bytes\n", hry_dtype(d.dtype)->name,
               hry_layout_name(d.layout), e->nbytes);
    }
    if (hry_file_entry_count(f) == 0) {
        printf("(no entries)\n");
        hry_file_close(f);
        return 0;
    }
    DLManagedTensorVersioned *m;
    if (hry_file_to_dlpack(f, index, &m, &err) != HRY_OK) {
        fprintf(stderr, "%s: %s: %s\n", argv[1], err.field, err.message);
        hry_file_close(f);
        return 2;
    }
    hry_file_close(f); /* the tensor keeps the mapping alive */
    const DLTensor *t = &m->dl_tensor;
    if (m->flags & DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED || t->dtype.bits < 8) {
        printf("(sub-byte elements; shown as bytes)\n");
    }
    size_t item = t->dtype.bits >= 8 ? t->dtype.bits / 8 : 1;
    if (t->data == NULL) {
        printf("empty tensor (data = NULL, nothing allocated)\n");
    }
    else if (t->dtype.bits < 8 && !(m->flags & DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED)) {
        printf("packed %u-bit elements\n", t->dtype.bits);
    }
    else {
        print_dims(t, 0, t->data, item);
        printf("\n");
    }
    m->deleter(m); /* the last reference: unmaps the file */
    return 0;
}
