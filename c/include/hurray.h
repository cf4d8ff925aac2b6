/*
 * hurray.h — the Hurray tensor format in C: descriptors, files, DLPack hand-out.
 *
 * C11, libc (and POSIX mmap/open for files) only. Everything a program needs is declared in
 * this header; docs/impl/c-api.md describes ownership, errors, thread safety and
 * versioning at more length.
 *
 *   Descriptors  hry_decode / hry_decode_prefix / hry_encode: the binary descriptor
 *                encoding of docs/spec/metadata.md, with the rules of the Python codec
 *                (hurray_bridge/wire.py) — bounded, overflow-checked, rank 0..64.
 *   Files        hry_file_open (memory map) / hry_file_open_memory: a .hurray file of
 *                docs/spec/container.md, validated in full before any pointer is handed
 *                out; hry_file_verify checks every byte (checksums, padding).
 *   DLPack       hry_file_to_dlpack: an entry as a DLManagedTensorVersioned, read-only,
 *                whose deleter keeps the file mapped until the last tensor is released.
 *   Writing      hry_writer_*: 64-byte aligned data, CRC-32 checksums, temp file + rename.
 *
 * Conventions
 *   - Every function that can fail returns an hry_status (HRY_OK is 0) and, when the
 *     caller passes a non-NULL hry_error*, fills it with a message and the name of the
 *     offending field (the same names as the Python FormatError.field, e.g. "rank",
 *     "buffers[1].offset", "entries[3].checksum").
 *   - Input bytes are untrusted: no decoder or reader crashes, reads out of bounds,
 *     overflows an integer or allocates memory in proportion to an unchecked count.
 *   - All integers on the wire are little-endian; the library reads them byte by byte,
 *     so it runs on any host. Handing out tensors (DLPack) and writing files need a
 *     little-endian host (the tensor bytes are little-endian): HRY_E_UNSUPPORTED elsewhere.
 */
#ifndef HURRAY_H
#define HURRAY_H

#include <stddef.h>
#include <stdint.h>
#include <string.h> /* memset, for the inline hry_descriptor_init */

#ifdef __cplusplus
extern "C" {
#endif

/* The shared library exports exactly the functions declared here (it is built with
 * -fvisibility=hidden). */
#if defined(__GNUC__) || defined(__clang__)
#pragma GCC visibility push(default)
#endif

/* ------------------------------------------------------------------------------------
 * Versions
 * ------------------------------------------------------------------------------------ */

/* The library's own version (semantic versioning of this API and ABI; docs/impl/c-api.md
 * "ABI stability"). 2.0 gave hry_descriptor and hry_file_info a leading struct_size, so that
 * later minor versions can append fields without breaking compiled callers. */
#define HRY_LIB_VERSION_MAJOR 2
#define HRY_LIB_VERSION_MINOR 0
#define HRY_LIB_VERSION_PATCH 0
/* The header's version in hry_library_version()'s encoding. */
#define HRY_LIB_VERSION ((HRY_LIB_VERSION_MAJOR << 16) | (HRY_LIB_VERSION_MINOR << 8) | \
                         HRY_LIB_VERSION_PATCH)

/* The descriptor encoding (metadata.md) and file format (container.md) versions written.
 * A reader accepts major version 1 with any minor version. */
#define HRY_WIRE_VERSION_MAJOR 1
#define HRY_WIRE_VERSION_MINOR 0
#define HRY_FILE_VERSION_MAJOR 1
#define HRY_FILE_VERSION_MINOR 0

/* The version of the library actually linked: (major << 16) | (minor << 8) | patch. */
uint32_t hry_library_version(void);

/* 1 when the linked library serves a program compiled against this header: the same major
 * version and at least this minor version (an older library lacks the newer functions and
 * refuses the newer struct fields). Call it once at start-up; it is inline, so it compares
 * the header the caller was compiled with, not the library's own. */
static inline int hry_version_check(void)
{
    uint32_t v = hry_library_version();
    /* + 1 > rather than >=: no "always true" warning while the header's minor is 0 */
    return (v >> 16) == HRY_LIB_VERSION_MAJOR && ((v >> 8) & 0xFFu) + 1u > HRY_LIB_VERSION_MINOR;
}

/* ------------------------------------------------------------------------------------
 * Errors
 * ------------------------------------------------------------------------------------ */

