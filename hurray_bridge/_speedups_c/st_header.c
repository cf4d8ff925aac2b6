/* A safetensors header in the form safetensors' writer gives it, read into hb.Tensors.
 *
 * safetensors_tensors() is the mapped-file path of hb.load for such a header
 * (hurray_bridge/files/safetensors_header.py's _members, _fast_entry and
 * _check_coverage, then mapping.tensors_over): it reads the members after the
 * header's '{', each either an entry matching _FAST_ENTRY or an "__metadata__" object
 * of plain strings, checks every entry (known type, size, offsets inside the data,
 * no duplicate, the data covered exactly) and only then hands back the tensors.
 *
 * It never refuses: anything it does not accept -- another form, a value out of its
 * range, any defect -- makes it answer None, and the Python reader, which stays the
 * reference, reads the header again and names the defect. So what it accepts must be
 * accepted by the Python reader with the same result, which tests check on a table
 * of good and bad headers. The descriptor of each (type, shape) comes from a Python
 * callable (the same cached, checked descriptors the Python path gives its tensors),
 * asked once per distinct text of the pair, its answers kept for later loads (a bounded
 * cache: the callable's answer for one text never changes).
 */
#include "speedups.h"

#include <stdlib.h>
#include <string.h>

int
hb_spans_push(HbSpans *spans, uint64_t begin, uint64_t end)
{
    if (spans->n == spans->cap) {
        Py_ssize_t cap = spans->cap ? 2 * spans->cap : 64;
        HbSpan *grown = PyMem_Realloc(spans->at, (size_t)cap * sizeof(HbSpan));
        if (grown == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        spans->at = grown;
        spans->cap = cap;
    }
    spans->at[spans->n++] = (HbSpan){begin, end};
    return 0;
}

static int
span_cmp(const void *a, const void *b)
{
    const HbSpan *x = a, *y = b;
    if (x->begin != y->begin) {
        return x->begin < y->begin ? -1 : 1;
    }
    return (x->end > y->end) - (x->end < y->end);
}

/* by begin, then end */
static void
spans_sort(HbSpans *spans)
{
    if (spans->n > 1) { /* qsort's base may not be NULL, even for no items */
        qsort(spans->at, (size_t)spans->n, sizeof(HbSpan), span_cmp);
    }
}

int
hb_spans_tile(HbSpans *spans, uint64_t alignment, uint64_t total)
{
    spans_sort(spans);
    uint64_t end = 0, mask = alignment - 1;
    for (Py_ssize_t k = 0; k < spans->n; k++) {
        uint64_t padded = (end + mask) & ~mask;
        if (padded < end || spans->at[k].begin != padded) {
            return 0;
        }
        end = spans->at[k].end;
    }
    return end == total;
}

static Py_ssize_t
skip_ws(const char *s, Py_ssize_t i, Py_ssize_t n)
{
    while (i < n && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r')) {
        i++;
    }
    return i;
}

/* The end of the string at s[i] (after its closing quote) when it has no escape and no
 * control character ([^"\\\x00-\x1f]*); -1 otherwise. */
static Py_ssize_t
plain_string(const char *s, Py_ssize_t i, Py_ssize_t n)
{
    if (i >= n || s[i] != '"') {
        return -1;
    }
    for (i++; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"') {
            return i + 1;
        }
        if (c == '\\' || c < 0x20) {
            return -1;
        }
    }
    return -1;
}

/* The literal text at s[*i], stepping past it; 0 when it is not there. */
static int
literal(const char *s, Py_ssize_t *i, Py_ssize_t n, const char *text, Py_ssize_t len)
{
    if (n - *i < len || memcmp(s + *i, text, (size_t)len) != 0) {
        return 0;
    }
    *i += len;
    return 1;
}

#define LITERAL(s, i, n, text) literal((s), (i), (n), (text), (Py_ssize_t)sizeof(text) - 1)

/* An integer as _UINT writes it (0, or up to 20 digits without a leading zero) at
 * s[*i]; 0 when there is none or it is above INT64_MAX (the Python reader decides). */
