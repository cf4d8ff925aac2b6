/* The CRC-32 of zlib.crc32 (ISO-HDLC: reflected polynomial 0xEDB88320, initial and final XOR
 * 0xFFFFFFFF): the same value for the same bytes.
 *
 * Where the CPU multiplies without carries (x86 PCLMULQDQ, asked at run time), 64 bytes a
 * step are folded into four 128-bit remainders, 128 bytes into eight with VPCLMULQDQ on
 * 256-bit registers (AVX2: AMD Zen 3 and later without AVX-512), or 256 bytes into sixteen
 * with AVX-512 (5 to 13 times zlib 1.2's speed); anywhere else, and for the few bytes
 * before and after, a table of 256 remainders a byte.
 * This is the one CRC-32 of the project: the C library's hry_crc32, and the compiled Python
 * module's crc32() (hurray_bridge/_speedups_c/crc32.c wraps it; hurray_bridge.container uses it
 * only where CRC32_CLMUL is true, zlib.crc32 otherwise).
 *
 * The folding. Read the bytes as one polynomial over GF(2), the first byte's low bit the
 * highest power (the reflected order of this CRC). A 128-bit lane loaded little-endian then
 * has bit j as the coefficient of x^(127-j), and a 64-bit half h as h(x) with bit i the
 * coefficient of x^(63-i); the carry-less product of two such halves, read as 128 bits the
 * same way, is a(x)b(x)x. Moving a 128-bit remainder A = lo(x)x^64 + hi(x) forward by D bits
 * (so that the next D bits can be added) is A(x)x^D mod P, which is clmul(lo, x^(D+63) mod P)
 * ^ clmul(hi, x^(D-1) mod P): congruent, not reduced, and 96 bits at most. Four remainders
 * fold by 512 bits; at the end they fold into one, and since the CRC of any bytes is their
 * polynomial times x^32 mod P, the CRC is that of the remainder's 16 bytes, through the
 * table, followed by the bytes left over.
 */
#include "internal.h"

#include <pthread.h>
#include <string.h>

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#define HB_CLMUL 1
#include <immintrin.h>
#endif

static uint32_t crc_table[256];
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;

/* The register (already inverted) carried over n bytes, one table step a byte. */
static uint32_t
crc_bytes(uint32_t reg, const unsigned char *p, size_t n)
{
    while (n--) {
        reg = crc_table[(reg ^ *p++) & 0xFF] ^ (reg >> 8);
    }
    return reg;
}

#ifdef HB_CLMUL
/* The two constants that move a remainder forward by D bits, as _mm_set_epi64x(high
 * half's, low half's): by 128, 256, 384, 512 bits (one to four lanes), 768 and 1024 (three
 * and four 256-bit registers), and 1536 and 2048 (three and four 512-bit registers). */
enum { BY128, BY256, BY384, BY512, BY768, BY1024, BY1536, BY2048, N_DISTANCES };
static const unsigned distance_bits[N_DISTANCES] = {128, 256, 384, 512, 768, 1024, 1536,
                                                    2048};
static uint64_t fold_k[N_DISTANCES][2];

/* x^n mod P with bit d the coefficient of x^d (P = x^32 + 0x04C11DB7's terms). */
static uint32_t
xpow_mod(unsigned n)
{
    uint32_t r = 1;
    while (n--) {
        r = (r << 1) ^ ((r & 0x80000000u) ? 0x04C11DB7u : 0);
    }
    return r;
}

/* A remainder of degree < 32 as the high half of a 64-bit lane: bit i is x^(63-i). */
static uint64_t
lane_of(uint32_t r)
{
    uint64_t out = 0;
    for (int d = 0; d < 32; d++) {
        if (r & ((uint32_t)1 << d)) {
            out |= (uint64_t)1 << (63 - d);
        }
    }
    return out;
}

#define HB_SSE_CLMUL __attribute__((target("pclmul,sse2")))
#define HB_AVX2_CLMUL __attribute__((target("avx2,vpclmulqdq,pclmul,sse2")))
#define HB_AVX512_CLMUL __attribute__((target("avx512f,avx2,vpclmulqdq,pclmul,sse2")))
#define LOAD128(q) _mm_loadu_si128((const __m128i *)(const void *)(q))

HB_SSE_CLMUL static inline __m128i
k128(int by)
{
    return _mm_set_epi64x((long long)fold_k[by][0], (long long)fold_k[by][1]);
}

HB_SSE_CLMUL static inline __m128i
fold(__m128i x, __m128i k, __m128i add)
{
    __m128i lo = _mm_clmulepi64_si128(x, k, 0x00);
    __m128i hi = _mm_clmulepi64_si128(x, k, 0x11);
    return _mm_xor_si128(_mm_xor_si128(lo, hi), add);
}