typedef enum hry_status {
    HRY_OK = 0,
    HRY_E_FORMAT = 1,      /* bytes or a descriptor break a rule of the format */
    HRY_E_UNSUPPORTED = 2, /* valid, but this operation cannot handle it (e.g. DLPack of a
                              sparse tensor, a big-endian host) */
    HRY_E_DYNAMIC = 3,     /* a size was asked of a descriptor with a DYNAMIC dimension */
    HRY_E_IO = 4,          /* open/read/write/mmap/rename failed; errno is in hry_error.os_errno */
    HRY_E_NOMEM = 5,       /* malloc failed */
    HRY_E_ARGUMENT = 6     /* a NULL pointer, a too-small output buffer, an index out of range */
} hry_status;

#define HRY_FIELD_MAX 80
#define HRY_MESSAGE_MAX 320

/* The one caller-allocated struct without struct_size: it is passed uninitialised to every
 * call and filled on failure paths that could not report a bad size. Its layout is fixed for
 * the major version; new information comes as new status codes and functions. */
typedef struct hry_error {
    hry_status status;
    int os_errno;                 /* for HRY_E_IO, else 0 */
    char field[HRY_FIELD_MAX];    /* e.g. "entries[2].buffers[0].offset"; "" when none */
    char message[HRY_MESSAGE_MAX];/* human-readable, names the value, the limit and the fix */
} hry_error;

/* A static name for a status ("format error", ...). */
const char *hry_status_name(hry_status status);

/* ------------------------------------------------------------------------------------
 * Element types, layouts, roles (docs/spec/element-types.md, memory-layout.md)
 * ------------------------------------------------------------------------------------ */

#define HRY_MAX_RANK 64
#define HRY_DYNAMIC UINT64_MAX         /* an unresolved dimension; never the same as 0 */
#define HRY_MAX_WIRE_BUFFERS 8         /* n_buffers limit of the header */
#define HRY_MAX_BUFFERS 5              /* most buffers a valid descriptor calls for */
#define HRY_ALIGNMENT 64               /* buffer alignment in descriptors and files */
#define HRY_HEADER_SIZE 32             /* descriptor header */
#define HRY_MAX_DESCRIPTOR_SIZE 2192   /* the largest valid encoded descriptor */

/* Element type tags (append-only). */
enum {
    HRY_BOOL = 1, /* 1-bit packed */
    HRY_BOOL8 = 2,
    HRY_INT8 = 3, HRY_INT16 = 4, HRY_INT32 = 5, HRY_INT64 = 6,
    HRY_UINT8 = 7, HRY_UINT16 = 8, HRY_UINT32 = 9, HRY_UINT64 = 10,
    HRY_FLOAT16 = 11, HRY_BFLOAT16 = 12, HRY_FLOAT32 = 13, HRY_FLOAT64 = 14,
    HRY_COMPLEX64 = 15, HRY_COMPLEX128 = 16,
    HRY_FLOAT8_E4M3FN = 17, HRY_FLOAT8_E5M2 = 18, HRY_FLOAT8_E4M3FNUZ = 19,
    HRY_FLOAT8_E5M2FNUZ = 20, HRY_FLOAT8_E8M0FNU = 21,
    HRY_FLOAT4_E2M1FN = 22,
    HRY_INT4 = 23, HRY_UINT4 = 24, HRY_INT2 = 25, HRY_UINT2 = 26
};
#define HRY_LAST_DTYPE 26

typedef enum hry_kind { HRY_KIND_BOOL = 0, HRY_KIND_INT = 1, HRY_KIND_UINT = 2,
                        HRY_KIND_FLOAT = 3, HRY_KIND_COMPLEX = 4 } hry_kind;

/* Library-owned (hry_dtype returns a pointer into a static table): fields are only
 * appended, so never copy one by value or take its sizeof. */
typedef struct hry_dtype_info {
    uint8_t tag;
    const char *name;       /* the element-types.md name: "float32", "bfloat16", "int4" ... */
    uint8_t bits;           /* 1, 2, 4, 8, 16, 32, 64 or 128 */
    hry_kind kind;
    uint8_t tier;           /* 1 or 2 */
    int has_dlpack;         /* 0 for the bit-packed "bool", which has no DLPack pair */
    uint8_t dlpack_code;    /* DLDataTypeCode */
    uint8_t dlpack_bits;
} hry_dtype_info;

