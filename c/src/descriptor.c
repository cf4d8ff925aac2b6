/*
 * Descriptors: the element-type table, the data-model rules, and the binary encoding of
 * docs/spec/metadata.md.
 *
 * The rules and the order in which they are checked follow the Python reference
 * (hurray_bridge/wire.py, hurray_bridge/descriptor.py) so that both name the same field for
 * the same defect; tests/c/test_c_library.py compares the two on mutated inputs.
 *
 * This file is self-contained (it needs only hurray.h and internal.h): the Python
 * extension hurray_bridge._speedups (hurray_bridge/_speedups_c/) compiles it too, so there
 * is one copy of the wire rules in C.
 */
#include "internal.h"

#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#define I64_MAX_U 0x7FFFFFFFFFFFFFFFull
#define ENTRY_SIZE 24u

/* ---------------------------------------------------------------------- errors */

hry_status hry__fail(hry_error *err, hry_status status, const char *field, const char *fmt, ...)
{
    if (err != NULL) {
        err->status = status;
        err->os_errno = 0;
        snprintf(err->field, sizeof err->field, "%s", field != NULL ? field : "");
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->message, sizeof err->message, fmt, ap);
        va_end(ap);
    }
    return status;
}

void hry__ok(hry_error *err)
{
    if (err != NULL) {
        err->status = HRY_OK;
        err->os_errno = 0;
        err->field[0] = '\0';
        err->message[0] = '\0';
    }
}

const char *hry_status_name(hry_status status)
{
    switch (status) {
    case HRY_OK: return "ok";
    case HRY_E_FORMAT: return "format error";
    case HRY_E_UNSUPPORTED: return "unsupported";
    case HRY_E_DYNAMIC: return "dynamic shape";
    case HRY_E_IO: return "I/O error";
    case HRY_E_NOMEM: return "out of memory";
    case HRY_E_ARGUMENT: return "invalid argument";
    }
    return "unknown status";
}

uint32_t hry_library_version(void)
{
    return ((uint32_t)HRY_LIB_VERSION_MAJOR << 16) | ((uint32_t)HRY_LIB_VERSION_MINOR << 8) |
           (uint32_t)HRY_LIB_VERSION_PATCH;
}

/* ---------------------------------------------------------------- element types */

#define B HRY_KIND_BOOL
#define I HRY_KIND_INT
#define U HRY_KIND_UINT
#define F HRY_KIND_FLOAT
#define X HRY_KIND_COMPLEX

/* tag, name, bits, kind, tier, has_dlpack, DLPack code, DLPack bits (dtypes.py's table) */
static const hry_dtype_info DTYPES[HRY_LAST_DTYPE + 1] = {
    {0, NULL, 0, B, 0, 0, 0, 0},
    {1, "bool", 1, B, 2, 0, 0, 0},
    {2, "bool8", 8, B, 1, 1, 6, 8},
    {3, "int8", 8, I, 1, 1, 0, 8},
    {4, "int16", 16, I, 1, 1, 0, 16},
    {5, "int32", 32, I, 1, 1, 0, 32},
    {6, "int64", 64, I, 1, 1, 0, 64},
    {7, "uint8", 8, U, 1, 1, 1, 8},
    {8, "uint16", 16, U, 1, 1, 1, 16},
    {9, "uint32", 32, U, 1, 1, 1, 32},
    {10, "uint64", 64, U, 1, 1, 1, 64},
    {11, "float16", 16, F, 1, 1, 2, 16},
    {12, "bfloat16", 16, F, 1, 1, 4, 16},
    {13, "float32", 32, F, 1, 1, 2, 32},
    {14, "float64", 64, F, 1, 1, 2, 64},
    {15, "complex64", 64, X, 1, 1, 5, 64},
    {16, "complex128", 128, X, 1, 1, 5, 128},
    {17, "float8_e4m3fn", 8, F, 2, 1, 10, 8},
    {18, "float8_e5m2", 8, F, 2, 1, 12, 8},
    {19, "float8_e4m3fnuz", 8, F, 2, 1, 11, 8},
    {20, "float8_e5m2fnuz", 8, F, 2, 1, 13, 8},
    {21, "float8_e8m0fnu", 8, F, 2, 1, 14, 8},
    {22, "float4_e2m1fn", 4, F, 2, 1, 17, 4},
    {23, "int4", 4, I, 2, 1, 0, 4},
    {24, "uint4", 4, U, 2, 1, 1, 4},
    {25, "int2", 2, I, 2, 1, 0, 2},
    {26, "uint2", 2, U, 2, 1, 1, 2},
};

#undef B
#undef I
#undef U
#undef F
#undef X

const hry_dtype_info *hry_dtype(unsigned tag)
{
    if (tag == 0 || tag > HRY_LAST_DTYPE) {
        return NULL;
    }
    return &DTYPES[tag];
}

const hry_dtype_info *hry_dtype_by_name(const char *name)
{
    if (name == NULL) {
        return NULL;
    }
    for (unsigned t = 1; t <= HRY_LAST_DTYPE; t++) {
        if (strcmp(DTYPES[t].name, name) == 0) {
            return &DTYPES[t];
        }
    }
    return NULL;
}

static const char *const LAYOUT_NAMES[] = {NULL, "ROW_MAJOR", "STRIDED", "TILED",
                                           "COO", "CSR", "CSC"};
static const char *const ROLE_NAMES[] = {NULL, "DATA", "VALUES", "INDICES",
                                         "INDPTR", "SCALES", "ZERO_POINTS"};

const char *hry_layout_name(unsigned layout)
{
    return layout >= 1 && layout <= 6 ? LAYOUT_NAMES[layout] : NULL;
}

const char *hry_role_name(unsigned role)
{
    return role >= 1 && role <= 6 ? ROLE_NAMES[role] : NULL;
}

static int is_sparse(unsigned layout)
{
    return layout == HRY_COO || layout == HRY_CSR || layout == HRY_CSC;
}

/* Bytes per element in the unpacked form: 1 for sub-byte types. */
static uint64_t itemsize(const hry_dtype_info *t)
{
    return t->bits >= 8 ? (uint64_t)t->bits / 8 : 1;
}

/* ------------------------------------------------------------------- struct_size */

/* The hry_descriptor of 2.0, the first with struct_size: later versions append after shard. */
#define DESCRIPTOR_MIN_SIZE (offsetof(hry_descriptor, shard) + sizeof(((hry_descriptor *)0)->shard))

hry_status hry__struct_size(uint32_t size, size_t min, const char *what, hry_error *err)
{
    if (size < min) {
        return hry__fail(err, HRY_E_ARGUMENT, "struct_size",
                         "%s.struct_size is %u, below %zu, the size of the first %s with "
                         "struct_size (library 2.0): set it to sizeof(%s) before the call%s",
                         what, size, min, what, what,
                         min == DESCRIPTOR_MIN_SIZE ? " (hry_descriptor_init does)" : "");
    }
    return HRY_OK;
}

