/*
 * Read a file that Python's hb.save wrote and print a tensor, with the Hurray C library.
 *
 *   python -c "import numpy as np, hurray_bridge as hb; \
 *              hb.save('w.hurray', {'w': np.arange(6, dtype=np.float32).reshape(2, 3)})"
 *   make -C c example && c/build/print_tensor w.hurray w     # that entry and its values
 *   c/build/print_tensor w.hurray                            # one line per entry
 *
 * The tensor is handed out as a DLPack DLManagedTensorVersioned that points straight into the
 * file's memory map (zero-copy, read-only); it keeps the file mapped until its deleter runs,
 * even after hry_file_close. Floating-point elements of every width (float16, bfloat16, the
 * float8 types, padded float4) print as the decimal value of their bits: the shortest text
 * that reads back as the same number, the number Python's float(x) gives.
 */
#include "hurray.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* How a narrow float spends its all-ones exponent (docs/spec/element-types.md). */
enum special {
    IEEE,  /* all-ones exponent: infinity (mantissa 0) or NaN */
    FN,    /* no infinity; NaN only with every exponent and mantissa bit set */
    FNUZ,  /* no infinity, no -0: the bit pattern of -0 is the one NaN */
    FINITE /* every pattern is a number */
};

/* v * 2^k, exact while the result is a normal double. */
static double scale2(double v, int k)
{
    for (; k > 0; k--) {
        v *= 2.0;
    }
    for (; k < 0; k++) {
        v *= 0.5;
    }
    return v;
}

/* The exact value of a float of 1 sign, `ebits` exponent and `mbits` mantissa bits. Scaling
 * by powers of 2 is exact in a double for every format here (2^-133 .. 2^128), so no libm. */
static double minifloat(unsigned bits, int ebits, int mbits, int bias, enum special sp)
{
    unsigned sign = (bits >> (ebits + mbits)) & 1u;
    unsigned emax = (1u << ebits) - 1u, mmax = (1u << mbits) - 1u;
    unsigned e = (bits >> mbits) & emax, m = bits & mmax;
    if ((sp == FNUZ && sign && e == 0 && m == 0) || (sp == IEEE && e == emax && m != 0) ||
        (sp == FN && e == emax && m == mmax)) {
        return NAN;
    }
    if (sp == IEEE && e == emax) {
        return sign ? -INFINITY : INFINITY;
    }
    /* value = significand * 2^(exponent - bias - mbits); subnormals have exponent 1 */
    double v = scale2((double)(e ? m | (1u << mbits) : m), (int)(e ? e : 1) - bias - mbits);
    return sign ? -v : v;
}

/* The shortest decimal that reads back as v (what Python's repr(float) finds), written
 * without an exponent for integers below 10^16, as Python does. */
static void print_real(double v)
{
    if (v != v) {
        printf("nan"); /* not "-nan": NaN has no sign to show */
        return;
    }
    if (v == INFINITY || v == -INFINITY) {
        printf("%sinf", v < 0 ? "-" : "");
        return;
    }
    char text[40];
    int digits = 1;
    for (; digits < 17; digits++) {
        snprintf(text, sizeof text, "%.*g", digits, v);
        if (strtod(text, NULL) == v) {
            break;
        }
    }
    const char *e = strchr(text, 'e');
    if (e != NULL && e[1] == '+' && atoi(e + 2) < 16) {
        digits = atoi(e + 2) + 1; /* 1e+02 -> 100: enough digits for the integer part */
    }
    printf("%.*g", digits, v);
}

/* A float element's value, or 0 (with *is_float = 0) for a type that is not one. */
static double real_value(uint8_t code, uint8_t bits, const uint8_t *p, int *is_float)
{
    uint16_t h;
    *is_float = 1;
    switch (code) {
    case kDLFloat:
        if (bits == 16) {
            memcpy(&h, p, 2);
            return minifloat(h, 5, 10, 15, IEEE);
        }
        if (bits == 32) {
            float f;
            memcpy(&f, p, 4);
            return f;
        }
        if (bits == 64) {
            double d;
            memcpy(&d, p, 8);
            return d;
        }
        break;
    case kDLBfloat: { /* the upper half of a float32 */
        uint32_t w;
        float f;
        memcpy(&h, p, 2);
        w = (uint32_t)h << 16;
        memcpy(&f, &w, 4);
        return f;
    }
    case kDLFloat8_e4m3fn:
        return minifloat(*p, 4, 3, 7, FN);
    case kDLFloat8_e5m2:
        return minifloat(*p, 5, 2, 15, IEEE);
    case kDLFloat8_e4m3fnuz:
        return minifloat(*p, 4, 3, 8, FNUZ);
    case kDLFloat8_e5m2fnuz:
        return minifloat(*p, 5, 2, 16, FNUZ);
    case kDLFloat8_e8m0fnu: /* a power of two, 2^(bits - 127); 0xFF is NaN */
        return *p == 0xFF ? NAN : scale2(1.0, (int)*p - 127);
    case kDLFloat4_e2m1fn: /* padded: one element in the low 4 bits of each byte */
        return minifloat(*p & 0x0Fu, 2, 1, 1, FINITE);
    default:
        break;
    }
    *is_float = 0;
    return 0.0;
}