/* The element type of a tag, or NULL for an unknown tag. */
const hry_dtype_info *hry_dtype(unsigned tag);
/* The element type of a name ("float32"), or NULL. */
const hry_dtype_info *hry_dtype_by_name(const char *name);

typedef enum hry_layout {
    HRY_ROW_MAJOR = 1, HRY_STRIDED = 2, HRY_TILED = 3, HRY_COO = 4, HRY_CSR = 5, HRY_CSC = 6
} hry_layout;

typedef enum hry_role {
    HRY_ROLE_DATA = 1, HRY_ROLE_VALUES = 2, HRY_ROLE_INDICES = 3, HRY_ROLE_INDPTR = 4,
    HRY_ROLE_SCALES = 5, HRY_ROLE_ZERO_POINTS = 6
} hry_role;

typedef enum hry_scheme { HRY_PER_TENSOR = 1, HRY_PER_AXIS = 2, HRY_PER_BLOCK = 3 } hry_scheme;

/* Descriptor header flags. */
#define HRY_FLAG_HAS_QUANTIZATION 0x0001u
#define HRY_FLAG_HAS_SHARD 0x0002u
#define HRY_FLAG_SUBBYTE_PADDED 0x0004u

/* "ROW_MAJOR", "STRIDED", "TILED", "COO", "CSR", "CSC" (the compliance JSON names), or NULL. */
const char *hry_layout_name(unsigned layout);
/* "DATA", "VALUES", "INDICES", "INDPTR", "SCALES", "ZERO_POINTS", or NULL. */
const char *hry_role_name(unsigned role);

/* ------------------------------------------------------------------------------------
 * Descriptors
 * ------------------------------------------------------------------------------------ */

/* A descriptor as plain values: the fields of the wire encoding, nothing allocated.
 * Start with hry_descriptor_init(&d) (zeroes it and sets struct_size), then fill what the
 * layout and sections need; array entries past the rank (n_tile) and the fields of absent
 * sections are ignored, and a decoder does not write them. hry_descriptor_check() applies
 * every rule of the data model.
 *
 * struct_size is the caller's sizeof(hry_descriptor): every function that takes one reads
 * it first. Later 2.x versions append fields after `shard` only; the library reads and
 * writes only the bytes the caller's struct_size covers (missing fields count as zero), so
 * a program compiled against an older 2.x header keeps working with a newer library.
 * HRY_E_ARGUMENT (field "struct_size") when it is below the 2.0 size, HRY_E_UNSUPPORTED
 * when a newer caller set a field this library does not know (a non-zero byte past its
 * own size). The functions that return no status return 0 then. */
typedef struct hry_descriptor {
    uint32_t struct_size;               /* sizeof(hry_descriptor) as the caller compiled it */
    uint32_t rank;                      /* 0 .. 64 */
    uint8_t dtype;                      /* element type tag */
    uint8_t layout;                     /* hry_layout */
    uint8_t padded;                     /* 1: sub-byte elements one per byte (SUBBYTE_PADDED) */
    uint8_t has_quantization;           /* 1: the quant section is present */
    uint8_t has_shard;                  /* 1: the shard section is present */
    uint64_t shape[HRY_MAX_RANK];       /* 0 = empty dimension, HRY_DYNAMIC = unresolved */
    int64_t strides[HRY_MAX_RANK];      /* HRY_STRIDED only: element strides */
    uint32_t n_tile;                    /* HRY_TILED only: 1 .. rank */
    uint64_t tile[HRY_MAX_RANK];        /* tile sizes of the innermost n_tile dimensions */
    struct hry_sparse {                 /* HRY_COO / HRY_CSR / HRY_CSC only */
        uint64_t nnz;                   /* 0 .. 2^64 - 2 */
        uint8_t index_type;             /* an integer type tag of 8 bits or more */
        uint8_t canonical;              /* 1: sorted, no duplicates */
    } sparse;
    struct hry_quantization {           /* when has_quantization */
        uint8_t scheme;                 /* hry_scheme */
        uint8_t scale_type;             /* a float type of 8 bits or more */
        uint8_t zero_point_type;        /* 0 = none */
        int32_t axis;                   /* -1 for per-tensor */
        uint64_t block_size;            /* per-block: 1 .. 2^64 - 2; otherwise 0 */
    } quant;
    struct hry_shard {                  /* when has_shard */
        uint32_t replica_id;
        int32_t device_type;            /* DLPack device type, >= 0 */
        int32_t device_id;              /* >= 0 */
        uint64_t offsets[HRY_MAX_RANK];
        uint64_t global_shape[HRY_MAX_RANK];
    } shard;
    /* fields of later 2.x versions are appended here */
} hry_descriptor;