/* The register carried over the 16-byte remainder x and then the n bytes at p. */
HB_SSE_CLMUL static uint32_t
crc_finish(__m128i x, const unsigned char *p, size_t n)
{
    const __m128i k1 = k128(BY128);
    while (n >= 16) {
        x = fold(x, k1, LOAD128(p));
        p += 16;
        n -= 16;
    }
    unsigned char rest[16];
    _mm_storeu_si128((__m128i *)(void *)rest, x);
    return crc_bytes(crc_bytes(0, rest, sizeof rest), p, n);
}

/* The register carried over n >= 64 bytes, four 128-bit lanes at a time. */
HB_SSE_CLMUL static uint32_t
crc_sse(uint32_t reg, const unsigned char *p, size_t n)
{
    const __m128i k4 = k128(BY512);
    __m128i a0 = _mm_xor_si128(LOAD128(p), _mm_cvtsi32_si128((int)reg));  /* over bytes 0-3 */
    __m128i a1 = LOAD128(p + 16), a2 = LOAD128(p + 32), a3 = LOAD128(p + 48);
    p += 64;
    n -= 64;
    while (n >= 64) {
        a0 = fold(a0, k4, LOAD128(p));
        a1 = fold(a1, k4, LOAD128(p + 16));
        a2 = fold(a2, k4, LOAD128(p + 32));
        a3 = fold(a3, k4, LOAD128(p + 48));
        p += 64;
        n -= 64;
    }
    __m128i x = fold(a0, k128(BY384), fold(a1, k128(BY256), fold(a2, k128(BY128), a3)));
    return crc_finish(x, p, n);
}

HB_AVX2_CLMUL static inline __m256i
k256(int by)
{
    return _mm256_broadcastsi128_si256(k128(by));
}

HB_AVX2_CLMUL static inline __m256i
fold2(__m256i x, __m256i k, __m256i add)
{
    __m256i lo = _mm256_clmulepi64_epi128(x, k, 0x00);
    __m256i hi = _mm256_clmulepi64_epi128(x, k, 0x11);
    return _mm256_xor_si256(_mm256_xor_si256(lo, hi), add);
}

#define LOAD256(q) _mm256_loadu_si256((const __m256i *)(const void *)(q))

/* The register carried over n >= 128 bytes, eight 128-bit lanes (four registers) at a
 * time: lane i of each register folds by 1024 bits, as the four lanes of crc_sse by 512. */
HB_AVX2_CLMUL static uint32_t
crc_avx2(uint32_t reg, const unsigned char *p, size_t n)
{
    const __m256i k = k256(BY1024);
    __m256i first = _mm256_zextsi128_si256(_mm_cvtsi32_si128((int)reg));
    __m256i z0 = _mm256_xor_si256(LOAD256(p), first);
    __m256i z1 = LOAD256(p + 32), z2 = LOAD256(p + 64), z3 = LOAD256(p + 96);
    p += 128;
    n -= 128;
    while (n >= 128) {
        z0 = fold2(z0, k, LOAD256(p));
        z1 = fold2(z1, k, LOAD256(p + 32));
        z2 = fold2(z2, k, LOAD256(p + 64));
        z3 = fold2(z3, k, LOAD256(p + 96));
        p += 128;
        n -= 128;
    }
    __m256i z = fold2(z0, k256(BY768), fold2(z1, k256(BY512), fold2(z2, k256(BY256), z3)));
    __m128i x = fold(_mm256_castsi256_si128(z), k128(BY128), _mm256_extracti128_si256(z, 1));
    return crc_finish(x, p, n);
}

HB_AVX512_CLMUL static inline __m512i
k512(int by)
{
    return _mm512_broadcast_i32x4(k128(by));
}

HB_AVX512_CLMUL static inline __m512i
fold4(__m512i x, __m512i k, __m512i add)
{
    __m512i lo = _mm512_clmulepi64_epi128(x, k, 0x00);
    __m512i hi = _mm512_clmulepi64_epi128(x, k, 0x11);
    return _mm512_xor_si512(_mm512_xor_si512(lo, hi), add);
}

/* The register carried over n >= 256 bytes, sixteen 128-bit lanes (four registers) at a
 * time: lane i of each register folds by 2048 bits, as the four lanes of crc_sse by 512. */