/* One element at p, printed as its type. */
static void print_element(const DLTensor *t, const uint8_t *p)
{
    int is_float;
    double v = real_value(t->dtype.code, t->dtype.bits, p, &is_float);
    if (is_float) {
        print_real(v);
    }
    else if (t->dtype.code == kDLComplex && (t->dtype.bits == 64 || t->dtype.bits == 128)) {
        int half = t->dtype.bits / 16; /* bytes of each part */
        double im = real_value(kDLFloat, (uint8_t)(half * 8), p + half, &is_float);
        printf("(");
        print_real(real_value(kDLFloat, (uint8_t)(half * 8), p, &is_float));
        if (!(im < 0) && im == im) {
            printf("+");
        }
        print_real(im);
        printf("j)");
    }
    else if (t->dtype.code == kDLInt || t->dtype.code == kDLUInt) {
        /* little-endian host; a padded sub-byte element is the low bits of its byte */
        unsigned bits = t->dtype.bits;
        uint64_t u = 0;
        memcpy(&u, p, bits >= 8 ? bits / 8 : 1);
        if (bits < 64) {
            u &= ((uint64_t)1 << bits) - 1;
        }
        if (t->dtype.code == kDLInt && bits < 64 && (u >> (bits - 1)) & 1) {
            u |= ~(uint64_t)0 << bits; /* sign-extend */
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

/* "NAME [2, 3] float32 ROW_MAJOR, 24 bytes" */
static void print_entry_line(const hry_entry *e)
{
    hry_descriptor d;
    hry_descriptor_init(&d);
    if (hry_entry_descriptor(e, &d, NULL) != HRY_OK) { /* checked at open: cannot happen */
        printf("%s (unreadable descriptor)\n", e->name);
        return;
    }
    printf("%s [", e->name);
    for (uint32_t k = 0; k < d.rank; k++) {
        printf("%s%" PRIu64, k ? ", " : "", d.shape[k]);
    }
    printf("] %s %s, %" PRIu64 " bytes\n", hry_dtype(d.dtype)->name,
           hry_layout_name(d.layout), e->nbytes);
}

int main(int argc, char **argv)
{
    if (argc < 2 || argc > 3) {
        fprintf(stderr, "usage: %s FILE [NAME]\n", argv[0]);
        return 1;
    }
    if (!hry_version_check()) {
        fprintf(stderr, "%s: built against hurray.h %d.%d, but the library linked is %#x\n",
                argv[0], HRY_LIB_VERSION_MAJOR, HRY_LIB_VERSION_MINOR,
                (unsigned)hry_library_version());
        return 2;
    }
    hry_error err;
    hry_file *f;
    if (hry_file_open(argv[1], 0, &f, &err) != HRY_OK) {
        fprintf(stderr, "%s: %s: %s\n", argv[1], err.field, err.message);
        return 2;
    }
    if (argc == 2) { /* no name: list the entries */
        for (uint32_t i = 0; i < hry_file_entry_count(f); i++) {
            print_entry_line(hry_file_entry(f, i));
        }
        if (hry_file_entry_count(f) == 0) {
            printf("(no entries)\n");
        }
        hry_file_close(f);
        return 0;
    }
    const hry_entry *e = hry_file_find(f, argv[2], strlen(argv[2])); /* a hash lookup */
    if (e == NULL) {
        fprintf(stderr, "%s: no entry named '%s'\n", argv[1], argv[2]);
        hry_file_close(f);
        return 2;
    }
    print_entry_line(e);
    DLManagedTensorVersioned *m;
    if (hry_file_to_dlpack(f, e->position, &m, &err) != HRY_OK) {
        fprintf(stderr, "%s: %s: %s\n", argv[1], err.field, err.message);
        hry_file_close(f);
        return 2;
    }
    hry_file_close(f); /* the tensor keeps the mapping alive */
    const DLTensor *t = &m->dl_tensor;
    size_t item = t->dtype.bits >= 8 ? t->dtype.bits / 8 : 1;
    if (t->data == NULL) {
        printf("empty tensor (data = NULL, nothing allocated)\n");
    }
    else if (t->dtype.bits < 8 && !(m->flags & DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED)) {
        printf("packed %u-bit elements (not shown)\n", t->dtype.bits);
    }
    else {
        print_dims(t, 0, t->data, item);
        printf("\n");
    }
    m->deleter(m); /* the last reference: unmaps the file */
    return 0;
}