/* Zero *d and set its struct_size to this header's size. Inline on purpose: the size must be
 * the caller's, not the library's. */
static inline void hry_descriptor_init(hry_descriptor *d)
{
    memset(d, 0, sizeof *d);
    d->struct_size = (uint32_t)sizeof *d;
}

/* The buffer structs below mirror the wire format's buffer table (docs/spec/metadata.md):
 * their layout is fixed for the major version and changes only with the format's. */

/* One buffer a descriptor calls for: its role and exact byte length. */
typedef struct hry_buffer_spec {
    uint8_t role;
    uint64_t length;
} hry_buffer_spec;

/* One row of an encoded buffer table: role, offset into the carrier's data region, length. */
typedef struct hry_buffer_entry {
    uint8_t role;
    uint64_t offset;
    uint64_t length;
} hry_buffer_entry;

typedef struct hry_buffer_table {
    uint32_t count;                               /* 0 (dynamic) .. 5 */
    hry_buffer_entry entry[HRY_MAX_BUFFERS];
} hry_buffer_table;

/* Applies every rule of the data model, layouts, quantization and sharding (the rules of
 * the Python Descriptor constructor, in its order). HRY_OK or HRY_E_FORMAT naming the field. */
hry_status hry_descriptor_check(const hry_descriptor *d, hry_error *err);

/* 1 when a and b describe the same descriptor (only the fields their layout and sections
 * use are compared: a decoder leaves the arrays past the rank and absent sections as they
 * were). */
int hry_descriptor_equal(const hry_descriptor *a, const hry_descriptor *b);

/* The header flags the descriptor's content implies. */
uint16_t hry_descriptor_flags(const hry_descriptor *d);
/* 1 when some dimension is HRY_DYNAMIC; 1 when some dimension is 0. */
int hry_descriptor_is_dynamic(const hry_descriptor *d);
int hry_descriptor_is_empty(const hry_descriptor *d);

/* For a checked descriptor: the element count, the byte length of the primary buffer
 * (DATA, or VALUES for sparse layouts), and every buffer in canonical order.
 * HRY_E_DYNAMIC while a dimension is dynamic. */
hry_status hry_descriptor_element_count(const hry_descriptor *d, uint64_t *count,
                                        hry_error *err);
hry_status hry_descriptor_nbytes(const hry_descriptor *d, uint64_t *nbytes, hry_error *err);
hry_status hry_descriptor_buffer_layout(const hry_descriptor *d, hry_buffer_spec out[HRY_MAX_BUFFERS],
                                        uint32_t *count, hry_error *err);

/* Decode one descriptor at the start of data[0 .. len). `out` receives the descriptor,
 * `table` (may be NULL) its buffer table, `size` (may be NULL) the bytes it took and
 * `version_minor` (may be NULL) the minor version it was written with. */
hry_status hry_decode_prefix(const void *data, size_t len, hry_descriptor *out,
                             hry_buffer_table *table, size_t *size, uint8_t *version_minor,
                             hry_error *err);
/* The same, strict: data must be exactly one descriptor (trailing bytes: field total_size). */
hry_status hry_decode(const void *data, size_t len, hry_descriptor *out, hry_buffer_table *table,
                      hry_error *err);

/* Bytes hry_encode writes for d (checked). 0 when d breaks a rule. */
size_t hry_encoded_size(const hry_descriptor *d);
/* Encode d (checked first) into out[0 .. cap). `offsets` places its buffers in a carrier's
 * data region (n_offsets must equal the number of buffers; each non-empty buffer's offset a
 * multiple of 64); NULL lays them out canonically (back to back, 64-byte aligned, empty
 * buffers at 0). *written receives the size. Deterministic: equal descriptors give
 * identical bytes. */
hry_status hry_encode(const hry_descriptor *d, const uint64_t *offsets, uint32_t n_offsets,
                      void *out, size_t cap, size_t *written, hry_error *err);

/* Offsets that pack buffers of the given lengths back to back, each 64-byte aligned. */
void hry_canonical_offsets(const uint64_t *lengths, uint32_t n, uint64_t *offsets);