HB_AVX512_CLMUL static uint32_t
crc_avx512(uint32_t reg, const unsigned char *p, size_t n)
{
    const __m512i k = k512(BY2048);
    __m512i first = _mm512_inserti32x4(_mm512_setzero_si512(), _mm_cvtsi32_si128((int)reg), 0);
    __m512i z0 = _mm512_xor_si512(_mm512_loadu_si512(p), first);
    __m512i z1 = _mm512_loadu_si512(p + 64), z2 = _mm512_loadu_si512(p + 128);
    __m512i z3 = _mm512_loadu_si512(p + 192);
    p += 256;
    n -= 256;
    while (n >= 256) {
        z0 = fold4(z0, k, _mm512_loadu_si512(p));
        z1 = fold4(z1, k, _mm512_loadu_si512(p + 64));
        z2 = fold4(z2, k, _mm512_loadu_si512(p + 128));
        z3 = fold4(z3, k, _mm512_loadu_si512(p + 192));
        p += 256;
        n -= 256;
    }
    __m512i z = fold4(z0, k512(BY1536), fold4(z1, k512(BY1024), fold4(z2, k512(BY512), z3)));
    __m128i x = fold(_mm512_extracti32x4_epi32(z, 0), k128(BY384),
                     fold(_mm512_extracti32x4_epi32(z, 1), k128(BY256),
                          fold(_mm512_extracti32x4_epi32(z, 2), k128(BY128),
                               _mm512_extracti32x4_epi32(z, 3))));
    return crc_finish(x, p, n);
}
#endif

/* The ways crc_update can take: 0 the table, 1 128-bit carry-less multiplication, 2 that
 * with 256-bit registers (AVX2), 3 with 512-bit ones (AVX-512). A CPU that has a way has
 * every way before it (the tests run each). */
enum { CRC_TABLE, CRC_SSE, CRC_AVX2, CRC_AVX512 };
static int crc_best = CRC_TABLE;

static void
crc_setup(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) {
            c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        }
        crc_table[i] = c;
    }
#ifdef HB_CLMUL
    for (int d = 0; d < N_DISTANCES; d++) {
        fold_k[d][0] = lane_of(xpow_mod(distance_bits[d] - 1));   /* the high half's */
        fold_k[d][1] = lane_of(xpow_mod(distance_bits[d] + 63));  /* the low half's */
    }
    __builtin_cpu_init();
    if (__builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse2")) {
        crc_best = CRC_SSE;
        if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("vpclmulqdq")) {
            crc_best = CRC_AVX2;
            if (__builtin_cpu_supports("avx512f")) {
                crc_best = CRC_AVX512;
            }
        }
    }
#endif
}

uint32_t
hry__crc32_by(int way, uint32_t crc, const void *data, size_t n)
{
    const unsigned char *p = data;
    uint32_t reg = ~crc;
    pthread_once(&crc_once, crc_setup);
#ifdef HB_CLMUL
    if (way == CRC_AVX512 && n >= 256) {
        return ~crc_avx512(reg, p, n);
    }
    if (way >= CRC_AVX2 && n >= 128) {
        return ~crc_avx2(reg, p, n);
    }
    if (way >= CRC_SSE && n >= 64) {
        return ~crc_sse(reg, p, n);
    }
#else
    (void)way;
#endif
    return ~crc_bytes(reg, p, n);
}


int
hry__crc32_ways(void)
{
    pthread_once(&crc_once, crc_setup);
    return crc_best + 1;
}

uint32_t
hry_crc32(uint32_t crc, const void *data, size_t len)
{
    pthread_once(&crc_once, crc_setup);
    return hry__crc32_by(crc_best, crc, data, len);
}

/* Polynomials modulo the CRC-32 polynomial, reflected as the CRC register holds them
 * (bit 31 is the coefficient of x^0). */
static uint32_t
poly_mul(uint32_t a, uint32_t b)
{
    uint32_t product = 0;
    for (int i = 0; i < 32; i++) {
        if (a & (0x80000000u >> i)) {
            product ^= b;  /* a has x^i: add b * x^i */
        }
        b = (b & 1) ? (b >> 1) ^ 0xEDB88320u : b >> 1;  /* b *= x */
    }
    return product;
}

/* The CRC-32 of A + B from that of A (crc1) and that of B (crc2, len2 bytes): crc1 times
 * x^(8 len2), plus crc2 (the pre- and post-conditioning cancel out). */
uint32_t
hry__crc32_combine(uint32_t crc1, uint32_t crc2, uint64_t len2)
{
    uint32_t shift = 0x80000000u, square = 0x00800000u;  /* x^0, x^8 */
    for (uint64_t n = len2; n; n >>= 1) {
        if (n & 1) {
            shift = poly_mul(shift, square);
        }
        square = poly_mul(square, square);
    }
    return poly_mul(shift, crc1) ^ crc2;
}
