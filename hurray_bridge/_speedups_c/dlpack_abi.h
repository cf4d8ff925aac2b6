/* The DLPack 1.3 C ABI, as far as hurray_bridge._speedups uses it (not installed).
 *
 * Written from the layouts docs/impl/c-ffi.md §2 pins (and tests/hurray_bridge/test_dlpack_abi.py
 * checks from Python): the structs, flags and the C exchange API table of dlpack.h
 * v1.3. Only the names this extension needs; field order and types are the header's,
 * so the layout is the header's on every C ABI.
 */
#ifndef HURRAY_DLPACK_ABI_H
#define HURRAY_DLPACK_ABI_H

#include <stdint.h>

#define HB_DLPACK_MAJOR 1
#define HB_DLPACK_MINOR 3

/* DLManagedTensorVersioned.flags */
#define HB_DLFLAG_READ_ONLY (UINT64_C(1) << 0)
#define HB_DLFLAG_IS_COPIED (UINT64_C(1) << 1)
#define HB_DLFLAG_SUBBYTE_PADDED (UINT64_C(1) << 2)

/* DLDeviceType values the extension names */
#define HB_KDL_CPU 1
#define HB_KDL_COMPLEX 5 /* DLDataTypeCode kDLComplex */

typedef struct {
    uint32_t major;
    uint32_t minor;
} HbDLPackVersion;

typedef struct {
    int32_t device_type;
    int32_t device_id;
} HbDLDevice;

typedef struct {
    uint8_t code;
    uint8_t bits;
    uint16_t lanes;
} HbDLDataType;

typedef struct {
    void *data;
    HbDLDevice device;
    int32_t ndim;
    HbDLDataType dtype;
    int64_t *shape;
    int64_t *strides;
    uint64_t byte_offset;
} HbDLTensor;

/* The legacy (unversioned) managed tensor: DLTensor first. */
typedef struct HbDLManagedTensor {
    HbDLTensor dl_tensor;
    void *manager_ctx;
    void (*deleter)(struct HbDLManagedTensor *self);
} HbDLManagedTensor;

/* DLPack >= 1.0: version first, DLTensor last. */
typedef struct HbDLManagedTensorVersioned {
    HbDLPackVersion version;
    void *manager_ctx;
    void (*deleter)(struct HbDLManagedTensorVersioned *self);
    uint64_t flags;
    HbDLTensor dl_tensor;
} HbDLManagedTensorVersioned;

/* The C exchange API (DLPack 1.3): a static table a producer type publishes as
 * type(x).__dlpack_c_exchange_api__, a PyCapsule named "dlpack_exchange_api". Every
 * function but the allocator returns 0, or -1 with a Python exception set, and needs
 * the GIL; none synchronises streams. */
typedef int (*HbDLAllocator)(HbDLTensor *prototype, HbDLManagedTensorVersioned **out,
                             void *error_ctx,
                             void (*set_error)(void *error_ctx, const char *kind,
                                               const char *message));
typedef int (*HbDLManagedFromPy)(void *py_object, HbDLManagedTensorVersioned **out);
typedef int (*HbDLManagedToPy)(HbDLManagedTensorVersioned *tensor, void **out_py_object);
typedef int (*HbDLTensorFromPy)(void *py_object, HbDLTensor *out);
typedef int (*HbDLCurrentStream)(int32_t device_type, int32_t device_id, void **out_stream);

typedef struct HbDLPackExchangeAPIHeader {
    HbDLPackVersion version;
    struct HbDLPackExchangeAPIHeader *prev_api;
} HbDLPackExchangeAPIHeader;

typedef struct {
    HbDLPackExchangeAPIHeader header;
    HbDLAllocator managed_tensor_allocator;
    HbDLManagedFromPy managed_tensor_from_py_object_no_sync;
    HbDLManagedToPy managed_tensor_to_py_object_no_sync;
    HbDLTensorFromPy dltensor_from_py_object_no_sync; /* may be NULL */
    HbDLCurrentStream current_work_stream;
} HbDLPackExchangeAPI;

#define HB_EXCHANGE_API_NAME "dlpack_exchange_api"

#endif /* HURRAY_DLPACK_ABI_H */