hry_status hry__desc_in(const hry_descriptor **d, hry_descriptor *local, hry_error *err)
{
    const hry_descriptor *in = *d;
    if (in == NULL || in->struct_size == sizeof *in) { /* NULL: the caller refuses it */
        return HRY_OK;
    }
    hry_status s = hry__struct_size(in->struct_size, DESCRIPTOR_MIN_SIZE, "hry_descriptor", err);
    if (s != HRY_OK) {
        return s;
    }
    /* a newer caller's struct: the fields this library does not know must be unset */
    const uint8_t *bytes = (const uint8_t *)in;
    for (size_t i = sizeof *in; i < in->struct_size; i++) {
        if (bytes[i] != 0) {
            return hry__fail(err, HRY_E_UNSUPPORTED, "struct_size",
                             "hry_descriptor.struct_size is %u and its byte %zu is not zero, "
                             "but this library (version %u.%u.%u) knows only its first %zu "
                             "bytes: the caller sets a field of a later version; link the "
                             "library version it was built against (hry_version_check())",
                             in->struct_size, i, HRY_LIB_VERSION_MAJOR, HRY_LIB_VERSION_MINOR,
                             HRY_LIB_VERSION_PATCH, sizeof *in);
        }
    }
    memset(local, 0, sizeof *local);
    memcpy(local, in, in->struct_size < sizeof *in ? in->struct_size : sizeof *in);
    local->struct_size = (uint32_t)sizeof *local;
    *d = local;
    return HRY_OK;
}

/* An output descriptor: *d itself when its size is this library's, else `local` holding a
 * copy of the caller's fields, to be copied back by desc_out_done. */
static hry_status desc_out(hry_descriptor **d, hry_descriptor *local, hry_error *err)
{
    hry_descriptor *out = *d;
    if (out == NULL || out->struct_size == sizeof *out) {
        return HRY_OK;
    }
    hry_status s = hry__struct_size(out->struct_size, DESCRIPTOR_MIN_SIZE, "hry_descriptor",
                                    err);
    if (s != HRY_OK) {
        return s;
    }
    memset(local, 0, sizeof *local);
    memcpy(local, out, out->struct_size < sizeof *out ? out->struct_size : sizeof *out);
    local->struct_size = (uint32_t)sizeof *local;
    *d = local;
    return HRY_OK;
}

/* What the caller's struct_size covers of `local`; fields it has and this library does not
 * know read as zero (absent). */
static void desc_out_done(hry_descriptor *out, const hry_descriptor *local)
{
    uint32_t size = out->struct_size;
    memcpy(out, local, size < sizeof *local ? size : sizeof *local);
    if (size > sizeof *local) {
        memset((uint8_t *)out + sizeof *local, 0, size - sizeof *local);
    }
    out->struct_size = size;
}

/* ------------------------------------------------------------------- basics */

int hry_descriptor_is_dynamic(const hry_descriptor *d)
{
    hry_descriptor local;
    if (hry__desc_in(&d, &local, NULL) != HRY_OK) {
        return 0;
    }
    for (uint32_t i = 0; i < d->rank && i < HRY_MAX_RANK; i++) {
        if (d->shape[i] == HRY_DYNAMIC) {
            return 1;
        }
    }
    return 0;
}

int hry_descriptor_is_empty(const hry_descriptor *d)
{
    hry_descriptor local;
    if (hry__desc_in(&d, &local, NULL) != HRY_OK) {
        return 0;
    }
    for (uint32_t i = 0; i < d->rank && i < HRY_MAX_RANK; i++) {
        if (d->shape[i] == 0) {
            return 1;
        }
    }
    return 0;
}

uint16_t hry_descriptor_flags(const hry_descriptor *d)
{
    hry_descriptor local;
    if (hry__desc_in(&d, &local, NULL) != HRY_OK) {
        return 0;
    }
    uint16_t f = 0;
    if (d->has_quantization) {
        f |= HRY_FLAG_HAS_QUANTIZATION;
    }
    if (d->has_shard) {
        f |= HRY_FLAG_HAS_SHARD;
    }
    if (d->padded) {
        f |= HRY_FLAG_SUBBYTE_PADDED;
    }
    return f;
}

int hry_descriptor_equal(const hry_descriptor *a, const hry_descriptor *b)
{
    hry_descriptor local_a, local_b;
    if (hry__desc_in(&a, &local_a, NULL) != HRY_OK || hry__desc_in(&b, &local_b, NULL) != HRY_OK) {
        return 0;
    }
    if (a->rank != b->rank || a->rank > HRY_MAX_RANK || a->dtype != b->dtype ||
        a->layout != b->layout || !a->padded != !b->padded ||
        !a->has_quantization != !b->has_quantization || !a->has_shard != !b->has_shard) {
        return 0;
    }
    size_t r = a->rank;
    if (memcmp(a->shape, b->shape, r * sizeof a->shape[0]) != 0) {
        return 0;
    }
    if (a->layout == HRY_STRIDED && memcmp(a->strides, b->strides, r * sizeof a->strides[0])) {
        return 0;
    }
    if (a->layout == HRY_TILED &&
        (a->n_tile != b->n_tile || a->n_tile > HRY_MAX_RANK ||
         memcmp(a->tile, b->tile, a->n_tile * sizeof a->tile[0]) != 0)) {
        return 0;
    }
    if (is_sparse(a->layout) &&
        (a->sparse.nnz != b->sparse.nnz || a->sparse.index_type != b->sparse.index_type ||
         !a->sparse.canonical != !b->sparse.canonical)) {
        return 0;
    }
    if (a->has_quantization &&
        (a->quant.scheme != b->quant.scheme || a->quant.scale_type != b->quant.scale_type ||
         a->quant.zero_point_type != b->quant.zero_point_type ||
         a->quant.axis != b->quant.axis || a->quant.block_size != b->quant.block_size)) {
        return 0;
    }
    if (a->has_shard &&
        (a->shard.replica_id != b->shard.replica_id ||
         a->shard.device_type != b->shard.device_type ||
         a->shard.device_id != b->shard.device_id ||
         memcmp(a->shard.offsets, b->shard.offsets, r * sizeof a->shard.offsets[0]) != 0 ||
         memcmp(a->shard.global_shape, b->shard.global_shape,
                r * sizeof a->shard.global_shape[0]) != 0)) {
        return 0;
    }
    return 1;
}

/* The product of n values; 0 when one is 0 (whatever the others: an empty tensor never
 * overflows). Returns 1 on overflow. */
static int checked_product(const uint64_t *v, uint32_t n, uint64_t *out)
{
    for (uint32_t i = 0; i < n; i++) {
        if (v[i] == 0) {
            *out = 0;
            return 0;
        }
    }
    uint64_t p = 1;
    for (uint32_t i = 0; i < n; i++) {
        if (hry__mul(p, v[i], &p)) {
            return 1;
        }
    }
    *out = p;
    return 0;
}

static uint64_t magnitude(int64_t s)
{
    return s < 0 ? (uint64_t)0 - (uint64_t)s : (uint64_t)s;
}

/* 1 + sum (d - 1) |s|, for a non-empty strided shape. Returns 1 when it exceeds 2^63 - 1. */
static int strided_span(const hry_descriptor *d, uint64_t *out)
{
    uint64_t span = 1;
    for (uint32_t i = 0; i < d->rank; i++) {
        uint64_t term;
        if (hry__mul(d->shape[i] - 1, magnitude(d->strides[i]), &term) ||
            hry__add(span, term, &span) || span > I64_MAX_U) {
            return 1;
        }
    }
    *out = span;
    return 0;
}

/* Bytes that `count` elements of t take: packed (LSB-first, rounded up to whole bytes)
 * for sub-byte types unless padded. Returns 1 on overflow. */
static int bytes_for(uint64_t count, const hry_dtype_info *t, int padded, uint64_t *out)
{
    if (t->bits < 8 && !padded) {
        /* ceil(count * bits / 8) without forming count * bits */
        *out = (count / 8) * t->bits + ((count % 8) * t->bits + 7) / 8;
        return 0;
    }
    return hry__mul(count, itemsize(t), out);
}

/* Elements the primary buffer holds (the span for strided, padding for tiled, nnz for
 * sparse); 1 on overflow. The shape is static. */