/* ------------------------------------------------------------------------------------
 * Checksums (the CRC-32 of zlib / ISO-HDLC, and SHA-256)
 * ------------------------------------------------------------------------------------ */

/* crc = hry_crc32(0, a, n); crc = hry_crc32(crc, b, m) ... equals zlib.crc32. */
uint32_t hry_crc32(uint32_t crc, const void *data, size_t len);

/* SHA-256's running state, caller-allocated; fixed by the algorithm, so it never grows. */
typedef struct hry_sha256 {
    uint32_t state[8];
    uint64_t length;
    uint8_t block[64];
    uint32_t used;
} hry_sha256;
void hry_sha256_init(hry_sha256 *s);
void hry_sha256_update(hry_sha256 *s, const void *data, size_t len);
void hry_sha256_final(hry_sha256 *s, uint8_t digest[32]);

/* ------------------------------------------------------------------------------------
 * DLPack (1.1 or later) — the struct definitions of DLPack 1.3, unless a dlpack.h was
 * included first. The library hands out the float8/float4 type codes and the
 * IS_SUBBYTE_TYPE_PADDED flag of DLPack 1.1, so an earlier dlpack.h is refused here rather
 * than silently used; a later 1.x one is used (its structs keep their layout).
 * ------------------------------------------------------------------------------------ */
#if defined(DLPACK_DLPACK_H_) || defined(DLPACK_MAJOR_VERSION)
#if !defined(DLPACK_MAJOR_VERSION) || !defined(DLPACK_MINOR_VERSION)
#error "hurray.h needs DLPack 1.1 or later (it carries 1.3), but the dlpack.h included before it is older than 1.0 (no DLPACK_MAJOR_VERSION): include a dlpack.h of version 1.1 or later before hurray.h, or none"
#elif DLPACK_MAJOR_VERSION > 1
#error "hurray.h needs DLPack 1.1 or later within major version 1 (it carries 1.3), but the dlpack.h included before it has a major version above 1, whose structs may differ: include a dlpack.h of version 1.1 or later (1.x) before hurray.h, or none"
#elif DLPACK_MAJOR_VERSION < 1 || DLPACK_MINOR_VERSION < 1
#error "hurray.h needs DLPack 1.1 or later (it carries 1.3), but the dlpack.h included before it is DLPack 1.0 (or older): include a dlpack.h of version 1.1 or later before hurray.h, or none"
#endif
#else
#define DLPACK_DLPACK_H_
#define DLPACK_MAJOR_VERSION 1
#define DLPACK_MINOR_VERSION 3
typedef struct { uint32_t major; uint32_t minor; } DLPackVersion;
typedef enum {
    kDLCPU = 1, kDLCUDA = 2, kDLCUDAHost = 3, kDLOpenCL = 4, kDLVulkan = 7, kDLMetal = 8,
    kDLVPI = 9, kDLROCM = 10, kDLROCMHost = 11, kDLExtDev = 12, kDLCUDAManaged = 13,
    kDLOneAPI = 14, kDLWebGPU = 15, kDLHexagon = 16, kDLMAIA = 17, kDLTrn = 18
} DLDeviceType;
typedef struct { DLDeviceType device_type; int32_t device_id; } DLDevice;
typedef enum {
    kDLInt = 0U, kDLUInt = 1U, kDLFloat = 2U, kDLOpaqueHandle = 3U, kDLBfloat = 4U,
    kDLComplex = 5U, kDLBool = 6U, kDLFloat8_e3m4 = 7U, kDLFloat8_e4m3 = 8U,
    kDLFloat8_e4m3b11fnuz = 9U, kDLFloat8_e4m3fn = 10U, kDLFloat8_e4m3fnuz = 11U,
    kDLFloat8_e5m2 = 12U, kDLFloat8_e5m2fnuz = 13U, kDLFloat8_e8m0fnu = 14U,
    kDLFloat6_e2m3fn = 15U, kDLFloat6_e3m2fn = 16U, kDLFloat4_e2m1fn = 17U
} DLDataTypeCode;
typedef struct { uint8_t code; uint8_t bits; uint16_t lanes; } DLDataType;
typedef struct {
    void *data;
    DLDevice device;
    int32_t ndim;
    DLDataType dtype;
    int64_t *shape;
    int64_t *strides;
    uint64_t byte_offset;
} DLTensor;
typedef struct DLManagedTensor {
    DLTensor dl_tensor;
    void *manager_ctx;
    void (*deleter)(struct DLManagedTensor *self);
} DLManagedTensor;
#define DLPACK_FLAG_BITMASK_READ_ONLY (1UL << 0UL)
#define DLPACK_FLAG_BITMASK_IS_COPIED (1UL << 1UL)
#define DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED (1UL << 2UL)
typedef struct DLManagedTensorVersioned {
    DLPackVersion version;
    void *manager_ctx;
    void (*deleter)(struct DLManagedTensorVersioned *self);
    uint64_t flags;
    DLTensor dl_tensor;
} DLManagedTensorVersioned;
#endif /* DLPACK_DLPACK_H_ */

