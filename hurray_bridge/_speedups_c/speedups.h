/* What the sources of the one extension hurray_bridge._speedups share (not installed).
 *
 * module.c   the module: its function table and PyInit__speedups
 * front.c    Dispatcher, hb.convert's compiled shortcut front
 * deleters.c the DLPack deleter and capsule destructor of hurray_bridge._capsule's exports
 * decoder.c  the dense descriptor fast path of hurray_bridge.wire, over c/src/descriptor.c
 * tensor.c   hb.Tensor built and read from C (its slots), the DLPack address checks
 * xapi_in.c  DLPack import: the C exchange API of producer types, the import fronts
 * xapi_out.c DLPack export: the compiled Tensor.__dlpack__ and hb.Tensor's exchange API
 * crc32.c    zlib.crc32's CRC-32, by carry-less multiplication where the CPU has it
 * st_header.c safetensors headers in the writer's own form, read into hb.Tensors
 * hry_index.c Hurray entry tables of plain dense tensors, read into hb.Tensors
 * small_files.c small files of plain dense arrays, planned for hb.save and
 *            safetensors_io.save
 *
 * The directory is not called _speedups: a directory of that name next to the module
 * would import as a namespace package wherever the module was not built, and
 * `from . import _speedups` would then succeed with none of the functions in it.
 */
#ifndef HURRAY_SPEEDUPS_H
#define HURRAY_SPEEDUPS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* Shared between these files only: not part of the extension's exported symbols. */
#if defined(__GNUC__) && !defined(_WIN32)
#define HB_INTERNAL __attribute__((visibility("hidden")))
#else
#define HB_INTERNAL
#endif

#include <stdint.h>

#include "dlpack_abi.h"

/* front.c: readies Dispatcher and adds it to the module; -1 with an exception set. */
HB_INTERNAL int hb_add_front(PyObject *module);

/* deleters.c */
HB_INTERNAL PyObject *hb_capsule_hooks(PyObject *module, PyObject *args);
HB_INTERNAL PyObject *hb_stop_foreign_releases(PyObject *module, PyObject *arg);
/* drop(arg) with the GIL, on any thread, under the exit guard (our exports' deleters):
 * at once where this thread holds the GIL; otherwise taken for it, unless the
 * interpreter is exiting (then drop is not called: the process ends). */
HB_INTERNAL void hb_release(void (*drop)(void *), void *arg);

/* arrow_release.c: the release callbacks of _arrow_c's exports, under hb_release. */
HB_INTERNAL PyObject *hb_arrow_release_hooks(PyObject *module, PyObject *args);