static int
uint_token(const char *s, Py_ssize_t *i, Py_ssize_t n, int64_t *out)
{
    Py_ssize_t j = *i;
    if (j >= n || s[j] < '0' || s[j] > '9') {
        return 0;
    }
    if (s[j] == '0') {
        *out = 0;
        *i = j + 1;
        return 1;
    }
    uint64_t v = 0;
    for (; j < n && s[j] >= '0' && s[j] <= '9'; j++) {
        uint64_t units = (uint64_t)(s[j] - '0');
        if (v > ((uint64_t)INT64_MAX - units) / 10) {
            return 0;
        }
        v = v * 10 + units;
    }
    *out = (int64_t)v;
    *i = j;
    return 1;
}

/* "__metadata__"'s value at s[*i]: an object of plain strings, stepped over. */
static int
plain_metadata(const char *s, Py_ssize_t *i, Py_ssize_t n)
{
    Py_ssize_t j = skip_ws(s, *i, n);
    if (j >= n || s[j] != '{') {
        return 0;
    }
    j = skip_ws(s, j + 1, n);
    if (j < n && s[j] == '}') {
        *i = j + 1;
        return 1;
    }
    for (;;) {
        if ((j = plain_string(s, j, n)) < 0) {
            return 0;
        }
        j = skip_ws(s, j, n);
        if (j >= n || s[j] != ':') {
            return 0;
        }
        if ((j = plain_string(s, skip_ws(s, j + 1, n), n)) < 0) {
            return 0;
        }
        j = skip_ws(s, j, n);
        if (j < n && s[j] == '}') {
            *i = j + 1;
            return 1;
        }
        if (j >= n || s[j] != ',') {
            return 0;
        }
        j = skip_ws(s, j + 1, n);
    }
}

typedef struct {
    const char *s;
    Py_ssize_t n;
    uint64_t data_size, base, cap;
    PyObject *owner, *describe, *checkpoint;
    PyObject *out;       /* {name: Tensor} */
    HbSpans spans;
    uint64_t alignment, unaligned;
    Py_ssize_t metadata_at;
} Reader;

/* The answer cached under ``key`` in ``*cache`` (a dict made at first use, kept across
 * loads, emptied when it holds HB_ANSWERS_MAX), else ``make(arg)``, kept if it is None or
 * a tuple of ``size`` items whose item 1 is a tuple and item ``int_at`` an int (else a
 * TypeError saying ``form``). Both compiled readers keep describe's answers here. A new
 * reference: the cache may be emptied while the caller still reads the answer (a
 * collection during a tensor's allocation can run code that loads another file). */
PyObject *
hb_cached_answer(PyObject **cache, PyObject *key, PyObject *(*make)(void *), void *arg,
                 Py_ssize_t size, Py_ssize_t int_at, const char *form)
{
    if (*cache == NULL && (*cache = PyDict_New()) == NULL) {
        return NULL;
    }
    PyObject *got = PyDict_GetItemWithError(*cache, key);
    if (got != NULL || PyErr_Occurred()) {
        return Py_XNewRef(got);
    }
    got = make(arg);
    if (got != NULL && got != Py_None
            && (!PyTuple_Check(got) || PyTuple_GET_SIZE(got) != size
                || !PyTuple_Check(PyTuple_GET_ITEM(got, 1))
                || !PyLong_Check(PyTuple_GET_ITEM(got, int_at)))) {
        PyErr_Format(PyExc_TypeError, "describe's answer is not %s or None", form);
        Py_CLEAR(got);
    }
    if (got != NULL && PyDict_GET_SIZE(*cache) >= HB_ANSWERS_MAX) {
        PyDict_Clear(*cache);
    }
    if (got == NULL || PyDict_SetItem(*cache, key, got) < 0) {
        Py_XDECREF(got);
        return NULL;
    }
    return got;
}

/* {b'"dtype":...,"shape":[...]': describe's answer}, across loads */
static PyObject *described_texts;

typedef struct {
    Reader *r;
    Py_ssize_t st_a, st_b;
    int ndim;
    const int64_t *dims;
} EntryText;

static PyObject *
describe_text(void *arg)
{
    EntryText *e = arg;
    PyObject *shape = hb_shape_tuple(e->ndim, e->dims);
    PyObject *st = shape ? PyUnicode_DecodeUTF8(e->r->s + e->st_a, e->st_b - e->st_a,
                                                "strict") : NULL;
    PyObject *got = st ? PyObject_CallFunctionObjArgs(e->r->describe, shape, st, NULL) : NULL;
    Py_XDECREF(shape);
    Py_XDECREF(st);
    return got;
}

/* describe(shape, type name) for the text s[a:b] of one entry's type and shape, once
 * per distinct text: (Descriptor, shape tuple, byte count, DType) or None; a new
 * reference (hb_cached_answer). */
