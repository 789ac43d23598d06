/*
 * cmf_types.h — definitions shared by the host API (cmf.h) and the plugin
 * ABI (cmf_plugin.h). Plain C99. Everything here is append-only: a value,
 * once shipped, keeps its meaning forever.
 */
#ifndef CMF_TYPES_H
#define CMF_TYPES_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Symbol visibility for libcmf's exported functions. */
#if defined(_WIN32)
#  define CMF_API __declspec(dllexport)
#elif defined(__GNUC__)
#  define CMF_API __attribute__((visibility("default")))
#else
#  define CMF_API
#endif

/*
 * Errors. A fallible call returns `cmf_error *`: NULL means success; anything
 * else is an error object owned by the caller, released with cmf_error_free()
 * (host API) or handed back to the host (plugins). There is no thread-local
 * "last error". On error, out-parameters are left untouched.
 *
 * Codes are int32_t values (never a C enum in a signature). The container
 * kinds mirror the CMF v2 specification's error kinds one to one.
 */
typedef struct cmf_error cmf_error;

#define CMF_ERR_INVALID_ARGUMENT     1  /* a caller passed something unusable       */
#define CMF_ERR_IO                   2  /* read/write/mmap/rename failed             */
#define CMF_ERR_FILE_NOT_FOUND       3  /* spec: FileNotFound                        */
#define CMF_ERR_INVALID_MAGIC        4  /* spec: InvalidMagic                        */
#define CMF_ERR_UNSUPPORTED_VERSION  5  /* spec: UnsupportedVersion                  */
#define CMF_ERR_UNSUPPORTED_FEATURE  6  /* spec: UnsupportedFeature                  */
#define CMF_ERR_UNKNOWN_DTYPE        7  /* spec: UnknownDtype (also: no codec)       */
#define CMF_ERR_MISSING_TENSOR       8  /* spec: MissingTensor                       */
#define CMF_ERR_BOUNDS               9  /* spec: Bounds                              */
#define CMF_ERR_PARSE               10  /* spec: Parse                               */
#define CMF_ERR_HASH_MISMATCH       11  /* verify found a hash that does not match   */
#define CMF_ERR_SIGNATURE           12  /* detached signature missing/invalid/untrusted */
#define CMF_ERR_PLUGIN              13  /* a plugin could not be loaded or refused   */
#define CMF_ERR_UNSUPPORTED         14  /* valid request this build cannot serve     */
#define CMF_ERR_OUT_OF_MEMORY       15
#define CMF_ERR_CANCELLED           16  /* stopped by an abort/cancel callback       */
#define CMF_ERR_NOT_FOUND           17  /* a named thing (not a tensor) is absent    */
#define CMF_ERR_TEMPLATE            18  /* a chat template raised or failed          */
#define CMF_ERR_INTERNAL            19  /* a bug: please report                       */
#define CMF_ERR_BUSY                20  /* a queue is full: try again later           */

/* Component kinds registered by plugins. */
#define CMF_COMPONENT_CODEC   1
#define CMF_COMPONENT_ARCH    2
#define CMF_COMPONENT_BACKEND 3

/* CMF v2 dtype ids (spec §3.1; q2tp, id 16, is written by the original although
 * the spec text does not list it). Ids are never reused. */
#define CMF_DTYPE_F32       0
#define CMF_DTYPE_F16       1
#define CMF_DTYPE_BF16      2
#define CMF_DTYPE_Q8_ROW    3
#define CMF_DTYPE_Q4_BLOCK  4
#define CMF_DTYPE_MIX8_4    5  /* reserved */
#define CMF_DTYPE_U8        6  /* reserved (raw bytes) */
#define CMF_DTYPE_Q4_COL    7  /* reserved */
#define CMF_DTYPE_VBIT      8
#define CMF_DTYPE_Q8_2F     9
#define CMF_DTYPE_VBIT_RO  10
#define CMF_DTYPE_Q4_TILED 11
#define CMF_DTYPE_Q1       12
#define CMF_DTYPE_Q1S      13
#define CMF_DTYPE_Q1T      14
#define CMF_DTYPE_Q4TP     15
#define CMF_DTYPE_Q2TP     16

/* Codec dtype ids: 0..255 are the file dtypes (the spec's CMF_DTYPE_* and
 * third parties' own; a file's directory stores the id in one byte).
 * CMF_DTYPE_MEMORY_FIRST.. CMF_DTYPE_MEMORY_LAST are memory-only dtypes:
 * layouts that no file can name, which a codec makes from a file dtype's
 * payload for its own kernels (cmf_codec_vt.decode_copy). */
#define CMF_DTYPE_MEMORY_FIRST 512
#define CMF_DTYPE_MEMORY_LAST  1023
/* q4_block's payload with each row's group scales after that row's
 * nibbles (rows of 16*gpr nibble bytes then 2*gpr f16 scale bytes, gpr =
 * cols / 32), what q4_block's decode_copy makes: a decode row reads one
 * stream. 2-D, cols % 32 == 0. */