static int data_elements(const hry_descriptor *d, uint64_t *out)
{
    uint64_t n;
    if (checked_product(d->shape, d->rank, &n)) {
        return 1;
    }
    if (n == 0) {
        *out = 0;
        return 0;
    }
    switch (d->layout) {
    case HRY_STRIDED:
        return strided_span(d, out);
    case HRY_TILED: {
        uint64_t p = 1;
        uint32_t k = d->n_tile, outer = d->rank - k;
        for (uint32_t i = 0; i < d->rank; i++) {
            uint64_t v = d->shape[i];
            if (i >= outer) {
                uint64_t t = d->tile[i - outer];
                uint64_t q = v / t + (v % t != 0);
                if (hry__mul(q, t, &v)) {
                    return 1;
                }
            }
            if (hry__mul(p, v, &p)) {
                return 1;
            }
        }
        *out = p;
        return 0;
    }
    case HRY_COO:
    case HRY_CSR:
    case HRY_CSC:
        *out = d->sparse.nnz;
        return 0;
    default:
        *out = n;
        return 0;
    }
}

unsigned hry__trailing_bits(const hry_descriptor *d)
{
    const hry_dtype_info *t = hry_dtype(d->dtype);
    uint64_t n;
    if (t == NULL || t->bits >= 8 || d->padded || data_elements(d, &n)) {
        return 0;
    }
    /* (n * bits) mod 8 without forming n * bits: bits is 1, 2 or 4 */
    unsigned used = (unsigned)((n % 8) * t->bits % 8);
    return used ? 8 - used : 0;
}

/* The buffer layout of a static descriptor whose sections are valid. Returns 1 when a
 * length overflows 64 bits (the caller reports field "shape"). */
static int layout_of(const hry_descriptor *d, hry_buffer_spec *specs, uint32_t *count)
{
    const hry_dtype_info *t = hry_dtype(d->dtype);
    uint64_t elems, primary;
    uint32_t n = 0;
    if (data_elements(d, &elems) || bytes_for(elems, t, d->padded, &primary)) {
        return 1;
    }
    if (is_sparse(d->layout)) {
        uint64_t isz = itemsize(hry_dtype(d->sparse.index_type)), v;
        specs[n++] = (hry_buffer_spec){HRY_ROLE_VALUES, primary};
        if (d->layout == HRY_COO) {
            if (hry__mul(d->rank, d->sparse.nnz, &v) || hry__mul(v, isz, &v)) {
                return 1;
            }
            specs[n++] = (hry_buffer_spec){HRY_ROLE_INDICES, v};
        }
        else {
            uint64_t outer = d->layout == HRY_CSR ? d->shape[0] : d->shape[1];
            if (hry__add(outer, 1, &v) || hry__mul(v, isz, &v)) {
                return 1;
            }
            specs[n++] = (hry_buffer_spec){HRY_ROLE_INDPTR, v};
            if (hry__mul(d->sparse.nnz, isz, &v)) {
                return 1;
            }
            specs[n++] = (hry_buffer_spec){HRY_ROLE_INDICES, v};
        }
    }
    else {
        specs[n++] = (hry_buffer_spec){HRY_ROLE_DATA, primary};
    }
    if (d->has_quantization) {
        uint64_t scales = 1, v;
        if (d->quant.scheme == HRY_PER_AXIS) {
            scales = d->shape[d->quant.axis];
        }
        else if (d->quant.scheme == HRY_PER_BLOCK) {
            uint64_t dims[HRY_MAX_RANK];
            memcpy(dims, d->shape, d->rank * sizeof dims[0]);
            uint64_t a = dims[d->quant.axis], bs = d->quant.block_size;
            dims[d->quant.axis] = a / bs + (a % bs != 0);
            if (checked_product(dims, d->rank, &scales)) {
                return 1;
            }
        }
        if (hry__mul(scales, itemsize(hry_dtype(d->quant.scale_type)), &v)) {
            return 1;
        }
        specs[n++] = (hry_buffer_spec){HRY_ROLE_SCALES, v};
        if (d->quant.zero_point_type != 0) {
            if (hry__mul(scales, itemsize(hry_dtype(d->quant.zero_point_type)), &v)) {
                return 1;
            }
            specs[n++] = (hry_buffer_spec){HRY_ROLE_ZERO_POINTS, v};
        }
    }
    *count = n;
    return 0;
}

/* ------------------------------------------------------------- section rules */

/* Sparse(): nnz range and index type (the tag is known). */
static hry_status check_sparse(const hry_descriptor *d, hry_error *err)
{
    if (d->sparse.nnz == UINT64_MAX) {
        return hry__fail(err, HRY_E_FORMAT, "sparse.nnz",
                         "nnz = %llu is out of range [0, 2**64 - 2]",
                         (unsigned long long)d->sparse.nnz);
    }
    const hry_dtype_info *it = hry_dtype(d->sparse.index_type);
    if ((it->kind != HRY_KIND_INT && it->kind != HRY_KIND_UINT) || it->bits < 8) {
        return hry__fail(err, HRY_E_FORMAT, "sparse.index_dtype",
                         "sparse index type must be an integer type of 8 bits or more "
                         "(int8 ... uint64), got %s", it->name);
    }
    return HRY_OK;
}

/* The largest value an integer index type holds. */
static uint64_t index_max(const hry_dtype_info *it)
{
    uint64_t top = it->bits >= 64 ? UINT64_MAX : (UINT64_C(1) << it->bits) - 1;
    return it->kind == HRY_KIND_INT ? top >> 1 : top;
}

/* The index type holds every value an index buffer may contain (memory-layout.md 5.1):
 * INDPTR (CSR/CSC) ends at nnz, and an index of a dimension of size n reaches n - 1. The
 * decoder never sees the indices, so this is all it can check; without it an int8 CSR
 * with nnz = 200 is read back with INDPTR wrapped to -56. nnz = 0 stores no index, and a
 * dynamic dimension is checked when it is resolved. */
static hry_status check_index_range(const hry_descriptor *d, hry_error *err)
{
    if (d->sparse.nnz == 0) {
        return HRY_OK;
    }
    const hry_dtype_info *it = hry_dtype(d->sparse.index_type);
    uint64_t top = index_max(it), need = 0;
    int dim = -1;
    if (d->layout != HRY_COO && d->sparse.nnz > top) {
        need = d->sparse.nnz;
    } else {
        uint32_t lo = d->layout == HRY_CSC ? 0 : d->layout == HRY_CSR ? 1 : 0;
        uint32_t hi = d->layout == HRY_COO ? d->rank : lo + 1;
        for (uint32_t j = lo; j < hi && dim < 0; j++) {
            if (d->shape[j] != HRY_DYNAMIC && d->shape[j] - 1 > top) {
                dim = (int)j;
                need = d->shape[j] - 1;
            }
        }
        if (dim < 0) {
            return HRY_OK;
        }
    }
    const char *wide = need <= INT16_MAX ? "int16" : need <= INT32_MAX ? "int32"
                     : need <= INT64_MAX ? "int64" : "uint64";
    if (dim < 0) {
        return hry__fail(err, HRY_E_FORMAT, "sparse.index_dtype",
                         "%s index type %s holds values up to %llu, but nnz = %llu (the last "
                         "INDPTR entry); use a wider index type (%s or wider)",
                         LAYOUT_NAMES[d->layout], it->name, (unsigned long long)top,
                         (unsigned long long)need, wide);
    }
    return hry__fail(err, HRY_E_FORMAT, "sparse.index_dtype",
                     "%s index type %s holds values up to %llu, but dimension %d has size "
                     "%llu, so an index up to %llu; use a wider index type (%s or wider)",
                     LAYOUT_NAMES[d->layout], it->name, (unsigned long long)top, dim,
                     (unsigned long long)d->shape[dim], (unsigned long long)need, wide);
}