/* ------------------------------------------------------------------------------------
 * Files (docs/spec/container.md)
 * ------------------------------------------------------------------------------------ */

#define HRY_FILE_HEADER_SIZE 128
#define HRY_FILE_FLAG_DATA_CHECKSUMS 0x0001u
#define HRY_MAX_NAME_BYTES 4096
#define HRY_MAX_KEY_BYTES 4096
#define HRY_MAX_METADATA_BYTES (16u << 20)
#define HRY_MAX_FILE_ALIGNMENT (1u << 21)

/* An open file: reference-counted. Opening gives one reference (released by
 * hry_file_close); every DLPack tensor handed out holds another. The mapping (or the
 * borrowed memory) stays valid until the last reference is gone. */
typedef struct hry_file hry_file;

/* Open flags. */
#define HRY_OPEN_VERIFY 0x1u  /* also check the data checksums and all padding (reads every byte) */

/* Open a file: read and check the header and index (every rule of container.md §3-§5),
 * then map the file read-only. No tensor byte is read unless HRY_OPEN_VERIFY. */
hry_status hry_file_open(const char *path, unsigned flags, hry_file **out, hry_error *err);
/* The same over bytes in memory (borrowed, not copied: they must stay valid and unchanged
 * until the file's last reference is released). */
hry_status hry_file_open_memory(const void *data, size_t len, unsigned flags, hry_file **out,
                                hry_error *err);
/* Check what the index does not cover: data checksums (when the file has them) and that
 * every padding byte is zero. After HRY_OK every byte of the file has been checked. */
hry_status hry_file_verify(const hry_file *f, hry_error *err);
/* Open + verify + close, for a path. */
hry_status hry_verify_path(const char *path, hry_error *err);

void hry_file_retain(hry_file *f);
void hry_file_release(hry_file *f);   /* the last release unmaps the file and frees it */
void hry_file_close(hry_file *f);     /* = hry_file_release; NULL is allowed */

/* Set struct_size = sizeof(hry_file_info) before hry_file_get_info (the rules of
 * hry_descriptor.struct_size: later versions append fields, the library fills only what the
 * caller's size covers and zeroes what it does not know of a larger one). */
typedef struct hry_file_info {
    uint32_t struct_size;             /* sizeof(hry_file_info) as the caller compiled it */
    uint8_t version_major, version_minor;
    uint16_t flags;                   /* HRY_FILE_FLAG_DATA_CHECKSUMS */
    uint32_t n_entries, n_metadata;
    uint32_t alignment;               /* every non-empty buffer's file offset is a multiple */
    uint64_t data_offset, data_length, file_size;
    const uint8_t *base;              /* the first byte of the file in memory */
    /* fields of later 2.x versions are appended here */
} hry_file_info;
/* Zero *info and set its struct_size to this header's size (inline: the caller's size). */
static inline void hry_file_info_init(hry_file_info *info)
{
    memset(info, 0, sizeof *info);
    info->struct_size = (uint32_t)sizeof *info;
}
/* HRY_E_ARGUMENT (field "struct_size") when info->struct_size is below the 2.0 size. */
hry_status hry_file_get_info(const hry_file *f, hry_file_info *info, hry_error *err);

/* One entry. Pointers are valid while the file is open (a reference is held).
 * Library-owned: fields are only appended, so never copy one by value or take its sizeof. */