#define CMF_DTYPE_MEM_Q4_ROWS 512
/* q1's payload of a 2-D matrix with cols % 512 == 0, each row in steps of
 * 16 groups (96 bytes): 64 lane bytes, bit t of byte 4j+i = bit 4t+i of
 * group j's 32 bits, then the 16 groups' f16 scales. What q1's
 * decode_copy makes where its AVX-512 kernel runs: the bytes a pass of 64
 * weights multiplies are then one GFNI affine operation on the lane bytes,
 * not a word permute and a bit shuffle. */
#define CMF_DTYPE_MEM_Q1_PASSES 513
/* q1t's base of a 2-D matrix without an overlay, cols % 512 == 0: each
 * row in steps of 16 groups (160 bytes): 64 lane bytes for passes 0-3, 64
 * for passes 4-7, then the 16 groups' f16 scales; bits 2(t%4) and
 * 2(t%4)+1 of byte 4j+i of half t/4 hold w+1 of element 4t+i of group j
 * (0 for -1, 1 for 0, 2 for +1; a 3, never written, reads as +2). What
 * q1t's decode_copy makes where its AVX-512 kernel runs. */
#define CMF_DTYPE_MEM_Q1T_PASSES 514
/* q1s of a 2-D matrix, cols % 512 == 0, its outlier indices strictly
 * ascending: the base as CMF_DTYPE_MEM_Q1_PASSES, then u32
 * first_step[S + 1] (S = ceil(rows / 16) slices), then u8 lane_row[16 S],
 * then from the next multiple of 64 bytes the slices' steps of 96 bytes:
 * 16 u16 columns, then 16 f32 corrections (value - base value). Slice i
 * lies in the window of rows 64 (i / 4) .. 64 (i / 4) + 63; its lane l
 * holds the outliers of row 64 (i / 4) + lane_row[16 i + l] (0xFF: none)
 * in ascending column order, a column >= cols an empty slot; each
 * window's rows go to its slices fullest first. What q1s's decode_copy
 * makes where q1's does (and base value + correction gives every value
 * back): the overlay is then one gather of x per 16 rows, each row summed
 * in its own lane. */
#define CMF_DTYPE_MEM_Q1S_PASSES 515

/* required_features bits of the envelope (spec §1.1). */
#define CMF_FEATURE_TENSOR_DIR    0x01u
#define CMF_FEATURE_BINARY_MASKS  0x02u
#define CMF_FEATURE_QUANT_2F      0x04u
#define CMF_FEATURE_DELTA_MASKS   0x08u /* reserved: refused */
#define CMF_FEATURE_HOT_PACKS     0x10u /* reserved: refused */
#define CMF_FEATURE_LOOP_MASKS    0x20u
#define CMF_FEATURE_SKILL_FILE    0x40u
#define CMF_FEATURES_SUPPORTED    0x67u

/* A tensor's shape has at most this many dimensions in a CMF v2 directory. */
#define CMF_MAX_DIMS 6

/* Log levels for log callbacks. */
#define CMF_LOG_ERROR 0
#define CMF_LOG_WARN  1
#define CMF_LOG_INFO  2
#define CMF_LOG_DEBUG 3

/*
 * A borrowed, read-only view of one stored tensor: what a codec or a backend
 * needs to interpret a payload. `data` points into the file mapping (or a
 * caller's buffer) and is valid as long as its owner says (the model for
 * cmf_tensor views). `struct_size` first: fields are only ever appended.
 *
 * `facts` carries what the dtype's codec established about these very bytes
 * when the host validated them at load (cmf_codec_vt.validate_facts), so its
 * kernels need not establish it again on every call (q1s: that its outlier
 * list ascends, which lets a row range find its entries by binary search
 * instead of reading the whole list). The bits mean what that codec says;
 * 0 means nothing is known and is always correct. Facts are of the bytes,
 * not of the shape: a view that reshapes the same payload keeps them. A
 * producer that did not get the facts from the codec for these exact bytes
 * (a copy, a selection, a caller's buffer) writes 0 (the member
 * was reserved, zero, before: views from older producers say "nothing
 * known"). A set bit is a promise, like `data` and `nbytes`: a codec may
 * compute a different result from bytes that break it, but must still read
 * nothing outside the payload.
 */
typedef struct cmf_tensor_view {
    uint32_t struct_size;   /* sizeof(cmf_tensor_view) as the producer knows it */
    int32_t dtype;          /* CMF_DTYPE_* */
    uint32_t ndim;          /* 0..CMF_MAX_DIMS */
    uint32_t facts;         /* the codec's facts about the payload, or 0 (above) */
    uint64_t shape[CMF_MAX_DIMS];
    const void *data;       /* payload bytes */
    uint64_t nbytes;        /* payload length */
} cmf_tensor_view;

/*
 * A byte sink: where a producer of variable-length bytes writes them
 * (quantizers, JSON emitters). `append` may be called any number of times;
 * it returns NULL or an error created by whoever owns the sink.
 */
typedef struct cmf_byte_sink {
    uint32_t struct_size;
    uint32_t reserved0;
    void *user;
    cmf_error *(*append)(void *user, const void *data, size_t n);
} cmf_byte_sink;

#ifdef __cplusplus
}
#endif

#endif /* CMF_TYPES_H */