/* Quantization(): scale and zero-point kinds, axis and block presence (tags are known). */
static hry_status check_quant(const hry_descriptor *d, hry_error *err)
{
    const hry_dtype_info *st = hry_dtype(d->quant.scale_type);
    if (st->kind != HRY_KIND_FLOAT || st->bits < 8) {
        return hry__fail(err, HRY_E_FORMAT, "quantization.scale_dtype",
                         "scale type must be a float type of 8 bits or more, got %s", st->name);
    }
    if (d->quant.zero_point_type != 0) {
        const hry_dtype_info *zt = hry_dtype(d->quant.zero_point_type);
        if ((zt->kind != HRY_KIND_INT && zt->kind != HRY_KIND_UINT &&
             zt->kind != HRY_KIND_FLOAT) || zt->bits < 8) {
            return hry__fail(err, HRY_E_FORMAT, "quantization.zero_point_dtype",
                             "zero-point type must be an integer or float type of 8 bits "
                             "or more, got %s", zt->name);
        }
    }
    if (d->quant.scheme == HRY_PER_TENSOR) {
        if (d->quant.axis != -1 || d->quant.block_size != 0) {
            return hry__fail(err, HRY_E_FORMAT, "quantization.axis",
                             "a per-tensor scheme takes neither axis nor block_size "
                             "(axis must be -1 and block_size 0, got %ld and %llu)",
                             (long)d->quant.axis, (unsigned long long)d->quant.block_size);
        }
    }
    else if (d->quant.scheme == HRY_PER_BLOCK) {
        if (d->quant.block_size == 0 || d->quant.block_size == UINT64_MAX) {
            return hry__fail(err, HRY_E_FORMAT, "quantization.block_size",
                             "per-block quantization needs a block_size in [1, 2**64 - 2], "
                             "got %llu", (unsigned long long)d->quant.block_size);
        }
    }
    else if (d->quant.block_size != 0) {
        return hry__fail(err, HRY_E_FORMAT, "quantization.block_size",
                         "only per-block quantization takes a block_size (got %llu; write 0)",
                         (unsigned long long)d->quant.block_size);
    }
    return HRY_OK;
}

/* Shard(): no dynamic dimension, device fields in range. */
static hry_status check_shard(const hry_descriptor *d, hry_error *err)
{
    for (uint32_t i = 0; i < d->rank; i++) {
        if (d->shard.global_shape[i] == HRY_DYNAMIC || d->shard.offsets[i] == HRY_DYNAMIC) {
            return hry__fail(err, HRY_E_FORMAT, "shard.global_shape",
                             "shard descriptors must not use dynamic dimensions "
                             "(dimension %u of the offsets or the global shape is DYNAMIC)", i);
        }
    }
    if (d->shard.device_type < 0) {
        return hry__fail(err, HRY_E_FORMAT, "shard.device_type",
                         "device_type must be an integer in [0, 2147483647], got %ld",
                         (long)d->shard.device_type);
    }
    if (d->shard.device_id < 0) {
        return hry__fail(err, HRY_E_FORMAT, "shard.device_id",
                         "device_id must be an integer in [0, 2147483647], got %ld",
                         (long)d->shard.device_id);
    }
    return HRY_OK;
}

/* Descriptor.__post_init__'s rules, in its order (the sections' own rules passed). For a
 * static descriptor, specs/count (when not NULL) receive its buffer layout. */
static hry_status check_core(const hry_descriptor *d, hry_error *err, hry_buffer_spec *specs,
                             uint32_t *count)
{
    const hry_dtype_info *t = hry_dtype(d->dtype);
    uint32_t rank = d->rank;
    int dynamic = hry_descriptor_is_dynamic(d);
    int subbyte = t->bits < 8;

    if (d->padded && !subbyte) {
        return hry__fail(err, HRY_E_FORMAT, "flags",
                         "the padded form (SUBBYTE_PADDED) applies to sub-byte types only, "
                         "not %s", t->name);
    }
    if (rank == 0 && d->layout != HRY_ROW_MAJOR) {
        return hry__fail(err, HRY_E_FORMAT, "layout",
                         "a scalar (rank 0) must be row-major, not %s",
                         LAYOUT_NAMES[d->layout]);
    }
    if (d->layout == HRY_STRIDED) {
        if (dynamic) {
            return hry__fail(err, HRY_E_FORMAT, "strides",
                             "the strided layout needs a static shape (a dimension is DYNAMIC)");
        }
        for (uint32_t i = 0; i < rank; i++) {
            if (d->strides[i] == INT64_MIN) {
                return hry__fail(err, HRY_E_FORMAT, "strides",
                                 "strides[%u] = -2**63 is outside [-(2**63 - 1), 2**63 - 1]",
                                 i);
            }
        }
        if (subbyte && !d->padded) {
            return hry__fail(err, HRY_E_FORMAT, "strides",
                             "packed %s cannot be strided (elements are not byte-addressable); "
                             "use the padded form", t->name);
        }
    }
    if (d->layout == HRY_TILED) {
        int bad = d->n_tile < 1 || d->n_tile > rank;
        for (uint32_t i = 0; !bad && i < d->n_tile; i++) {
            bad = d->tile[i] == 0 || d->tile[i] == HRY_DYNAMIC;
        }
        if (bad) {
            return hry__fail(err, HRY_E_FORMAT, "tile",
                             "a tiled layout needs 1..%u positive static tile sizes for the "
                             "innermost dimensions (got %u)", rank, d->n_tile);
        }
    }
    if (is_sparse(d->layout)) {
        if ((d->layout == HRY_CSR || d->layout == HRY_CSC) && rank != 2) {
            return hry__fail(err, HRY_E_FORMAT, "layout", "%s needs rank 2, got rank %u",
                             LAYOUT_NAMES[d->layout], rank);
        }
        /* an empty shape has no index to store an entry at (ADR-007 section 6) */
        for (uint32_t i = 0; d->sparse.nnz && i < rank; i++) {
            if (d->shape[i] == 0) {
                return hry__fail(err, HRY_E_FORMAT, "sparse.nnz",
                                 "%s shape is empty (dimension %u has size 0, so no index), "
                                 "so it can store no entries: nnz must be 0, got nnz = %llu",
                                 LAYOUT_NAMES[d->layout], i,
                                 (unsigned long long)d->sparse.nnz);
            }
        }
        if (d->sparse.canonical && !dynamic) {
            uint64_t cells;
            if (checked_product(d->shape, rank, &cells)) {
                return hry__fail(err, HRY_E_FORMAT, "shape",
                                 "element count overflows 64 bits; the tensor is larger than "
                                 "any buffer can be");
            }
            if (d->sparse.nnz > cells) {
                return hry__fail(err, HRY_E_FORMAT, "sparse.nnz",
                                 "canonical (duplicate-free) %s has nnz %llu but the shape "
                                 "holds only %llu elements", LAYOUT_NAMES[d->layout],
                                 (unsigned long long)d->sparse.nnz, (unsigned long long)cells);
            }
        }
        hry_status s = check_index_range(d, err);
        if (s != HRY_OK) {
            return s;
        }
    }
    if (d->has_quantization) {
        int storable = t->kind == HRY_KIND_INT || t->kind == HRY_KIND_UINT ||
                       (t->kind == HRY_KIND_FLOAT && t->bits <= 8 &&
                        d->dtype != HRY_FLOAT8_E8M0FNU);
        if (!storable) {
            return hry__fail(err, HRY_E_FORMAT, "quantization",
                             "quantized storage must be an integer, float8 or float4 type, "
                             "not %s", t->name);
        }
        if (d->quant.scheme != HRY_PER_TENSOR) {
            if (d->quant.axis < 0 || (uint32_t)d->quant.axis >= rank) {
                return hry__fail(err, HRY_E_FORMAT, "quantization.axis",
                                 "quantization axis %ld is out of range for rank %u",
                                 (long)d->quant.axis, rank);
            }
            if (d->shape[d->quant.axis] == HRY_DYNAMIC) {
                return hry__fail(err, HRY_E_FORMAT, "quantization.axis",
                                 "quantization axis %ld is dynamic; its size must be static",
                                 (long)d->quant.axis);
            }
        }
    }
    if (d->has_shard) {
        if (dynamic) {
            return hry__fail(err, HRY_E_FORMAT, "shape",
                             "a shard descriptor must not have dynamic dimensions");
        }
        for (uint32_t i = 0; i < rank; i++) {
            uint64_t o = d->shard.offsets[i], n = d->shape[i], g = d->shard.global_shape[i];
            if (o > g || n > g - o) {
                return hry__fail(err, HRY_E_FORMAT, "shard.offsets",
                                 "shard box dimension %u starts at %llu with size %llu, outside "
                                 "the global size %llu", i, (unsigned long long)o,
                                 (unsigned long long)n, (unsigned long long)g);
            }
        }
    }
    if (!dynamic) {
        /* _check_sizes: every size fits in 64 bits (so later computations need no check) */
        uint64_t n, span;
        if (checked_product(d->shape, rank, &n)) {
            return hry__fail(err, HRY_E_FORMAT, "shape",
                             "element count overflows 64 bits; the tensor is larger than any "
                             "buffer can be");
        }
        if (d->layout == HRY_STRIDED && n != 0 && strided_span(d, &span)) {
            return hry__fail(err, HRY_E_FORMAT, "strides",
                             "the strided span (1 + sum (d - 1) |s|) overflows int64");
        }
        hry_buffer_spec local[HRY_MAX_BUFFERS];
        uint32_t n_local;
        if (specs == NULL) {
            specs = local;
            count = &n_local;
        }
        uint64_t sum = 0;
        int over = layout_of(d, specs, count);
        for (uint32_t i = 0; !over && i < *count; i++) {
            over = hry__add(sum, specs[i].length, &sum);
        }
        if (over) {
            return hry__fail(err, HRY_E_FORMAT, "shape",
                             "the tensor's buffers need more than 2**64 - 1 bytes");
        }
    }
    return HRY_OK;
}