typedef struct hry_entry {
    uint32_t position;                /* the i of entries[i] */
    const char *name;                 /* UTF-8, NUL-terminated (a name never contains NUL) */
    uint32_t name_length;             /* bytes, without the terminator */
    const uint8_t *descriptor_bytes;  /* the encoded descriptor as stored */
    uint32_t descriptor_length;
    int has_checksum;
    uint32_t checksum;                /* the stored CRC-32 of the buffers (if has_checksum) */
    hry_buffer_table buffers;         /* offsets relative to the data region */
    uint64_t nbytes;                  /* sum of the buffer lengths */
} hry_entry;

uint32_t hry_file_entry_count(const hry_file *f);
/* Entry i, or NULL when i is out of range. */
const hry_entry *hry_file_entry(const hry_file *f, uint32_t i);
/* The entry with this name (name_length bytes), or NULL. */
const hry_entry *hry_file_find(const hry_file *f, const char *name, size_t name_length);
/* The entry's descriptor (decoded again from the stored bytes, which were checked at open). */
hry_status hry_entry_descriptor(const hry_entry *e, hry_descriptor *out, hry_error *err);
/* A pointer to buffer j of entry e in the mapping, NULL for an empty buffer. */
const void *hry_file_buffer(const hry_file *f, const hry_entry *e, uint32_t j);

/* Metadata item k (key and value: UTF-8, NUL-terminated, lengths without the terminator). */
uint32_t hry_file_metadata_count(const hry_file *f);
hry_status hry_file_metadata(const hry_file *f, uint32_t k, const char **key, uint32_t *key_length,
                             const char **value, uint32_t *value_length);

/* Hand entry i out as a DLPack tensor, zero-copy: data points into the mapping,
 * DLPACK_FLAG_BITMASK_READ_ONLY is set (and IS_SUBBYTE_TYPE_PADDED for the padded form),
 * strides are always filled, an empty tensor has data == NULL. The tensor holds a reference
 * to the file: call its deleter exactly once (from any thread) when done. Dense entries only
 * (row-major or strided, not quantized); sparse, tiled, quantized, the 1-bit "bool" and a
 * dimension above 2^63 - 1 are HRY_E_UNSUPPORTED. */
hry_status hry_file_to_dlpack(hry_file *f, uint32_t i, DLManagedTensorVersioned **out,
                              hry_error *err);

/* ------------------------------------------------------------------------------------
 * Writing
 * ------------------------------------------------------------------------------------ */

typedef struct hry_writer hry_writer;

/* A writer laying out buffers on `alignment` (a power of two in 64 .. 2 MiB; 0 means 64),
 * storing CRC-32 data checksums when `checksums` is non-zero. */
hry_status hry_writer_new(uint32_t alignment, int checksums, hry_writer **out, hry_error *err);
void hry_writer_free(hry_writer *w);

/* Append a string metadata item (UTF-8; key 1 .. 4096 bytes without NUL, unique). */
hry_status hry_writer_add_metadata(hry_writer *w, const char *key, size_t key_length,
                                   const char *value, size_t value_length, hry_error *err);
/* Append a tensor: a checked, static descriptor and one pointer per buffer of its buffer
 * layout, in canonical order, each exactly as long as the layout says (NULL for an empty
 * one). The bytes are borrowed until hry_writer_save / hry_writer_serialize returns. A bool8
 * element byte other than 0 or 1 is refused (HRY_E_FORMAT, field "data"). */
hry_status hry_writer_add(hry_writer *w, const char *name, size_t name_length,
                          const hry_descriptor *d, const void *const *buffers, uint32_t n_buffers,
                          hry_error *err);

/* The size of the file the writer will produce. */
uint64_t hry_writer_file_size(const hry_writer *w);

#define HRY_SAVE_NO_FSYNC 0x1u  /* keep the atomic rename, skip the fsyncs */

/* Write the file atomically: a temporary file ".NAME.RANDOM.tmp" in the target's directory,
 * data first then the index, fsync, rename over `path`, fsync of the directory. On any
 * failure the temporary is removed and the old file (if any) is left as it was. */
hry_status hry_writer_save(hry_writer *w, const char *path, unsigned flags, hry_error *err);
/* The same bytes into memory: out[0 .. cap), cap >= hry_writer_file_size(w). */
hry_status hry_writer_serialize(hry_writer *w, void *out, size_t cap, hry_error *err);

#if defined(__GNUC__) || defined(__clang__)
#pragma GCC visibility pop
#endif

#ifdef __cplusplus
}
#endif

#endif /* HURRAY_H */