/* crc32.c: crc32() and the CRC32_CLMUL flag it adds to the module (-1 with an exception). */
HB_INTERNAL PyObject *hb_crc32(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
HB_INTERNAL PyObject *hb_crc32_by(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
HB_INTERNAL PyObject *hb_crc32_combine(PyObject *module, PyObject *const *args,
                                       Py_ssize_t nargs);
HB_INTERNAL int hb_add_crc32(PyObject *module);

/* decoder.c */
HB_INTERNAL PyObject *hb_decode_dense(PyObject *module, PyObject *const *args,
                                      Py_ssize_t nargs);
HB_INTERNAL PyObject *hb_dense_decoder_setup(PyObject *module, PyObject *args);

/* tensor.c: what the extension knows of hb.Tensor, set once by exchange_setup(). */
enum {
    HB_S_BASE0, HB_S_BUFFERS, HB_S_COPIED, HB_S_DATA, HB_S_DESC, HB_S_DEVICE, HB_S_DTYPE,
    HB_S_NBYTES, HB_S_OWNER, HB_S_PADDED, HB_S_READONLY, HB_S_SHAPE, HB_S_SOURCE,
    HB_S_STRIDES, HB_S_DL, HB_N_SLOTS
};

#define HB_MAX_RANK 64
#define HB_MAX_DTYPES 64

typedef struct {
    PyObject *dtype; /* the hb.DType */
    uint8_t code;    /* its DLPack code and bits (= hb bits) */
    uint8_t bits;
    uint8_t is_complex;
} HbDType;

typedef struct {
    PyTypeObject *tensor_type;    /* hb.Tensor (exact type only) */
    Py_ssize_t slot[HB_N_SLOTS];  /* offsets of its slots */
    PyObject *device_type;        /* hb.Device */
    PyObject *cpu;                /* hb.CPU */
    PyObject *cpu_dl;             /* (DLDeviceType.kDLCPU, 0), __dlpack_device__ of CPU */
    PyObject *unsupported;        /* hb.UnsupportedError (a BufferError) */
    PyObject *row_major, *strided; /* Layout.ROW_MAJOR, Layout.STRIDED */
    PyObject *dlpack_py;          /* Tensor.__dlpack__ in Python (the full rules) */
    PyObject *dlpack_device_py;   /* Tensor.__dlpack_device__ in Python */
    PyObject *export_py;          /* Tensor._export in Python */
    PyObject *generic_ok;         /* type -> bool: may the generic import take it */
    HbDType dtypes[HB_MAX_DTYPES];
    int n_dtypes;
} HbWorld;

HB_INTERNAL extern HbWorld hb_world;

/* The slot s of an hb.Tensor (borrowed; NULL when unset). */
#define HB_SLOT(obj, s) (*(PyObject **)((char *)(obj) + hb_world.slot[(s)]))

/* A dense tensor to build as hb.Tensor._dense builds it (all borrowed). */
typedef struct {
    uint64_t data;          /* element [0, ..., 0]; ignored without elements */
    int ndim;
    const int64_t *shape;
    const int64_t *strides; /* NULL: compact row-major */
    PyObject *shape_tuple;  /* NULL: made from shape */
    const HbDType *dtype;
    int padded, readonly, copied;
    PyObject *device, *owner;
    PyObject *source;       /* NULL: None */
    PyObject *nbytes_obj;   /* NULL: made; else the byte count, known to be right */
} HbDense;

HB_INTERNAL int hb_world_ready(void);
HB_INTERNAL const HbDType *hb_dtype_of(unsigned code, unsigned bits);
HB_INTERNAL const HbDType *hb_dtype_entry(PyObject *dtype);
HB_INTERNAL PyObject *hb_dense_tensor(const HbDense *d);
/* A new hb.Tensor (exact type) with every slot NULL, GC-tracked; NULL on failure. */
HB_INTERNAL PyObject *hb_tensor_alloc(void);
HB_INTERNAL PyObject *hb_shape_tuple(int ndim, const int64_t *dims);
HB_INTERNAL int hb_is_compact(int ndim, const int64_t *shape, const int64_t *strides);
HB_INTERNAL int hb_span_ok(uint64_t data, uint64_t byte_offset, int ndim, const int64_t *shape,
                           const int64_t *strides, unsigned bits, uint64_t *element0);
HB_INTERNAL PyObject *hb_exchange_setup(PyObject *module, PyObject *args);
HB_INTERNAL PyObject *hb_swallow(void);
HB_INTERNAL PyObject *hb_buffer_address(PyObject *module, PyObject *obj);

/* st_header.c: safetensors_tensors(), hb.load's reader of plain safetensors headers,
 * and the byte ranges both readers of file indexes check for overlaps and holes */
HB_INTERNAL PyObject *hb_safetensors_tensors(PyObject *module, PyObject *args);
typedef struct {
    uint64_t begin, end;
} HbSpan;
typedef struct {
    HbSpan *at; /* PyMem_Realloc'ed; PyMem_Free it */
    Py_ssize_t n, cap;
} HbSpans;
HB_INTERNAL int hb_spans_push(HbSpans *spans, uint64_t begin, uint64_t end); /* -1: error */
/* 1 if the spans (sorted here) tile [0, total), each starting where the one before ends,
 * rounded up to ``alignment`` (a power of two; 1: back to back); else 0 */
HB_INTERNAL int hb_spans_tile(HbSpans *spans, uint64_t alignment, uint64_t total);
#define HB_ANSWERS_MAX 4096 /* a cache of describe's answers is emptied when this full */
HB_INTERNAL PyObject *hb_cached_answer(PyObject **cache, PyObject *key,
                                       PyObject *(*make)(void *), void *arg, Py_ssize_t size,
                                       Py_ssize_t int_at, const char *form);

/* hry_index.c: hurray_tensors(), hb.load's reader of plain Hurray entry tables */
HB_INTERNAL PyObject *hb_hurray_tensors(PyObject *module, PyObject *args);

/* small_files.c: small_file() and small_safetensors(), the planners of small files of
 * plain dense arrays of hb.save and safetensors_io.save */
HB_INTERNAL PyObject *hb_small_file(PyObject *module, PyObject *args);
HB_INTERNAL PyObject *hb_small_safetensors(PyObject *module, PyObject *args);

/* xapi_in.c */
HB_INTERNAL int hb_add_import(PyObject *module);
HB_INTERNAL PyObject *hb_import_managed(HbDLManagedTensorVersioned *mt, PyObject *source,
                                        int *declined);

/* xapi_out.c */
HB_INTERNAL int hb_add_export(PyObject *module);

#endif /* HURRAY_SPEEDUPS_H */