hry_status hry_descriptor_check(const hry_descriptor *d, hry_error *err)
{
    hry_descriptor local;
    if (d == NULL) {
        return hry__fail(err, HRY_E_ARGUMENT, "", "descriptor is NULL");
    }
    hry_status sz = hry__desc_in(&d, &local, err);
    if (sz != HRY_OK) {
        return sz;
    }
    if (d->rank > HRY_MAX_RANK) {
        return hry__fail(err, HRY_E_FORMAT, "rank",
                         "rank %u exceeds the maximum rank 64 (ADR-008)", d->rank);
    }
    if (hry_dtype(d->dtype) == NULL) {
        return hry__fail(err, HRY_E_FORMAT, "type_tag", "unknown element type tag %u",
                         d->dtype);
    }
    if (hry_layout_name(d->layout) == NULL) {
        return hry__fail(err, HRY_E_FORMAT, "layout", "unknown layout tag %u", d->layout);
    }
    if (d->padded > 1 || d->has_quantization > 1 || d->has_shard > 1 ||
        (is_sparse(d->layout) && d->sparse.canonical > 1)) {
        return hry__fail(err, HRY_E_ARGUMENT, "flags",
                         "padded, has_quantization, has_shard and sparse.canonical are 0 or 1");
    }
    if (d->layout == HRY_TILED && d->n_tile > d->rank) {
        return hry__fail(err, HRY_E_FORMAT, "tile", "%u tile sizes for rank %u", d->n_tile,
                         d->rank);
    }
    hry_status s;
    if (is_sparse(d->layout)) {
        if (hry_dtype(d->sparse.index_type) == NULL) {
            return hry__fail(err, HRY_E_FORMAT, "sparse.index_type",
                             "unknown element type tag %u", d->sparse.index_type);
        }
        if ((s = check_sparse(d, err)) != HRY_OK) {
            return s;
        }
    }
    if (d->has_quantization) {
        if (d->quant.scheme < 1 || d->quant.scheme > 3) {
            return hry__fail(err, HRY_E_FORMAT, "quantization.scheme",
                             "unknown quantization scheme %u (1 per-tensor, 2 per-axis, "
                             "3 per-block)", d->quant.scheme);
        }
        if (hry_dtype(d->quant.scale_type) == NULL) {
            return hry__fail(err, HRY_E_FORMAT, "quantization.scale_type",
                             "unknown element type tag %u", d->quant.scale_type);
        }
        if (d->quant.zero_point_type != 0 && hry_dtype(d->quant.zero_point_type) == NULL) {
            return hry__fail(err, HRY_E_FORMAT, "quantization.zero_point_type",
                             "unknown element type tag %u", d->quant.zero_point_type);
        }
        if ((s = check_quant(d, err)) != HRY_OK) {
            return s;
        }
    }
    if (d->has_shard && (s = check_shard(d, err)) != HRY_OK) {
        return s;
    }
    if ((s = check_core(d, err, NULL, NULL)) != HRY_OK) {
        return s;
    }
    hry__ok(err);
    return HRY_OK;
}

/* ---------------------------------------------------------------- sizes (public) */

static hry_status require_static(const hry_descriptor *d, const char *what, hry_error *err)
{
    if (hry_descriptor_is_dynamic(d)) {
        return hry__fail(err, HRY_E_DYNAMIC, "shape",
                         "cannot compute %s: a dimension is dynamic; resolve it first", what);
    }
    return HRY_OK;
}

hry_status hry_descriptor_element_count(const hry_descriptor *d, uint64_t *count,
                                        hry_error *err)
{
    hry_descriptor local;
    hry_status sz = hry__desc_in(&d, &local, err);
    if (sz != HRY_OK) {
        return sz;
    }
    hry_status s = hry_descriptor_check(d, err);
    if (s != HRY_OK || (s = require_static(d, "the element count", err)) != HRY_OK) {
        return s;
    }
    checked_product(d->shape, d->rank, count); /* cannot overflow: checked above */
    return HRY_OK;
}

hry_status hry_descriptor_buffer_layout(const hry_descriptor *d, hry_buffer_spec out[HRY_MAX_BUFFERS],
                                        uint32_t *count, hry_error *err)
{
    hry_descriptor local;
    hry_status sz = hry__desc_in(&d, &local, err);
    if (sz != HRY_OK) {
        return sz;
    }
    hry_status s = hry_descriptor_check(d, err);
    if (s != HRY_OK || (s = require_static(d, "the buffer layout", err)) != HRY_OK) {
        return s;
    }
    layout_of(d, out, count);
    return HRY_OK;
}

hry_status hry_descriptor_nbytes(const hry_descriptor *d, uint64_t *nbytes, hry_error *err)
{
    hry_buffer_spec specs[HRY_MAX_BUFFERS];
    uint32_t n;
    hry_status s = hry_descriptor_buffer_layout(d, specs, &n, err);
    if (s == HRY_OK) {
        *nbytes = specs[0].length;
    }
    return s;
}

void hry_canonical_offsets(const uint64_t *lengths, uint32_t n, uint64_t *offsets)
{
    uint64_t pos = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (lengths[i] == 0) {
            offsets[i] = 0;
            continue;
        }
        offsets[i] = pos;
        pos += lengths[i];
        pos = (pos + (HRY_ALIGNMENT - 1)) & ~(uint64_t)(HRY_ALIGNMENT - 1);
    }
}