static PyObject *
described(Reader *r, Py_ssize_t a, Py_ssize_t b, Py_ssize_t st_a, Py_ssize_t st_b,
          int ndim, const int64_t *dims)
{
    PyObject *key = PyBytes_FromStringAndSize(r->s + a, b - a);
    if (key == NULL) {
        return NULL;
    }
    EntryText e = {r, st_a, st_b, ndim, dims};
    PyObject *got = hb_cached_answer(&described_texts, key, describe_text, &e, 4, 2,
                                     "(Descriptor, shape, nbytes, DType)");
    Py_DECREF(key);
    return got;
}

/* The tensor of one entry read in _FAST_ENTRY's form, described by ``desc`` (held by
 * the caller), into r->out: 1 added, 0 declined, -1 an error. */
static int
fast_tensor(Reader *r, PyObject *desc, PyObject *name, int ndim, const int64_t *dims,
            int64_t begin, int64_t end)
{
    if (desc == Py_None) {
        return 0;
    }
    /* describe counts bytes in Python: up to 2**64 - 1, past what a file can hold */
    int overflow = 0;
    long long nbytes = PyLong_AsLongLongAndOverflow(PyTuple_GET_ITEM(desc, 2), &overflow);
    if (nbytes == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (overflow) {
        return 0; /* the Python reader names the size */
    }
    const HbDType *dtype = hb_dtype_entry(PyTuple_GET_ITEM(desc, 3));
    if (nbytes != end - begin || dtype == NULL) {
        return 0;
    }
    int has = PyDict_Contains(r->out, name);
    if (has != 0) {
        return has < 0 ? -1 : 0; /* a duplicate: the Python reader names it */
    }
    uint64_t data = r->base + (uint64_t)begin;
    HbDense d = {
        .data = data, .ndim = ndim, .shape = dims, .strides = NULL,
        .shape_tuple = PyTuple_GET_ITEM(desc, 1), .dtype = dtype, .padded = 0,
        .readonly = 1, .copied = 0, .device = hb_world.cpu, .owner = r->owner,
        .source = NULL, .nbytes_obj = PyTuple_GET_ITEM(desc, 2),
    };
    PyObject *t = hb_dense_tensor(&d);
    if (t == NULL) {
        return -1;
    }
    /* the shared, checked descriptor, as tensors_over sets it */
    Py_SETREF(HB_SLOT(t, HB_S_DESC), Py_NewRef(PyTuple_GET_ITEM(desc, 0)));
    int failed = PyDict_SetItem(r->out, name, t);
    Py_DECREF(t);
    if (failed) {
        return -1;
    }
    return 1;
}

/* One entry in _FAST_ENTRY's form after its name (at the ':' side); 1 read, 0 not
 * this form or a defect, -1 an error. */
static int
fast_entry(Reader *r, Py_ssize_t *pos, PyObject *name)
{
    const char *s = r->s;
    Py_ssize_t n = r->n, i = skip_ws(s, *pos, n);
    if (i >= n || s[i] != ':') {
        return 0;
    }
    i = skip_ws(s, i + 1, n);
    Py_ssize_t key_a = i + 1; /* from the '"' of "dtype" to the ']' of the shape */
    if (!LITERAL(s, &i, n, "{\"dtype\":")) {
        return 0;
    }
    Py_ssize_t st_a = i + 1, after = plain_string(s, i, n);
    if (after < 0) {
        return 0;
    }
    Py_ssize_t st_b = after - 1; /* the type name is s[st_a:st_b], between its quotes */
    i = after;
    if (!LITERAL(s, &i, n, ",\"shape\":[")) {
        return 0;
    }
    int64_t dims[HB_MAX_RANK];
    int ndim = 0;
    if (i < n && s[i] != ']') {
        for (;;) {
            if (ndim == HB_MAX_RANK || !uint_token(s, &i, n, &dims[ndim])) {
                return 0;
            }
            ndim++;
            if (i < n && s[i] == ',') {
                i++;
                continue;
            }
            break;
        }
    }
    if (i >= n || s[i] != ']') {
        return 0;
    }
    Py_ssize_t key_b = ++i;
    int64_t begin, end;
    if (!LITERAL(s, &i, n, ",\"data_offsets\":[") || !uint_token(s, &i, n, &begin)
            || !LITERAL(s, &i, n, ",") || !uint_token(s, &i, n, &end)
            || !LITERAL(s, &i, n, "]}")) {
        return 0;
    }
    if (begin > end || (uint64_t)end > r->data_size) {
        return 0;
    }
    PyObject *desc = described(r, key_a, key_b, st_a, st_b, ndim, dims);
    if (desc == NULL) {
        return -1;
    }
    int got = fast_tensor(r, desc, name, ndim, dims, begin, end);
    Py_DECREF(desc);
    if (got != 1) {
        return got;
    }
    if (hb_spans_push(&r->spans, (uint64_t)begin, (uint64_t)end) < 0) {
        return -1;
    }
    if (end > begin) { /* the alignment every non-empty buffer has (pow2_alignment) */
        uint64_t data = r->base + (uint64_t)begin;
        uint64_t low = data & (~data + 1);
        if (low < r->alignment) {
            r->alignment = low;
        }
        r->unaligned += data % r->cap != 0;
    }
    *pos = i;
    return 1;
}

/* The members after the header's '{': 1 all read and checked, 0 declined, -1 error. */
static int
read_members(Reader *r)
{
    const char *s = r->s;
    Py_ssize_t n = r->n, i = skip_ws(s, 1, n);
    int closed = i < n && s[i] == '}';
    if (closed) {
        i++;
    }
    while (!closed) {
        if (!(r->spans.n & 1023) && r->checkpoint != Py_None) { /* as often as _members */
            PyObject *ok = PyObject_CallNoArgs(r->checkpoint);
            if (ok == NULL) {
                return -1;
            }
            Py_DECREF(ok);
        }
        Py_ssize_t a = skip_ws(s, i, n), b = plain_string(s, a, n);
        if (b < 0) {
            return 0;
        }
        if (b - a == 14 && memcmp(s + a, "\"__metadata__\"", 14) == 0) {
            i = skip_ws(s, b, n);
            if (r->metadata_at >= 0 || i >= n || s[i] != ':') {
                return 0;
            }
            r->metadata_at = ++i;
            if (!plain_metadata(s, &i, n)) {
                return 0;
            }
        }
        else {
            PyObject *name = PyUnicode_DecodeUTF8(s + a + 1, b - a - 2, "strict");
            if (name == NULL) {
                return -1;
            }
            int got = fast_entry(r, &b, name);
            Py_DECREF(name);
            if (got <= 0) {
                return got;
            }
            i = b;
        }
        i = skip_ws(s, i, n);
        if (i >= n || (s[i] != ',' && s[i] != '}')) {
            return 0;
        }
        closed = s[i++] == '}';
    }
    if (skip_ws(s, i, n) != n) {
        return 0;
    }
    return hb_spans_tile(&r->spans, 1, r->data_size); /* back to back, no gap */
}

/* safetensors_tensors(header, data_size, base, owner, describe, checkpoint, cap)
 *   -> ({name: Tensor}, metadata_at, alignment, unaligned) or None */
PyObject *
hb_safetensors_tensors(PyObject *module, PyObject *args)
{
    (void)module;
    Py_buffer view;
    unsigned long long data_size, base, cap;
    PyObject *owner, *describe, *checkpoint;
    if (!PyArg_ParseTuple(args, "y*KKOOOK:safetensors_tensors", &view, &data_size, &base,
                          &owner, &describe, &checkpoint, &cap)) {
        return NULL;
    }
    if (!hb_world_ready() || view.len < 1 || ((const char *)view.buf)[0] != '{' || cap == 0
            || (cap & (cap - 1)) != 0) {
        PyBuffer_Release(&view);
        Py_RETURN_NONE;
    }
    Reader r = {
        .s = view.buf, .n = view.len, .data_size = data_size, .base = base, .cap = cap,
        .owner = owner, .describe = describe, .checkpoint = checkpoint,
        .out = PyDict_New(), .alignment = cap,
        .metadata_at = -1,
    };
    PyObject *result = NULL;
    int got = r.out ? read_members(&r) : -1;
    if (got > 0) {
        result = Py_BuildValue("(OnKK)", r.out, r.metadata_at,
                               (unsigned long long)r.alignment,
                               (unsigned long long)r.unaligned);
    }
    else if (got == 0) {
        result = Py_NewRef(Py_None);
    }
    Py_XDECREF(r.out);
    PyMem_Free(r.spans.at);
    PyBuffer_Release(&view);
    return result;
}