/* ---------------------------------------------------------------- buffer table */

/* _check_buffer_table: metadata.md §8 rules 1-5 for a decoded (or to-be-encoded) table. */
static hry_status check_table(const hry_descriptor *d, const hry_buffer_table *tab,
                              const hry_buffer_spec *specs, uint32_t n, hry_error *err)
{
    char field[48];
    if (hry_descriptor_is_dynamic(d)) {
        if (tab->count != 0) {
            return hry__fail(err, HRY_E_FORMAT, "n_buffers",
                             "a descriptor with dynamic dimensions has no buffer table "
                             "(n_buffers must be 0, got %u)", tab->count);
        }
        return HRY_OK;
    }
    if (tab->count != n) {
        return hry__fail(err, HRY_E_FORMAT, "n_buffers",
                         "%u buffers, the descriptor calls for %u", tab->count, n);
    }
    /* spans of the non-empty buffers, sorted by (offset, end, index) */
    uint32_t order[HRY_MAX_BUFFERS], m = 0;
    for (uint32_t i = 0; i < n; i++) {
        const hry_buffer_entry *e = &tab->entry[i];
        if (e->role != specs[i].role) {
            snprintf(field, sizeof field, "buffers[%u].role", i);
            return hry__fail(err, HRY_E_FORMAT, field, "role %s, expected %s",
                             hry_role_name(e->role) ? hry_role_name(e->role) : "?",
                             ROLE_NAMES[specs[i].role]);
        }
        if (e->length != specs[i].length) {
            snprintf(field, sizeof field, "buffers[%u].length", i);
            return hry__fail(err, HRY_E_FORMAT, field,
                             "%s length %llu disagrees with the %llu bytes the descriptor "
                             "implies", ROLE_NAMES[specs[i].role],
                             (unsigned long long)e->length, (unsigned long long)specs[i].length);
        }
        if (e->length == 0) {
            continue; /* never dereferenced: its offset means nothing */
        }
        if (e->offset % HRY_ALIGNMENT) {
            snprintf(field, sizeof field, "buffers[%u].offset", i);
            return hry__fail(err, HRY_E_FORMAT, field, "offset %llu is not a multiple of 64",
                             (unsigned long long)e->offset);
        }
        if (e->length > UINT64_MAX - e->offset) {
            snprintf(field, sizeof field, "buffers[%u].offset", i);
            return hry__fail(err, HRY_E_FORMAT, field, "offset + length overflows 64 bits");
        }
        /* insertion sort by (offset, end, index) */
        uint32_t k = m++;
        while (k > 0) {
            const hry_buffer_entry *p = &tab->entry[order[k - 1]];
            if (p->offset < e->offset ||
                (p->offset == e->offset && p->offset + p->length <= e->offset + e->length)) {
                break;
            }
            order[k] = order[k - 1];
            k--;
        }
        order[k] = i;
    }
    for (uint32_t k = 1; k < m; k++) {
        const hry_buffer_entry *a = &tab->entry[order[k - 1]], *b = &tab->entry[order[k]];
        if (b->offset < a->offset + a->length) {
            snprintf(field, sizeof field, "buffers[%u].offset", order[k]);
            return hry__fail(err, HRY_E_FORMAT, field, "buffers[%u] overlaps buffers[%u]",
                             order[k], order[k - 1]);
        }
    }
    return HRY_OK;
}

/* ---------------------------------------------------------------- decoding */

typedef struct reader {
    const uint8_t *b;
    uint64_t pos, end;
} reader;

/* The bytes [pos, pos + n) of the descriptor, or NULL after reporting truncation. */
static const uint8_t *take(reader *r, uint64_t n, const char *field, hry_error *err)
{
    if (n > r->end - r->pos) {
        hry__fail(err, HRY_E_FORMAT, field, "truncated: needs %llu bytes at offset %llu, "
                  "%llu remain", (unsigned long long)n, (unsigned long long)r->pos,
                  (unsigned long long)(r->end - r->pos));
        return NULL;
    }
    const uint8_t *p = r->b + r->pos;
    r->pos += n;
    return p;
}

static int all_zero(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (p[i]) {
            return 0;
        }
    }
    return 1;
}

static hry_status decode_prefix(const void *data, size_t len, hry_descriptor *out,
                                hry_buffer_table *table, size_t *size, uint8_t *version_minor,
                                hry_error *err);

hry_status hry_decode_prefix(const void *data, size_t len, hry_descriptor *out,
                             hry_buffer_table *table, size_t *size, uint8_t *version_minor,
                             hry_error *err)
{
    hry_descriptor local, *target = out;
    hry_status s = desc_out(&target, &local, err);
    if (s != HRY_OK) {
        return s;
    }
    s = decode_prefix(data, len, target, table, size, version_minor, err);
    if (s == HRY_OK && target != out) {
        desc_out_done(out, target);
    }
    return s;
}

static hry_status decode_prefix(const void *data, size_t len, hry_descriptor *out,
                                hry_buffer_table *table, size_t *size, uint8_t *version_minor,
                                hry_error *err)
{
    const uint8_t *b = data;
    hry_buffer_table local_table;
    hry_status s;
    if (out == NULL || (b == NULL && len != 0)) {
        return hry__fail(err, HRY_E_ARGUMENT, "input", "data or out is NULL");
    }
    if (table == NULL) {
        table = &local_table;
    }
    if (len < HRY_HEADER_SIZE) {
        return hry__fail(err, HRY_E_FORMAT, "header",
                         "truncated: %zu bytes, the header alone needs 32", len);
    }
    if (memcmp(b, "HRYD", 4) != 0) {
        return hry__fail(err, HRY_E_FORMAT, "magic",
                         "bad magic %02x %02x %02x %02x, expected 'HRYD' (48 52 59 44)", b[0],
                         b[1], b[2], b[3]);
    }
    if (b[4] != HRY_WIRE_VERSION_MAJOR) {
        return hry__fail(err, HRY_E_FORMAT, "version",
                         "unsupported major version %u.%u; this reader supports 1.x", b[4], b[5]);
    }
    uint16_t flags = hry__le16(b + 6);
    uint32_t rank = hry__le32(b + 8);
    uint8_t tag = b[12], layout = b[13];
    uint16_t n_buf = hry__le16(b + 14);
    uint64_t total = hry__le64(b + 16);
    if (hry__le64(b + 24) != 0) {
        return hry__fail(err, HRY_E_FORMAT, "header.reserved",
                         "reserved header bytes (offset 24) must be zero");
    }
    if (flags & ~(HRY_FLAG_HAS_QUANTIZATION | HRY_FLAG_HAS_SHARD | HRY_FLAG_SUBBYTE_PADDED)) {
        return hry__fail(err, HRY_E_FORMAT, "flags", "unknown flag bits 0x%04x",
                         flags & ~7u);
    }
    if (rank > HRY_MAX_RANK) {
        return hry__fail(err, HRY_E_FORMAT, "rank",
                         "rank %u exceeds the maximum rank 64 (ADR-008)", rank);
    }
    if (n_buf > HRY_MAX_WIRE_BUFFERS) {
        return hry__fail(err, HRY_E_FORMAT, "n_buffers",
                         "%u buffers; a descriptor has at most 8", n_buf);
    }
    if (total > len) {
        return hry__fail(err, HRY_E_FORMAT, "total_size",
                         "truncated: declares %llu bytes, %zu available",
                         (unsigned long long)total, len);
    }
    if (total < HRY_HEADER_SIZE) {
        return hry__fail(err, HRY_E_FORMAT, "total_size",
                         "declared size %llu is smaller than the 32-byte header",
                         (unsigned long long)total);
    }
    if (hry_dtype(tag) == NULL) {
        return hry__fail(err, HRY_E_FORMAT, "type_tag", "unknown element type tag %u", tag);
    }
    if (hry_layout_name(layout) == NULL) {
        return hry__fail(err, HRY_E_FORMAT, "layout", "unknown layout tag %u", layout);
    }

    hry_descriptor *d = out;
    d->rank = rank;
    d->dtype = tag;
    d->layout = layout;
    d->padded = (flags & HRY_FLAG_SUBBYTE_PADDED) != 0;
    d->has_quantization = (flags & HRY_FLAG_HAS_QUANTIZATION) != 0;
    d->has_shard = (flags & HRY_FLAG_HAS_SHARD) != 0;
    d->n_tile = 0;
    memset(&d->sparse, 0, sizeof d->sparse);
    memset(&d->quant, 0, sizeof d->quant);
    d->shard.replica_id = 0;
    d->shard.device_type = 0;
    d->shard.device_id = 0;

    reader r = {b, HRY_HEADER_SIZE, total};
    const uint8_t *p;
    if ((p = take(&r, 8ull * rank, "shape", err)) == NULL) {
        return HRY_E_FORMAT;
    }
    for (uint32_t i = 0; i < rank; i++) {
        d->shape[i] = hry__le64(p + 8 * i);
    }
    if (layout == HRY_STRIDED) {
        if ((p = take(&r, 8ull * rank, "strides", err)) == NULL) {
            return HRY_E_FORMAT;
        }
        for (uint32_t i = 0; i < rank; i++) {
            d->strides[i] = (int64_t)hry__le64(p + 8 * i);
        }
    }
    else if (layout == HRY_TILED) {
        if ((p = take(&r, 8, "tile", err)) == NULL) {
            return HRY_E_FORMAT;
        }
        uint32_t n_tile = hry__le32(p);
        if (hry__le32(p + 4) != 0) {
            return hry__fail(err, HRY_E_FORMAT, "tile.reserved",
                             "reserved tile bytes must be zero");
        }
        if (n_tile > rank) {
            return hry__fail(err, HRY_E_FORMAT, "tile", "%u tile sizes for rank %u", n_tile,
                             rank);
        }
        if ((p = take(&r, 8ull * n_tile, "tile", err)) == NULL) {
            return HRY_E_FORMAT;
        }
        d->n_tile = n_tile;
        for (uint32_t i = 0; i < n_tile; i++) {
            d->tile[i] = hry__le64(p + 8 * i);
        }
    }
    else if (is_sparse(layout)) {
        if ((p = take(&r, 16, "sparse", err)) == NULL) {
            return HRY_E_FORMAT;
        }
        if ((p[9] & ~1u) || !all_zero(p + 10, 6)) {
            return hry__fail(err, HRY_E_FORMAT, "sparse.reserved",
                             "reserved sparse bytes (sparse_flags bits 1-7, bytes 10-15) must "
                             "be zero");
        }
        d->sparse.nnz = hry__le64(p);
        d->sparse.index_type = p[8];
        d->sparse.canonical = p[9] & 1u;
        if (hry_dtype(p[8]) == NULL) {
            return hry__fail(err, HRY_E_FORMAT, "sparse.index_type",
                             "unknown element type tag %u", p[8]);
        }
        if ((s = check_sparse(d, err)) != HRY_OK) {
            return s;
        }
    }
    if (d->has_quantization) {
        if ((p = take(&r, 16, "quantization", err)) == NULL) {
            return HRY_E_FORMAT;
        }
        if (p[3] != 0) {
            return hry__fail(err, HRY_E_FORMAT, "quantization.reserved",
                             "reserved quantization byte must be zero");
        }
        if (p[0] < 1 || p[0] > 3) {
            return hry__fail(err, HRY_E_FORMAT, "quantization.scheme",
                             "unknown quantization scheme %u (1 per-tensor, 2 per-axis, "
                             "3 per-block)", p[0]);
        }
        if (hry_dtype(p[1]) == NULL) {
            return hry__fail(err, HRY_E_FORMAT, "quantization.scale_type",
                             "unknown element type tag %u", p[1]);
        }
        if (p[2] != 0 && hry_dtype(p[2]) == NULL) {
            return hry__fail(err, HRY_E_FORMAT, "quantization.zero_point_type",
                             "unknown element type tag %u", p[2]);
        }
        d->quant.scheme = p[0];
        d->quant.scale_type = p[1];
        d->quant.zero_point_type = p[2];
        d->quant.axis = (int32_t)hry__le32(p + 4);
        d->quant.block_size = hry__le64(p + 8);
        if ((s = check_quant(d, err)) != HRY_OK) {
            return s;
        }
    }
    if (d->has_shard) {
        if ((p = take(&r, 16, "shard", err)) == NULL) {
            return HRY_E_FORMAT;
        }
        if (hry__le32(p + 4) != 0) {
            return hry__fail(err, HRY_E_FORMAT, "shard.reserved",
                             "reserved shard bytes must be zero");
        }
        d->shard.replica_id = hry__le32(p);
        d->shard.device_type = (int32_t)hry__le32(p + 8);
        d->shard.device_id = (int32_t)hry__le32(p + 12);
        if ((p = take(&r, 8ull * rank, "shard.offsets", err)) == NULL) {
            return HRY_E_FORMAT;
        }
        for (uint32_t i = 0; i < rank; i++) {
            d->shard.offsets[i] = hry__le64(p + 8 * i);
        }
        if ((p = take(&r, 8ull * rank, "shard.global_shape", err)) == NULL) {
            return HRY_E_FORMAT;
        }
        for (uint32_t i = 0; i < rank; i++) {
            d->shard.global_shape[i] = hry__le64(p + 8 * i);
        }
        if ((s = check_shard(d, err)) != HRY_OK) {
            return s;
        }
    }
    char field[32]; /* formatted only for an error: snprintf costs more than the decoding */
    for (uint32_t i = 0; i < n_buf; i++) {
        if (ENTRY_SIZE > r.end - r.pos) {
            snprintf(field, sizeof field, "buffers[%u]", i);
            take(&r, ENTRY_SIZE, field, err);
            return HRY_E_FORMAT;
        }
        p = take(&r, ENTRY_SIZE, "", err);
        if (!all_zero(p + 1, 7)) {
            snprintf(field, sizeof field, "buffers[%u].reserved", i);
            return hry__fail(err, HRY_E_FORMAT, field,
                             "reserved buffer-entry bytes must be zero");
        }
        if (hry_role_name(p[0]) == NULL) {
            snprintf(field, sizeof field, "buffers[%u].role", i);
            return hry__fail(err, HRY_E_FORMAT, field, "unknown buffer role %u", p[0]);
        }
        /* a valid table has at most 5 entries: keep the first 5, check_table counts all */
        if (i < HRY_MAX_BUFFERS) {
            table->entry[i].role = p[0];
            table->entry[i].offset = hry__le64(p + 8);
            table->entry[i].length = hry__le64(p + 16);
        }
    }
    if (r.pos != total) {
        return hry__fail(err, HRY_E_FORMAT, "total_size",
                         "declared size %llu but the sections take %llu bytes",
                         (unsigned long long)total, (unsigned long long)r.pos);
    }
    table->count = n_buf;
    hry_buffer_spec specs[HRY_MAX_BUFFERS];
    uint32_t n = 0; /* stays 0 for a dynamic descriptor */
    if ((s = check_core(d, err, specs, &n)) != HRY_OK) {
        table->count = 0;
        return s;
    }
    if (n_buf > HRY_MAX_BUFFERS) {
        /* more entries than any descriptor calls for: report the count as check_table would */
        table->count = 0;
        if (hry_descriptor_is_dynamic(d)) {
            return hry__fail(err, HRY_E_FORMAT, "n_buffers",
                             "a descriptor with dynamic dimensions has no buffer table "
                             "(n_buffers must be 0, got %u)", n_buf);
        }
        return hry__fail(err, HRY_E_FORMAT, "n_buffers",
                         "%u buffers, the descriptor calls for %u", n_buf, n);
    }
    if ((s = check_table(d, table, specs, n, err)) != HRY_OK) {
        table->count = 0;
        return s;
    }
    if (size != NULL) {
        *size = (size_t)total;
    }
    if (version_minor != NULL) {
        *version_minor = b[5];
    }
    hry__ok(err);
    return HRY_OK;
}

hry_status hry_decode(const void *data, size_t len, hry_descriptor *out, hry_buffer_table *table,
                      hry_error *err)
{
    size_t size;
    hry_status s = hry_decode_prefix(data, len, out, table, &size, NULL, err);
    if (s != HRY_OK) {
        return s;
    }
    if (size != len) {
        if (table != NULL) {
            table->count = 0;
        }
        return hry__fail(err, HRY_E_FORMAT, "total_size",
                         "%zu trailing bytes after the %zu-byte descriptor", len - size, size);
    }
    return HRY_OK;
}

/* ---------------------------------------------------------------- encoding */

static uint64_t body_size(const hry_descriptor *d, uint32_t n_buffers)
{
    uint64_t size = HRY_HEADER_SIZE + 8ull * d->rank;
    if (d->layout == HRY_STRIDED) {
        size += 8ull * d->rank;
    }
    else if (d->layout == HRY_TILED) {
        size += 8 + 8ull * d->n_tile;
    }
    else if (is_sparse(d->layout)) {
        size += 16;
    }
    if (d->has_quantization) {
        size += 16;
    }
    if (d->has_shard) {
        size += 16 + 16ull * d->rank;
    }
    return size + (uint64_t)ENTRY_SIZE * n_buffers;
}

size_t hry_encoded_size(const hry_descriptor *d)
{
    hry_descriptor local;
    if (hry__desc_in(&d, &local, NULL) != HRY_OK) {
        return 0;
    }
    if (hry_descriptor_check(d, NULL) != HRY_OK) {
        return 0;
    }
    hry_buffer_spec specs[HRY_MAX_BUFFERS];
    uint32_t n = 0;
    if (!hry_descriptor_is_dynamic(d)) {
        layout_of(d, specs, &n);
    }
    return (size_t)body_size(d, n);
}

hry_status hry_encode(const hry_descriptor *d, const uint64_t *offsets, uint32_t n_offsets,
                      void *out_, size_t cap, size_t *written, hry_error *err)
{
    hry_descriptor local;
    hry_status sz = hry__desc_in(&d, &local, err);
    if (sz != HRY_OK) {
        return sz;
    }
    hry_status s = hry_descriptor_check(d, err);
    if (s != HRY_OK) {
        return s;
    }
    hry_buffer_spec specs[HRY_MAX_BUFFERS];
    uint32_t n = 0;
    if (!hry_descriptor_is_dynamic(d)) {
        layout_of(d, specs, &n);
    }
    hry_buffer_table tab;
    tab.count = n;
    uint64_t lengths[HRY_MAX_BUFFERS], canon[HRY_MAX_BUFFERS];
    for (uint32_t i = 0; i < n; i++) {
        lengths[i] = specs[i].length;
    }
    if (offsets == NULL) {
        hry_canonical_offsets(lengths, n, canon);
        offsets = canon;
    }
    else if (n_offsets != n) {
        return hry__fail(err, HRY_E_FORMAT, "buffers", "%u offsets for %u buffers", n_offsets, n);
    }
    for (uint32_t i = 0; i < n; i++) {
        tab.entry[i].role = specs[i].role;
        tab.entry[i].length = specs[i].length;
        tab.entry[i].offset = specs[i].length ? offsets[i] : 0;
        if (specs[i].length && offsets[i] % HRY_ALIGNMENT) {
            return hry__fail(err, HRY_E_FORMAT, "buffers.offset",
                             "offset %llu of the %s buffer is not 64-byte aligned",
                             (unsigned long long)offsets[i], ROLE_NAMES[specs[i].role]);
        }
    }
    /* metadata.md §8: an explicit placement must still satisfy rules 3-5 */
    hry_error inner;
    if (check_table(d, &tab, specs, n, &inner) != HRY_OK) {
        return hry__fail(err, HRY_E_FORMAT, "buffers.offset", "%s: %s", inner.field,
                         inner.message);
    }
    uint64_t total = body_size(d, n);
    if (out_ == NULL || cap < total) {
        return hry__fail(err, HRY_E_ARGUMENT, "", "the output needs %llu bytes, %zu given",
                         (unsigned long long)total, cap);
    }
    uint8_t *o = out_;
    memcpy(o, "HRYD", 4);
    o[4] = HRY_WIRE_VERSION_MAJOR;
    o[5] = HRY_WIRE_VERSION_MINOR;
    hry__put16(o + 6, hry_descriptor_flags(d));
    hry__put32(o + 8, d->rank);
    o[12] = d->dtype;
    o[13] = d->layout;
    hry__put16(o + 14, (uint16_t)n);
    hry__put64(o + 16, total);
    hry__put64(o + 24, 0);
    uint8_t *p = o + HRY_HEADER_SIZE;
    for (uint32_t i = 0; i < d->rank; i++, p += 8) {
        hry__put64(p, d->shape[i]);
    }
    if (d->layout == HRY_STRIDED) {
        for (uint32_t i = 0; i < d->rank; i++, p += 8) {
            hry__put64(p, (uint64_t)d->strides[i]);
        }
    }
    else if (d->layout == HRY_TILED) {
        hry__put32(p, d->n_tile);
        hry__put32(p + 4, 0);
        p += 8;
        for (uint32_t i = 0; i < d->n_tile; i++, p += 8) {
            hry__put64(p, d->tile[i]);
        }
    }
    else if (is_sparse(d->layout)) {
        hry__put64(p, d->sparse.nnz);
        p[8] = d->sparse.index_type;
        p[9] = d->sparse.canonical ? 1 : 0;
        memset(p + 10, 0, 6);
        p += 16;
    }
    if (d->has_quantization) {
        p[0] = d->quant.scheme;
        p[1] = d->quant.scale_type;
        p[2] = d->quant.zero_point_type;
        p[3] = 0;
        hry__put32(p + 4, (uint32_t)d->quant.axis);
        hry__put64(p + 8, d->quant.block_size);
        p += 16;
    }
    if (d->has_shard) {
        hry__put32(p, d->shard.replica_id);
        hry__put32(p + 4, 0);
        hry__put32(p + 8, (uint32_t)d->shard.device_type);
        hry__put32(p + 12, (uint32_t)d->shard.device_id);
        p += 16;
        for (uint32_t i = 0; i < d->rank; i++, p += 8) {
            hry__put64(p, d->shard.offsets[i]);
        }
        for (uint32_t i = 0; i < d->rank; i++, p += 8) {
            hry__put64(p, d->shard.global_shape[i]);
        }
    }
    for (uint32_t i = 0; i < n; i++, p += ENTRY_SIZE) {
        p[0] = tab.entry[i].role;
        memset(p + 1, 0, 7);
        hry__put64(p + 8, tab.entry[i].offset);
        hry__put64(p + 16, tab.entry[i].length);
    }
    if (written != NULL) {
        *written = (size_t)total;
    }
    hry__ok(err);
    return HRY_OK;
}
