/* lockmq._speedups: the broker's per-record hot path in C (issue #14).
 *
 * Optional: lockmq.accel imports it when it was built, and the pure-Python code it
 * mirrors stays the fallback and the reference (tests/protocol/test_accel*.py hold
 * the two equal, on vectors and on random bytes). Three jobs, one call per read or
 * per batch so that Python<->C crossings are few:
 *
 *   scan_publishes  a read's leading run of valid PUBLISH frames -> field tuples
 *                   (everything else -- other opcodes, bad or partial frames, frame
 *                   MACs, another SN -- is left to the Python decoder, which raises
 *                   the protocol's own errors, so error behaviour cannot drift);
 *   encode_records  NewRecords -> commit-log record bytes (store/records.py);
 *   publish_acks    store results -> the PUBLISH_ACK frames of one answer;
 *   scan_frame      one whole, valid frame of any known opcode (the handshake's
 *                   CONNECT and AUTH) -> its fields, or None for the Python decoder.
 *   scan_sealed_publishes  scan_publishes for a session with frame MACs (SHA-256
 *                   and the tags in C: mac_pads, frame_tag).
 *   Lane            a lock's steady publish reads and their acks, several sockets
 *                   per Python call (broker/lane.py).
 *   encode_leases   a pull's leases -> the MESSAGES body (none with headers or retries).
 *   read_run        a consumer read's records from one pread -> StoredRecords.
 *   messages_fields a MESSAGES body -> one tuple per message (the consumer client's
 *                   fetch; None for anything the Python decoder would refuse).
 *
 * Memory safety: every read of the input is bounds-checked against the buffer's
 * length before it happens; outputs are new objects (no buffer reused across calls).
 * Byte layouts: protocol/SPEC.md (frames) and host/lockmq/store/FORMAT.md (records).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>   /* T_OBJECT_EX: a __slots__ member */
#include <stdint.h>
#include <string.h>
#include <errno.h>
#include <limits.h>
#include <unistd.h>

/* protocol/_constants.py */
#define VERSION 1
#define HEADER_SIZE 8      /* version u8, length u32, opcode u16, sn_len u8 */
#define SUBHEADER_SIZE 5   /* flags u8, opaque u32 */
#define CRC_SIZE 2
#define MIN_FRAME (HEADER_SIZE + SUBHEADER_SIZE + CRC_SIZE)
#define MAX_SN 64
#define OP_PUBLISH 0x10
#define OP_PUBLISH_ACK 0x11
#define FLAG_ONEWAY 0x01
#define FLAG_RESPONSE 0x02
#define FLAG_MAC 0x04
#define ACK_FRAME_LEN (MIN_FRAME + 9)   /* empty SN; body: status u8, offset u64 */
#define ACK_STORED 0
#define ACK_DUPLICATE 1

/* host/lockmq/store/records.py */
#define RECORD_HEADER 40
#define FORMAT_VERSION 1
#define FLAG_SYSTEM 0x01
#define MAX_SN_LEN 255
#define MAX_SEQ 0xFFFFFFFFULL

/* ---------------------------------------------------------------- checksums */

static uint16_t crc16_table[8][256];  /* CRC-16/CCITT-FALSE, poly 0x1021, slicing by 8 */
static uint32_t crc32_table[8][256];  /* zlib's CRC-32, slicing by 8 */

static void init_tables(void)
{
    for (int i = 0; i < 256; i++) {
        uint16_t c = (uint16_t)(i << 8);
        for (int k = 0; k < 8; k++)
            c = (c & 0x8000) ? (uint16_t)((c << 1) ^ 0x1021) : (uint16_t)(c << 1);
        crc16_table[0][i] = c;
        uint32_t d = (uint32_t)i;
        for (int k = 0; k < 8; k++)
            d = (d & 1) ? (d >> 1) ^ 0xEDB88320u : d >> 1;
        crc32_table[0][i] = d;
    }
    for (int i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++) {
            crc32_table[t][i] = (crc32_table[t - 1][i] >> 8)
                                ^ crc32_table[0][crc32_table[t - 1][i] & 0xFF];
            /* byte i followed by t zero bytes (CRC-16 is MSB first) */
            crc16_table[t][i] = (uint16_t)((crc16_table[t - 1][i] << 8)
                                           ^ crc16_table[0][crc16_table[t - 1][i] >> 8]);
        }
}

static uint16_t crc16(const uint8_t *p, Py_ssize_t n, uint16_t crc)
{
    /* eight bytes per step: every frame in and every ack out is checked whole (a
     * byte at a time, this was ~2 % of the broker's CPU at one record per read) */
    while (n >= 8) {
        crc = (uint16_t)(crc16_table[7][p[0] ^ (crc >> 8)] ^ crc16_table[6][p[1] ^ (crc & 0xFF)]
                         ^ crc16_table[5][p[2]] ^ crc16_table[4][p[3]]
                         ^ crc16_table[3][p[4]] ^ crc16_table[2][p[5]]
                         ^ crc16_table[1][p[6]] ^ crc16_table[0][p[7]]);
        p += 8;
        n -= 8;
    }
    while (n--)
        crc = (uint16_t)((crc << 8) ^ crc16_table[0][((crc >> 8) ^ *p++) & 0xFF]);
    return crc;
}

static uint32_t crc32(const uint8_t *p, Py_ssize_t n, uint32_t crc)
{
    crc = ~crc;
    /* eight bytes per step: records are hashed whole, payloads can be kilobytes */
    while (n >= 8) {
        uint32_t lo = crc ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8
                             | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
        crc = crc32_table[7][lo & 0xFF] ^ crc32_table[6][(lo >> 8) & 0xFF]
            ^ crc32_table[5][(lo >> 16) & 0xFF] ^ crc32_table[4][lo >> 24]
            ^ crc32_table[3][p[4]] ^ crc32_table[2][p[5]]
            ^ crc32_table[1][p[6]] ^ crc32_table[0][p[7]];
        p += 8;
        n -= 8;
    }
    while (n--)
        crc = (crc >> 8) ^ crc32_table[0][(crc ^ *p++) & 0xFF];
    return ~crc;
}

/* ------------------------------------------------------------ byte helpers */

static uint32_t be32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static uint64_t be64(const uint8_t *p)
{
    return (uint64_t)be32(p) << 32 | be32(p + 4);
}

static void put_be32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24); p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8); p[3] = (uint8_t)v;
}

static void put_be64(uint8_t *p, uint64_t v)
{
    put_be32(p, (uint32_t)(v >> 32));
    put_be32(p + 4, (uint32_t)v);
}

static uint32_t le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t le64(const uint8_t *p)
{
    return (uint64_t)le32(p) | (uint64_t)le32(p + 4) << 32;
}

static void put_le16(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8);
}

static void put_le32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16); p[3] = (uint8_t)(v >> 24);
}

static void put_le64(uint8_t *p, uint64_t v)
{
    put_le32(p, (uint32_t)v);
    put_le32(p + 4, (uint32_t)(v >> 32));
}

/* ---------------------------------------------------------- scan_publishes */

/* What check_publish says of the bytes at a frame's start. */
enum { FRAME_STOP, FRAME_PARTIAL, FRAME_TAKE };

/* The Python decoder's and session's checks, in the decoder's order, of the frame
 * at ``f`` (``avail`` bytes there) for a PUBLISH this C code may take: FRAME_TAKE (whole,
 * valid, a PUBLISH under the session's SN ``sn``, its MAC flag ``mac``; ``*length``
 * set), FRAME_PARTIAL (no bad header yet, not whole yet) or FRAME_STOP (anything else:
 * the Python path's). A sealed frame's tag is check_sealed_publish's to check. */
static int check_publish_as(const uint8_t *f, Py_ssize_t avail, Py_ssize_t max_frame,
                            const char *sn, Py_ssize_t sn_size, uint8_t mac, uint32_t *length)
{
    if (avail < HEADER_SIZE)
        return FRAME_PARTIAL;
    Py_ssize_t sn_len = f[7];
    uint32_t len = be32(f + 1);
    if (f[0] != VERSION || sn_len > MAX_SN || len < (uint32_t)(MIN_FRAME + sn_len)
            || (Py_ssize_t)len > max_frame)
        return FRAME_STOP;
    if ((Py_ssize_t)len > avail)
        return FRAME_PARTIAL;
    if (crc16(f, len - CRC_SIZE, 0xFFFF) != (f[len - 2] << 8 | f[len - 1]))
        return FRAME_STOP;
    if ((uint16_t)(f[5] << 8 | f[6]) != OP_PUBLISH || (f[HEADER_SIZE + sn_len] & FLAG_MAC) != mac)
        return FRAME_STOP;   /* another request, or MACs not as the session has them */
    if (sn_len && (sn_len != sn_size || memcmp(f + HEADER_SIZE, sn, sn_len) != 0))
        return FRAME_STOP;   /* a producer id other than the session's: the session decides */
    *length = len;
    return FRAME_TAKE;
}

/* check_publish_as for a session without frame MACs. Shared by scan_publishes and the
 * lane, so they cannot drift. */
static int check_publish(const uint8_t *f, Py_ssize_t avail, Py_ssize_t max_frame,
                         const char *sn, Py_ssize_t sn_size, uint32_t *length)
{
    return check_publish_as(f, avail, max_frame, sn, sn_size, 0, length);
}

/* The fields of a whole PUBLISH frame (Publish in SPEC.md: topic str8, seq u32,
 * lock_ts_ms u64, payload), pointing into the frame. */
typedef struct {
    uint8_t flags;
    uint32_t opaque, seq;
    uint64_t lock_ts_ms;
    const uint8_t *topic, *payload;
    Py_ssize_t topic_len, payload_len;
} publish_view;

/* Fill ``v`` from the frame check_publish took; 0 when the body is truncated (the
 * Python path answers BadBody). */
static int view_publish(const uint8_t *f, uint32_t length, publish_view *v)
{
    Py_ssize_t sn_len = f[7];
    const uint8_t *body = f + HEADER_SIZE + sn_len + SUBHEADER_SIZE;
    Py_ssize_t body_len = (Py_ssize_t)length - (HEADER_SIZE + sn_len + SUBHEADER_SIZE + CRC_SIZE);
    Py_ssize_t tlen = body_len > 0 ? body[0] : 0;
    if (body_len < 13 + tlen)
        return 0;
    v->flags = f[HEADER_SIZE + sn_len];
    v->opaque = be32(f + HEADER_SIZE + sn_len + 1);
    v->topic = body + 1;
    v->topic_len = tlen;
    v->seq = be32(body + 1 + tlen);
    v->lock_ts_ms = be64(body + 5 + tlen);
    v->payload = body + 13 + tlen;
    v->payload_len = body_len - 13 - tlen;
    return 1;
}

/* One PUBLISH frame's field tuple, or NULL with no error set when the frame is
 * not one this scanner takes (the Python decoder then handles it). ``f`` points
 * at a whole frame of ``length`` bytes that check_publish took. */
static PyObject *publish_tuple(const uint8_t *f, uint32_t length, PyObject *sn,
                               PyObject **last_topic, const uint8_t **last_raw,
                               Py_ssize_t *last_n)
{
    publish_view v;
    if (!view_publish(f, length, &v))
        return NULL;
    PyObject *topic;
    if (*last_topic != NULL && *last_n == v.topic_len
            && memcmp(*last_raw, v.topic, v.topic_len) == 0) {
        topic = *last_topic;   /* the usual case: one topic per connection */
        Py_INCREF(topic);
    } else {
        topic = PyUnicode_DecodeUTF8((const char *)v.topic, v.topic_len, NULL);
        if (topic == NULL) {   /* not UTF-8: Python answers BadBody */
            PyErr_Clear();
            return NULL;
        }
        Py_XDECREF(*last_topic);
        Py_INCREF(topic);
        *last_topic = topic;
        *last_raw = v.topic;
        *last_n = v.topic_len;
    }
    PyObject *payload = PyBytes_FromStringAndSize((const char *)v.payload, v.payload_len);
    if (payload == NULL) {
        Py_DECREF(topic);
        return NULL;
    }
    /* (opaque, flags, sn, topic, seq, lock_ts_ms, payload): Connection._publish's args */
    return Py_BuildValue("(kBONkKN)", (unsigned long)v.opaque, v.flags, sn, topic,
                         (unsigned long)v.seq, (unsigned long long)v.lock_ts_ms, payload);
}

static PyObject *scan_loop(const uint8_t *buf, Py_ssize_t size, Py_ssize_t *pos,
                           Py_ssize_t max_frame, PyObject *sn, Py_ssize_t limit,
                           const uint32_t *mids, uint32_t *rx);

/* scan_publishes(buf, pos, max_frame, sn, limit) -> (list, pos) */
static PyObject *scan_publishes(PyObject *self, PyObject *args)
{
    Py_buffer view;
    Py_ssize_t pos, max_frame, limit;
    PyObject *sn;
    if (!PyArg_ParseTuple(args, "y*nnUn:scan_publishes", &view, &pos, &max_frame, &sn, &limit))
        return NULL;
    PyObject *out = scan_loop((const uint8_t *)view.buf, view.len, &pos, max_frame, sn, limit,
                              NULL, NULL);
    PyBuffer_Release(&view);
    return out == NULL ? NULL : Py_BuildValue("(Nn)", out, pos);
}

/* --------------------------------------------------------------- frame MACs */

/* SHA-256 (FIPS 180-4), for the tags of frame MACs (SPEC 2 "Frame MACs"): HMAC-SHA256
 * of the session key, cut to 16 bytes. A session's two HMAC pads are hashed once
 * (mac_pads: their midstates); a tag then costs the hash of the frame's bytes and of
 * one 32-byte digest. protocol/_mac.py is the reference (tests hold them equal). */
#define TAG_SIZE 16
#define TO_BROKER 0

static const uint32_t K256[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};
static const uint32_t SHA256_IV[8] = {
    0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19,
};

#define ROTR(x, n) (((x) >> (n)) | ((x) << (32 - (n))))

static void sha256_block_portable(uint32_t h[8], const uint8_t *p)
{
    uint32_t w[64];
    for (int i = 0; i < 16; i++)
        w[i] = be32(p + 4 * i);
    for (int i = 16; i < 64; i++) {
        uint32_t s0 = ROTR(w[i - 15], 7) ^ ROTR(w[i - 15], 18) ^ (w[i - 15] >> 3);
        uint32_t s1 = ROTR(w[i - 2], 17) ^ ROTR(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], k = h[7];
    for (int i = 0; i < 64; i++) {
        uint32_t t1 = k + (ROTR(e, 6) ^ ROTR(e, 11) ^ ROTR(e, 25)) + ((e & f) ^ (~e & g))
                      + K256[i] + w[i];
        uint32_t t2 = (ROTR(a, 2) ^ ROTR(a, 13) ^ ROTR(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
        k = g; g = f; f = e; e = d + t1; d = c; c = b; b = a; a = t1 + t2;
    }
    h[0] += a; h[1] += b; h[2] += c; h[3] += d; h[4] += e; h[5] += f; h[6] += g; h[7] += k;
}

/* The same block with the x86 SHA extensions (SHA-NI), where the CPU has them: a tag
 * is three or four blocks, ~1.2 us a tag in the portable C above on this machine
 * kind, and a sealed record takes two tags (its own and its ack's). Chosen once, at
 * import (sha256_pick); LOCKMQ_SHA256=portable keeps the portable one (the tests run
 * both against the reference). */
#if defined(__x86_64__) && (defined(__clang__) || (defined(__GNUC__) && __GNUC__ >= 5))
/* (GCC 5 and clang were the first to have the SHA intrinsics: an older compiler still
 * builds the module, with the portable blocks only) */
#include <cpuid.h>
#include <immintrin.h>
#define HAVE_SHA_NI 1

__attribute__((target("sha,sse4.1,ssse3")))
static void sha256_block_ni(uint32_t h[8], const uint8_t *p)
{
    /* each 32-bit word of the block, big-endian in memory, in a lane of its own */
    const __m128i bswap = _mm_set_epi64x(0x0c0d0e0f08090a0bULL, 0x0405060700010203ULL);
    /* the state as the instructions want it: (A, B, E, F) and (C, D, G, H) */
    __m128i cdab = _mm_shuffle_epi32(_mm_loadu_si128((const __m128i *)&h[0]), 0xB1);
    __m128i efgh = _mm_shuffle_epi32(_mm_loadu_si128((const __m128i *)&h[4]), 0x1B);
    __m128i abef = _mm_alignr_epi8(cdab, efgh, 8);
    __m128i cdgh = _mm_blend_epi16(efgh, cdab, 0xF0);
    const __m128i abef0 = abef, cdgh0 = cdgh;
    __m128i w[4];   /* the message schedule, four words a group, the last four groups */
    for (int i = 0; i < 4; i++)
        w[i] = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(p + 16 * i)), bswap);
    for (int r = 0; r < 16; r++) {   /* four rounds a step */
        if (r >= 4) {   /* group r from groups r-4 (w[r&3]), r-3, r-2 and r-1 */
            __m128i x = _mm_sha256msg1_epu32(w[r & 3], w[(r + 1) & 3]);
            x = _mm_add_epi32(x, _mm_alignr_epi8(w[(r + 3) & 3], w[(r + 2) & 3], 4));
            w[r & 3] = _mm_sha256msg2_epu32(x, w[(r + 3) & 3]);
        }
        __m128i m = _mm_add_epi32(w[r & 3], _mm_loadu_si128((const __m128i *)&K256[4 * r]));
        cdgh = _mm_sha256rnds2_epu32(cdgh, abef, m);
        abef = _mm_sha256rnds2_epu32(abef, cdgh, _mm_shuffle_epi32(m, 0x0E));
    }
    abef = _mm_add_epi32(abef, abef0);
    cdgh = _mm_add_epi32(cdgh, cdgh0);
    __m128i feba = _mm_shuffle_epi32(abef, 0x1B);
    __m128i dchg = _mm_shuffle_epi32(cdgh, 0xB1);
    _mm_storeu_si128((__m128i *)&h[0], _mm_blend_epi16(feba, dchg, 0xF0));
    _mm_storeu_si128((__m128i *)&h[4], _mm_alignr_epi8(dchg, feba, 8));
}

/* Has the CPU the SHA extensions (and the SSSE3 and SSE4.1 they come with)? (The
 * cpuid.h calls of old compilers too: __get_cpuid_max and the __cpuid_count macro.) */
static int cpu_has_sha_ni(void)
{
    unsigned int a, b, c, d;
    if (__get_cpuid_max(0, NULL) < 7 || !__get_cpuid(1, &a, &b, &c, &d)
            || !(c & (1u << 9)) || !(c & (1u << 19)))   /* SSSE3, SSE4.1 */
        return 0;
    __cpuid_count(7, 0, a, b, c, d);
    return (b >> 29) & 1;   /* SHA */
}
#endif

static void (*sha256_block)(uint32_t h[8], const uint8_t *p) = sha256_block_portable;
static const char *sha256_impl = "portable";

/* The SHA-256 block function of this CPU (see sha256_block_ni). */
static void sha256_pick(void)
{
#ifdef HAVE_SHA_NI
    const char *want = getenv("LOCKMQ_SHA256");
    if ((want == NULL || strcmp(want, "portable") != 0) && cpu_has_sha_ni()) {
        sha256_block = sha256_block_ni;
        sha256_impl = "sha-ni";
    }
#endif
}

typedef struct {
    uint32_t h[8];
    uint8_t buf[64];
    size_t n;          /* bytes in buf */
    uint64_t total;    /* bytes hashed in all, the pad's block included */
} sha256_ctx;

/* A hash that continues from a pad's midstate (one 64-byte block already hashed). */
static void sha256_from(sha256_ctx *c, const uint32_t mid[8])
{
    memcpy(c->h, mid, sizeof c->h);
    c->n = 0;
    c->total = 64;
}

static void sha256_update(sha256_ctx *c, const uint8_t *p, size_t len)
{
    c->total += len;
    if (c->n) {
        size_t take = 64 - c->n < len ? 64 - c->n : len;
        memcpy(c->buf + c->n, p, take);
        c->n += take;
        p += take;
        len -= take;
        if (c->n < 64)
            return;
        sha256_block(c->h, c->buf);
        c->n = 0;
    }
    for (; len >= 64; p += 64, len -= 64)
        sha256_block(c->h, p);
    memcpy(c->buf, p, len);
    c->n = len;
}

static void sha256_final(sha256_ctx *c, uint8_t out[32])
{
    uint64_t bits = c->total * 8;
    c->buf[c->n++] = 0x80;
    if (c->n > 56) {
        memset(c->buf + c->n, 0, 64 - c->n);
        sha256_block(c->h, c->buf);
        c->n = 0;
    }
    memset(c->buf + c->n, 0, 56 - c->n);
    put_be64(c->buf + 56, bits);
    sha256_block(c->h, c->buf);
    for (int i = 0; i < 8; i++)
        put_be32(out + 4 * i, c->h[i]);
}

/* The two pads' midstates of ``key``: HMAC-SHA256's (key ^ 0x36..) and (key ^ 0x5c..)
 * blocks, each hashed once from the IV. */
static void mac_midstates(const uint8_t *key, Py_ssize_t key_len, uint32_t inner[8],
                          uint32_t outer[8])
{
    uint8_t k[64] = {0}, block[64];
    if (key_len > 64) {
        sha256_ctx c;
        memcpy(c.h, SHA256_IV, sizeof c.h);
        c.n = 0;
        c.total = 0;
        sha256_update(&c, key, (size_t)key_len);
        sha256_final(&c, k);
    } else {
        memcpy(k, key, (size_t)key_len);
    }
    memcpy(inner, SHA256_IV, 8 * sizeof(uint32_t));
    memcpy(outer, SHA256_IV, 8 * sizeof(uint32_t));
    for (int i = 0; i < 64; i++)
        block[i] = k[i] ^ 0x36;
    sha256_block(inner, block);
    for (int i = 0; i < 64; i++)
        block[i] = k[i] ^ 0x5C;
    sha256_block(outer, block);
}

/* A frame's tag (_mac.frame_tag): HMAC(session key, direction u8 | counter u32 |
 * opcode u16 | flags u8 | opaque u32 | sn_len u8 | sn | body)[:16], from the pads'
 * midstates ``mids`` (inner 8 words, then outer 8). */
static void frame_tag(const uint32_t mids[16], uint8_t direction, uint32_t counter,
                      uint16_t opcode, uint8_t flags, uint32_t opaque, const uint8_t *sn,
                      Py_ssize_t sn_len, const uint8_t *body, Py_ssize_t body_len,
                      uint8_t tag[TAG_SIZE])
{
    uint8_t head[13], digest[32];
    head[0] = direction;
    put_be32(head + 1, counter);
    head[5] = (uint8_t)(opcode >> 8);
    head[6] = (uint8_t)opcode;
    head[7] = flags;
    put_be32(head + 8, opaque);
    head[12] = (uint8_t)sn_len;
    sha256_ctx c;
    sha256_from(&c, mids);
    sha256_update(&c, head, sizeof head);
    sha256_update(&c, sn, (size_t)sn_len);
    sha256_update(&c, body, (size_t)body_len);
    sha256_final(&c, digest);
    sha256_from(&c, mids + 8);
    sha256_update(&c, digest, sizeof digest);
    sha256_final(&c, digest);
    memcpy(tag, digest, TAG_SIZE);
}

/* Read ``mids`` from mac_pads' 64 bytes; 0 (TypeError set) when they are not that. */
static int read_mids(Py_buffer *pads, uint32_t mids[16])
{
    if (pads->len != 64) {
        PyErr_SetString(PyExc_ValueError, "pads must be the 64 bytes of mac_pads()");
        return 0;
    }
    for (int i = 0; i < 16; i++)
        mids[i] = be32((const uint8_t *)pads->buf + 4 * i);
    return 1;
}

/* mac_pads(key) -> 64 bytes */
static PyObject *py_mac_pads(PyObject *self, PyObject *args)
{
    Py_buffer key;
    if (!PyArg_ParseTuple(args, "y*:mac_pads", &key))
        return NULL;
    uint32_t mids[16];
    mac_midstates((const uint8_t *)key.buf, key.len, mids, mids + 8);
    PyBuffer_Release(&key);
    uint8_t out[64];
    for (int i = 0; i < 16; i++)
        put_be32(out + 4 * i, mids[i]);
    return PyBytes_FromStringAndSize((const char *)out, sizeof out);
}

/* frame_tag(pads, direction, counter, opcode, flags, opaque, sn, body) -> 16 bytes */
static PyObject *py_frame_tag(PyObject *self, PyObject *args)
{
    Py_buffer pads, sn, body;
    unsigned int direction, opcode, flags;
    unsigned long counter, opaque;
    if (!PyArg_ParseTuple(args, "y*IkIIky*y*:frame_tag", &pads, &direction, &counter,
                          &opcode, &flags, &opaque, &sn, &body))
        return NULL;
    uint32_t mids[16];
    PyObject *out = NULL;
    if (sn.len > 255)
        PyErr_SetString(PyExc_ValueError, "sn longer than 255 bytes");
    else if (read_mids(&pads, mids)) {
        uint8_t tag[TAG_SIZE];
        frame_tag(mids, (uint8_t)direction, (uint32_t)counter, (uint16_t)opcode,
                  (uint8_t)flags, (uint32_t)opaque, (const uint8_t *)sn.buf, sn.len,
                  (const uint8_t *)body.buf, body.len, tag);
        out = PyBytes_FromStringAndSize((const char *)tag, TAG_SIZE);
    }
    PyBuffer_Release(&pads);
    PyBuffer_Release(&sn);
    PyBuffer_Release(&body);
    return out;
}

/* check_publish's answer for a PUBLISH sealed with a frame MAC: FRAME_TAKE only when
 * the frame has MAC set and its tag is the one the session's ``rx``-th frame to the
 * broker must carry; a frame without MAC, or a bad tag, is FRAME_STOP (the session's
 * Python path refuses it: BAD_MAC). ``*length`` is the whole frame's. */
static int check_sealed_publish(const uint8_t *f, Py_ssize_t avail, Py_ssize_t max_frame,
                                const char *sn, Py_ssize_t sn_size, const uint32_t mids[16],
                                uint32_t rx, uint32_t *length)
{
    uint32_t len;
    int rc = check_publish_as(f, avail, max_frame, sn, sn_size, FLAG_MAC, &len);
    if (rc != FRAME_TAKE)
        return rc;
    Py_ssize_t sn_len = f[7];
    uint8_t flags = f[HEADER_SIZE + sn_len];
    const uint8_t *body = f + HEADER_SIZE + sn_len + SUBHEADER_SIZE;
    Py_ssize_t body_len = (Py_ssize_t)len - (HEADER_SIZE + sn_len + SUBHEADER_SIZE + CRC_SIZE);
    if (body_len < TAG_SIZE)
        return FRAME_STOP;
    uint8_t want[TAG_SIZE];
    frame_tag(mids, TO_BROKER, rx, OP_PUBLISH, flags, be32(f + HEADER_SIZE + sn_len + 1),
              f + HEADER_SIZE, sn_len, body, body_len - TAG_SIZE, want);
    uint8_t diff = 0;   /* (in constant time, as compare_digest) */
    for (int i = 0; i < TAG_SIZE; i++)
        diff |= want[i] ^ body[body_len - TAG_SIZE + i];
    if (diff)
        return FRAME_STOP;
    *length = len;
    return FRAME_TAKE;
}

/* The leading run of PUBLISH frames of buf[*pos:] this C code may take, at most
 * ``limit``: their field tuples (Connection._publish's arguments), ``*pos`` moved past
 * them. Sealed (``mids``, the session key's pads, not NULL): each frame's tag checked
 * against the counter ``*rx`` and cut off its payload, ``*rx`` advanced per frame.
 * NULL with an exception set when something fails. */
static PyObject *scan_loop(const uint8_t *buf, Py_ssize_t size, Py_ssize_t *pos,
                           Py_ssize_t max_frame, PyObject *sn, Py_ssize_t limit,
                           const uint32_t *mids, uint32_t *rx)
{
    Py_ssize_t sn_size;
    const char *sn_utf8 = PyUnicode_AsUTF8AndSize(sn, &sn_size);
    if (sn_utf8 == NULL)
        return NULL;
    if (*pos < 0) {
        PyErr_SetString(PyExc_ValueError, "pos must be >= 0");
        return NULL;
    }
    PyObject *out = PyList_New(0);
    if (out == NULL)
        return NULL;
    PyObject *last_topic = NULL;
    const uint8_t *last_raw = NULL;
    Py_ssize_t last_n = 0, at = *pos;
    uint32_t length;
    while (PyList_GET_SIZE(out) < limit) {
        int took = mids != NULL
            ? check_sealed_publish(buf + at, size - at, max_frame, sn_utf8, sn_size, mids,
                                   *rx, &length)
            : check_publish(buf + at, size - at, max_frame, sn_utf8, sn_size, &length);
        if (took != FRAME_TAKE)
            break;
        /* (a sealed frame's fields: those of the frame without its tag) */
        PyObject *t = publish_tuple(buf + at, mids != NULL ? length - TAG_SIZE : length, sn,
                                    &last_topic, &last_raw, &last_n);
        if (t == NULL) {
            if (PyErr_Occurred())
                goto error;
            break;
        }
        int rc = PyList_Append(out, t);
        Py_DECREF(t);
        if (rc < 0)
            goto error;
        at += length;
        if (mids != NULL)
            (*rx)++;
    }
    Py_XDECREF(last_topic);
    *pos = at;
    return out;
error:
    Py_XDECREF(last_topic);
    Py_DECREF(out);
    return NULL;
}

/* scan_sealed_publishes(buf, pos, max_frame, sn, limit, pads, rx) -> (list, pos, rx):
 * scan_publishes for a session with frame MACs; each frame's tag checked and cut off
 * its payload, ``rx`` (the session's count of frames opened) advanced per frame. */
static PyObject *scan_sealed_publishes(PyObject *self, PyObject *args)
{
    Py_buffer view, pads;
    Py_ssize_t pos, max_frame, limit;
    unsigned long rx_in;
    PyObject *sn;
    if (!PyArg_ParseTuple(args, "y*nnUny*k:scan_sealed_publishes", &view, &pos, &max_frame,
                          &sn, &limit, &pads, &rx_in))
        return NULL;
    uint32_t mids[16];
    uint32_t rx = (uint32_t)rx_in;
    PyObject *out = read_mids(&pads, mids)
        ? scan_loop((const uint8_t *)view.buf, view.len, &pos, max_frame, sn, limit, mids, &rx)
        : NULL;
    PyBuffer_Release(&view);
    PyBuffer_Release(&pads);
    return out == NULL ? NULL : Py_BuildValue("(Nnk)", out, pos, (unsigned long)rx);
}

/* -------------------------------------------------------------- scan_frame */

/* scan_frame(buf, pos, max_frame, known) -> (opcode, sn, flags, opaque, body, end)
 * for the whole, valid frame at buf[pos:] whose opcode is in ``known``; None for
 * anything else -- too few bytes, a bad header, length or CRC, an unknown opcode, an
 * SN that is not UTF-8 -- which the Python decoder then reads and raises the
 * protocol's own error for. The broker's read of a frame that is not a PUBLISH (the
 * handshake's CONNECT and AUTH, a DISCONNECT): one call instead of a generator step. */
static PyObject *scan_frame(PyObject *self, PyObject *args)
{
    Py_buffer view;
    Py_ssize_t pos, max_frame;
    PyObject *known;
    if (!PyArg_ParseTuple(args, "y*nnO:scan_frame", &view, &pos, &max_frame, &known))
        return NULL;
    PyObject *result = NULL;
    const uint8_t *buf = (const uint8_t *)view.buf;
    Py_ssize_t size = view.len;
    if (pos < 0) {
        PyErr_SetString(PyExc_ValueError, "pos must be >= 0");
        goto done;
    }
    if (pos > size || size - pos < HEADER_SIZE)
        goto none;
    const uint8_t *f = buf + pos;
    Py_ssize_t sn_len = f[7];
    uint32_t length = be32(f + 1);
    /* the Python decoder's checks; any failure: the decoder raises it */
    if (f[0] != VERSION || sn_len > MAX_SN || length < (uint32_t)(MIN_FRAME + sn_len)
            || (Py_ssize_t)length > max_frame || (Py_ssize_t)length > size - pos)
        goto none;
    if (crc16(f, length - CRC_SIZE, 0xFFFF) != (f[length - 2] << 8 | f[length - 1]))
        goto none;
    PyObject *op = PyLong_FromLong((long)(f[5] << 8 | f[6]));
    if (op == NULL)
        goto done;
    int k = PySequence_Contains(known, op);
    if (k <= 0) {   /* unknown: the decoder raises UnknownOpcode (or a lookup error) */
        Py_DECREF(op);
        if (k < 0)
            goto done;
        goto none;
    }
    PyObject *sn = PyUnicode_DecodeUTF8((const char *)f + HEADER_SIZE, sn_len, NULL);
    if (sn == NULL) {   /* not text: the decoder raises BadFrame */
        PyErr_Clear();
        Py_DECREF(op);
        goto none;
    }
    Py_ssize_t body_at = HEADER_SIZE + sn_len + SUBHEADER_SIZE;
    PyObject *body = PyBytes_FromStringAndSize((const char *)f + body_at,
                                               (Py_ssize_t)length - body_at - CRC_SIZE);
    if (body == NULL) {
        Py_DECREF(op);
        Py_DECREF(sn);
        goto done;
    }
    result = Py_BuildValue("(NNBkNn)", op, sn, f[HEADER_SIZE + sn_len],
                           (unsigned long)be32(f + HEADER_SIZE + sn_len + 1), body,
                           pos + (Py_ssize_t)length);
    goto done;
none:
    Py_INCREF(Py_None);
    result = Py_None;
done:
    PyBuffer_Release(&view);
    return result;
}

/* ---------------------------------------------------------- encode_records */

/* interned attribute names of NewRecord */
static PyObject *s_topic, *s_sn, *s_seq, *s_lock_ts_ms, *s_payload, *s_headers;

/* An exact int in 0..max, or -1 (not one: the Python path explains why). */
static long long small_uint(PyObject *o, unsigned long long max)
{
    if (!PyLong_CheckExact(o))
        return -1;
    int overflow;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow || v < 0 || (unsigned long long)v > max)
        return -1;
    return v;
}

/* One record's commit-log bytes; Py_None when the record needs the Python path
 * (headers, a topic not yet validated, an unusual field, too big): it raises the
 * precise InvalidRecord there. NULL on a Python error. */
static PyObject *encode_one(PyObject *rec, unsigned long long ts, Py_ssize_t max_record,
                            PyObject *topic_cache, PyObject *known, PyObject *new_topics)
{
    PyObject *topic = NULL, *sn = NULL, *seq_o = NULL, *ts_o = NULL, *payload = NULL,
             *headers = NULL, *result = NULL;
    if (!(topic = PyObject_GetAttr(rec, s_topic)) || !(sn = PyObject_GetAttr(rec, s_sn))
            || !(seq_o = PyObject_GetAttr(rec, s_seq))
            || !(ts_o = PyObject_GetAttr(rec, s_lock_ts_ms))
            || !(payload = PyObject_GetAttr(rec, s_payload))
            || !(headers = PyObject_GetAttr(rec, s_headers)))
        goto done;
    result = Py_None;
    PyObject *cached = PyUnicode_CheckExact(topic) ? PyDict_GetItemWithError(topic_cache, topic)
                                                   : NULL;
    if (cached == NULL) {   /* unvalidated topic (or a lookup error: set below) */
        if (PyErr_Occurred())
            result = NULL;
        goto done;
    }
    /* topic_cache values: (name bytes, flags, length), see records._topic_bytes */
    if (!PyTuple_CheckExact(cached) || PyTuple_GET_SIZE(cached) != 3
            || !PyBytes_CheckExact(PyTuple_GET_ITEM(cached, 0)))
        goto done;
    PyObject *topic_b = PyTuple_GET_ITEM(cached, 0);
    long flags = PyLong_AsLong(PyTuple_GET_ITEM(cached, 1));
    if (flags == -1 && PyErr_Occurred()) {
        result = NULL;
        goto done;
    }
    long long seq = small_uint(seq_o, MAX_SEQ);
    long long lock_ts = small_uint(ts_o, (1ULL << 63) - 1);
    if (headers != Py_None || !PyUnicode_CheckExact(sn) || !PyUnicode_IS_ASCII(sn)
            || PyUnicode_GET_LENGTH(sn) < 1 || PyUnicode_GET_LENGTH(sn) > MAX_SN_LEN
            || seq < 0 || lock_ts < 0 || !PyBytes_CheckExact(payload))
        goto done;
    Py_ssize_t tlen = PyBytes_GET_SIZE(topic_b), slen = PyUnicode_GET_LENGTH(sn);
    Py_ssize_t plen = PyBytes_GET_SIZE(payload);
    if (plen > (Py_ssize_t)UINT32_MAX - RECORD_HEADER - tlen - slen)
        goto done;
    Py_ssize_t size = RECORD_HEADER + tlen + slen + plen;
    if (size > max_record)
        goto done;   /* the Python path names the limit */
    PyObject *out = PyBytes_FromStringAndSize(NULL, size);
    if (out == NULL) {
        result = NULL;
        goto done;
    }
    /* <IIBBHBBHIIQQ: length, crc, format, flags, topic_len, sn_len, reserved,
     * headers_len, seq, payload_len, lock_ts_ms, broker_ts_us; then the bytes */
    uint8_t *o = (uint8_t *)PyBytes_AS_STRING(out);
    put_le32(o, (uint32_t)(size - 4));
    o[8] = FORMAT_VERSION;
    o[9] = (uint8_t)flags;
    put_le16(o + 10, (uint32_t)tlen);
    o[12] = (uint8_t)slen;
    o[13] = 0;
    put_le16(o + 14, 0);
    put_le32(o + 16, (uint32_t)seq);
    put_le32(o + 20, (uint32_t)plen);
    put_le64(o + 24, (uint64_t)lock_ts);
    put_le64(o + 32, ts);
    memcpy(o + RECORD_HEADER, PyBytes_AS_STRING(topic_b), tlen);
    memcpy(o + RECORD_HEADER + tlen, PyUnicode_DATA(sn), slen);   /* ASCII: 1 byte each */
    memcpy(o + RECORD_HEADER + tlen + slen, PyBytes_AS_STRING(payload), plen);
    put_le32(o + 4, crc32(o + 8, size - 8, 0));
    result = out;
    /* a topic the store has not seen yet: the caller creates it once */
    int has = PyDict_Contains(known, topic);
    if (has < 0 || (has == 0 && PySet_Add(new_topics, topic) < 0))
        Py_CLEAR(result);
done:
    Py_XDECREF(topic); Py_XDECREF(sn); Py_XDECREF(seq_o);
    Py_XDECREF(ts_o); Py_XDECREF(payload); Py_XDECREF(headers);
    if (result == Py_None)
        Py_INCREF(Py_None);
    return result;
}

/* encode_records(records, broker_ts_us, max_record_bytes, topic_cache, known)
 *   -> (list of bytes or None, total bytes, set of new topics, count of None) */
static PyObject *encode_records(PyObject *self, PyObject *args)
{
    PyObject *records, *topic_cache, *known;
    unsigned long long ts;
    Py_ssize_t max_record;
    if (!PyArg_ParseTuple(args, "O!KnO!O!:encode_records", &PyList_Type, &records, &ts,
                          &max_record, &PyDict_Type, &topic_cache, &PyDict_Type, &known))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(records), total = 0, slow = 0;
    PyObject *out = PyList_New(n), *new_topics = PySet_New(NULL);
    if (out == NULL || new_topics == NULL)
        goto error;
    for (Py_ssize_t i = 0; i < n && i < PyList_GET_SIZE(records); i++) {
        /* held while its attributes are read: a property could drop it from the list */
        PyObject *rec = PyList_GET_ITEM(records, i);
        Py_INCREF(rec);
        PyObject *b = encode_one(rec, ts, max_record, topic_cache, known, new_topics);
        Py_DECREF(rec);
        if (b == NULL)
            goto error;
        if (b == Py_None)
            slow++;
        else
            total += PyBytes_GET_SIZE(b);
        PyList_SET_ITEM(out, i, b);
    }
    if (PyList_GET_SIZE(records) != n) {   /* changed under us by a getattr hook */
        PyErr_SetString(PyExc_RuntimeError, "records changed while encoding");
        goto error;
    }
    return Py_BuildValue("(NnNn)", out, total, new_topics, slow);
error:
    Py_XDECREF(out);
    Py_XDECREF(new_topics);
    return NULL;
}

/* ------------------------------------------------------------ publish_acks */

/* The PUBLISH_ACK frame of one stored record at ``f`` (ACK_FRAME_LEN bytes):
 * version, length, opcode, sn_len 0, flags, opaque | status, offset | crc. */
static void put_publish_ack(uint8_t *f, uint32_t opaque, int dup, long long offset)
{
    f[0] = VERSION;
    put_be32(f + 1, ACK_FRAME_LEN);
    f[5] = 0; f[6] = OP_PUBLISH_ACK;
    f[7] = 0;
    f[8] = FLAG_RESPONSE;
    put_be32(f + 9, opaque);
    f[13] = dup ? ACK_DUPLICATE : ACK_STORED;
    put_be64(f + 14, offset > 0 ? (uint64_t)offset : 0);
    uint16_t c = crc16(f, ACK_FRAME_LEN - CRC_SIZE, 0xFFFF);
    f[22] = (uint8_t)(c >> 8); f[23] = (uint8_t)c;
}

/* A sealed PUBLISH_ACK (a session with frame MACs): put_publish_ack's frame with MAC
 * set and its tag, for the broker's ``counter``-th frame to the lock, after the body. */
#define SEALED_ACK_LEN (ACK_FRAME_LEN + TAG_SIZE)
#define TO_CLIENT 1

static void put_sealed_publish_ack(uint8_t *f, const uint32_t mids[16], uint32_t counter,
                                   uint32_t opaque, int dup, long long offset)
{
    static const uint8_t no_sn[1] = {0};
    f[0] = VERSION;
    put_be32(f + 1, SEALED_ACK_LEN);
    f[5] = 0; f[6] = OP_PUBLISH_ACK;
    f[7] = 0;
    f[8] = FLAG_RESPONSE | FLAG_MAC;
    put_be32(f + 9, opaque);
    f[13] = dup ? ACK_DUPLICATE : ACK_STORED;
    put_be64(f + 14, offset > 0 ? (uint64_t)offset : 0);
    frame_tag(mids, TO_CLIENT, counter, OP_PUBLISH_ACK, FLAG_RESPONSE | FLAG_MAC, opaque,
              no_sn, 0, f + 13, 9, f + 22);
    uint16_t c = crc16(f, SEALED_ACK_LEN - CRC_SIZE, 0xFFFF);
    f[SEALED_ACK_LEN - 2] = (uint8_t)(c >> 8); f[SEALED_ACK_LEN - 1] = (uint8_t)c;
}

/* The acks of results[start:] up to the first that is not an Appended: unsealed, or
 * sealed from ``mids`` with counters from ``tx`` on when ``mids`` is not NULL. */
static PyObject *acks_run(PyObject *batch, PyObject *results, Py_ssize_t start,
                          const uint32_t *mids, uint32_t tx)
{
    Py_ssize_t n = Py_MIN(PyList_GET_SIZE(results), PyList_GET_SIZE(batch));
    if (start < 0 || start > n) {
        PyErr_SetString(PyExc_ValueError, "start out of range");
        return NULL;
    }
    Py_ssize_t size = mids != NULL ? SEALED_ACK_LEN : ACK_FRAME_LEN;
    PyObject *out = PyBytes_FromStringAndSize(NULL, (n - start) * size);
    if (out == NULL)
        return NULL;
    uint8_t *o = (uint8_t *)PyBytes_AS_STRING(out);
    Py_ssize_t i, frames = 0, stored = 0, dup = 0;
    /* (sizes re-read each step: __bool__ or __index__ of an item could shrink a list) */
    for (i = start; i < n && i < PyList_GET_SIZE(results) && i < PyList_GET_SIZE(batch); i++) {
        PyObject *a = PyList_GET_ITEM(results, i), *req = PyList_GET_ITEM(batch, i);
        if (!PyTuple_Check(a) || PyTuple_GET_SIZE(a) != 4
                || !PyTuple_Check(req) || PyTuple_GET_SIZE(req) != 3)
            break;   /* a refusal (an exception): the caller answers it */
        Py_INCREF(a);   /* tuples are immutable: holding them keeps their items */
        Py_INCREF(req);
        int is_dup = PyObject_IsTrue(PyTuple_GET_ITEM(a, 3));
        int oneway = PyObject_IsTrue(PyTuple_GET_ITEM(req, 1));
        long long offset = PyLong_AsLongLong(PyTuple_GET_ITEM(a, 0));
        unsigned long opaque = PyLong_AsUnsignedLong(PyTuple_GET_ITEM(req, 0));
        Py_DECREF(a);
        Py_DECREF(req);
        if (is_dup < 0 || oneway < 0 || PyErr_Occurred()) {
            Py_DECREF(out);
            return NULL;
        }
        if (is_dup)
            dup++;
        else
            stored++;
        if (oneway)
            continue;   /* SPEC: a ONEWAY publish is never answered */
        if (mids != NULL)
            put_sealed_publish_ack(o + frames * size, mids, tx + (uint32_t)frames,
                                   (uint32_t)opaque, is_dup, offset);
        else
            put_publish_ack(o + frames * size, (uint32_t)opaque, is_dup, offset);
        frames++;
    }
    if (_PyBytes_Resize(&out, frames * size) < 0)
        return NULL;
    return Py_BuildValue("(Nnnnn)", out, frames, stored, dup, i);
}

/* publish_acks(batch, results, start) -> (bytes, frames, stored, duplicates, next)
 *
 * ``batch``: the connection's (opaque, oneway, record) per publish; ``results``: the
 * store's Appended (a 4-tuple: offset, topic, queue_offset, duplicate) or an
 * exception per publish. Packs the acks of results[start:] up to the first that is
 * not an Appended (``next``: its index, or len), which the caller answers. */
static PyObject *publish_acks(PyObject *self, PyObject *args)
{
    PyObject *batch, *results;
    Py_ssize_t start;
    if (!PyArg_ParseTuple(args, "O!O!n:publish_acks", &PyList_Type, &batch, &PyList_Type,
                          &results, &start))
        return NULL;
    return acks_run(batch, results, start, NULL, 0);
}

/* sealed_publish_acks(batch, results, start, pads, tx) -> as publish_acks, each ack
 * sealed for a session with frame MACs (protocol/_macfast.py sealed_publish_acks):
 * the i-th ack's tag carries the counter tx + i; the caller advances its session's. */
static PyObject *sealed_publish_acks(PyObject *self, PyObject *args)
{
    PyObject *batch, *results;
    Py_ssize_t start;
    Py_buffer pads;
    unsigned long tx;
    if (!PyArg_ParseTuple(args, "O!O!ny*k:sealed_publish_acks", &PyList_Type, &batch,
                          &PyList_Type, &results, &start, &pads, &tx))
        return NULL;
    uint32_t mids[16];
    PyObject *out = read_mids(&pads, mids) ? acks_run(batch, results, start, mids,
                                                      (uint32_t)tx) : NULL;
    PyBuffer_Release(&pads);
    return out;
}

/* --------------------------------------------------------------- plan_run */

/* plan_run(records, enc, i, pos, q, topic, seg_limit, active_base, seen, high_water,
 *          ids, parts, blob, results, ts_s, appended) -> (i, pos, q)
 *
 * The writer thread's per-record loop (store/writer.py GroupCommit._plan) for the
 * common record: new for its lock (above its high water, not seen in this batch),
 * on the current topic, no segment roll. From records[i] on, each such record gets
 * its index entry (<QII: pos, size, ts_s) in ``blob``, its bytes in ``parts``, its
 * id in ``seen`` and ``ids`` and its Appended(pos, topic, q, False) in ``results``.
 * It stops at the first other record (returning its index), which _plan's Python
 * handles: a possible duplicate, a topic switch, a roll. */
/* The state plan_run and plan_calls carry from record to record. */
typedef struct {
    PyObject *topic, *seen, *hw, *ids, *parts, *blob, *appended;
    long long pos, q, seg_limit, active_base;
} plan_state;

/* One record of plan_run's loop: 1 if it was planned (new, current topic, no
 * roll), 0 if Python must handle it, -1 on an error. */
static int plan_one(plan_state *st, PyObject *rec, PyObject *b, unsigned long ts_s,
                    PyObject *res)
{
    if (!PyBytes_CheckExact(b))
        return 0;
    Py_INCREF(rec);   /* both held: the attribute lookups below may run Python code */
    Py_INCREF(b);
    PyObject *sn = PyObject_GetAttr(rec, s_sn), *seq = NULL, *rtopic = NULL, *key = NULL;
    int ret = -1;
    if (sn == NULL || !(seq = PyObject_GetAttr(rec, s_seq))
            || !(rtopic = PyObject_GetAttr(rec, s_topic)))
        goto out;
    Py_ssize_t size = PyBytes_GET_SIZE(b);
    ret = 0;
    /* the same topic, also as another str object: the broker decodes each read's
     * topic anew, so at one record per read identity alone sent every record of
     * sync-100 to Python's topic switch */
    if (rtopic != st->topic && !(PyUnicode_CheckExact(rtopic) && st->topic != Py_None
                                 && PyUnicode_CheckExact(st->topic)
                                 && PyUnicode_Compare(rtopic, st->topic) == 0))
        goto out;   /* a topic switch: Python's */
    if (st->pos + size > st->seg_limit && st->pos > st->active_base)
        goto out;   /* a segment roll: Python's */
    ret = -1;
    if (!(key = PyTuple_Pack(2, sn, seq)))
        goto out;
    int dup = PySet_Contains(st->seen, key);
    if (dup < 0)
        goto out;
    ret = 0;
    if (dup)
        goto out;
    ret = -1;
    PyObject *e = PyDict_GetItemWithError(st->hw, sn);   /* (hw, known, gaps) */
    if (e == NULL && PyErr_Occurred())
        goto out;
    if (e != NULL) {
        ret = 0;
        if (!PyTuple_Check(e) || PyTuple_GET_SIZE(e) < 1)
            goto out;
        Py_INCREF(e);   /* (borrowed from hw: held while the comparison runs) */
        int le = PyObject_RichCompareBool(seq, PyTuple_GET_ITEM(e, 0), Py_LE);
        Py_DECREF(e);
        ret = -1;
        if (le < 0)
            goto out;
        ret = 0;
        if (le)
            goto out;   /* maybe a duplicate: the dedup table decides, in Python */
        ret = -1;
    }
    /* new: index entry, bytes, id, result */
    uint8_t entry[16];
    put_le64(entry, (uint64_t)st->pos);
    put_le32(entry + 8, (uint32_t)size);
    put_le32(entry + 12, (uint32_t)ts_s);
    Py_ssize_t old = PyByteArray_GET_SIZE(st->blob);
    if (PyByteArray_Resize(st->blob, old + 16) < 0)
        goto out;
    memcpy(PyByteArray_AS_STRING(st->blob) + old, entry, 16);
    /* Appended(pos, topic, q, False): filled in place (a NamedTuple has no dict) */
    PyObject *app = ((PyTypeObject *)st->appended)->tp_alloc((PyTypeObject *)st->appended, 4);
    if (app == NULL)
        goto out;
    PyObject *o_pos = PyLong_FromLongLong(st->pos), *o_q = PyLong_FromLongLong(st->q);
    if (o_pos == NULL || o_q == NULL) {
        Py_XDECREF(o_pos); Py_XDECREF(o_q); Py_DECREF(app);
        goto out;
    }
    PyTuple_SET_ITEM(app, 0, o_pos);
    PyTuple_SET_ITEM(app, 1, Py_NewRef(st->topic));
    PyTuple_SET_ITEM(app, 2, o_q);
    PyTuple_SET_ITEM(app, 3, Py_NewRef(Py_False));
    if (PySet_Add(st->seen, key) < 0 || PyList_Append(st->parts, b) < 0
            || PyList_Append(st->ids, key) < 0 || PyList_Append(res, app) < 0) {
        Py_DECREF(app);
        goto out;
    }
    Py_DECREF(app);
    st->q++;
    st->pos += size;
    ret = 1;
out:
    Py_DECREF(rec); Py_DECREF(b); Py_XDECREF(sn); Py_XDECREF(seq); Py_XDECREF(rtopic); Py_XDECREF(key);
    return ret;
}

static int check_appended(PyObject *appended)
{
    if (!PyType_IsSubtype((PyTypeObject *)appended, &PyTuple_Type)
            || ((PyTypeObject *)appended)->tp_dictoffset != 0) {
        PyErr_SetString(PyExc_TypeError, "appended must be a tuple type without a dict");
        return -1;
    }
    return 0;
}

static PyObject *plan_run(PyObject *self, PyObject *args)
{
    PyObject *records, *enc, *results;
    Py_ssize_t i;
    unsigned long ts_s;
    plan_state st;
    if (!PyArg_ParseTuple(args, "O!O!nLLOLLO!O!O!O!O!O!kO!:plan_run", &PyList_Type, &records,
                          &PyList_Type, &enc, &i, &st.pos, &st.q, &st.topic, &st.seg_limit,
                          &st.active_base, &PySet_Type, &st.seen, &PyDict_Type, &st.hw,
                          &PyList_Type, &st.ids, &PyList_Type, &st.parts, &PyByteArray_Type,
                          &st.blob, &PyList_Type, &results, &ts_s, &PyType_Type, &st.appended))
        return NULL;
    if (check_appended(st.appended) < 0)
        return NULL;
    for (; i < PyList_GET_SIZE(records) && i < PyList_GET_SIZE(enc); i++) {
        int r = plan_one(&st, PyList_GET_ITEM(records, i), PyList_GET_ITEM(enc, i), ts_s,
                         results);
        if (r < 0)
            return NULL;
        if (r == 0)
            break;
    }
    return Py_BuildValue("(nLL)", i, st.pos, st.q);
}

/* plan_calls(batch, k, pos, q, topic, seg_limit, active_base, seen, high_water, ids,
 *            parts, blob, results, appended) -> (k, i, pos, q, res)
 *
 * plan_run over whole append calls: from batch[k] on (items (records, enc, n, fut,
 * ts_s)), each call's records are planned as plan_run does, and the call's result
 * list is appended to ``results``; one C call per group commit instead of one per
 * append call (the broker's sync-100 load is one record per call). Stops at the
 * first record Python must handle: call k, record i, with ``res`` the call's
 * results so far (k == len(batch) when all were planned). */
static PyObject *plan_calls(PyObject *self, PyObject *args)
{
    PyObject *batch, *results;
    Py_ssize_t k;
    plan_state st;
    if (!PyArg_ParseTuple(args, "O!nLLOLLO!O!O!O!O!O!O!:plan_calls", &PyList_Type, &batch,
                          &k, &st.pos, &st.q, &st.topic, &st.seg_limit, &st.active_base,
                          &PySet_Type, &st.seen, &PyDict_Type, &st.hw, &PyList_Type, &st.ids,
                          &PyList_Type, &st.parts, &PyByteArray_Type, &st.blob, &PyList_Type,
                          &results, &PyType_Type, &st.appended))
        return NULL;
    if (check_appended(st.appended) < 0)
        return NULL;
    for (; k < PyList_GET_SIZE(batch); k++) {
        PyObject *item = PyList_GET_ITEM(batch, k), *records, *enc, *o_ts;
        if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) < 5)
            break;
        records = PyTuple_GET_ITEM(item, 0);
        enc = PyTuple_GET_ITEM(item, 1);
        o_ts = PyTuple_GET_ITEM(item, 4);
        if (!PyList_CheckExact(records) || !PyList_CheckExact(enc) || !PyLong_CheckExact(o_ts))
            break;
        unsigned long ts_s = PyLong_AsUnsignedLong(o_ts);
        if (PyErr_Occurred() || ts_s > 0xFFFFFFFFUL) {
            PyErr_Clear();
            break;
        }
        PyObject *res = PyList_New(0);
        if (res == NULL)
            return NULL;
        Py_ssize_t i = 0;
        for (; i < PyList_GET_SIZE(records) && i < PyList_GET_SIZE(enc); i++) {
            int r = plan_one(&st, PyList_GET_ITEM(records, i), PyList_GET_ITEM(enc, i), ts_s,
                             res);
            if (r < 0) {
                Py_DECREF(res);
                return NULL;
            }
            if (r == 0)   /* Python's record: hand it the call in progress */
                return Py_BuildValue("(nnLLN)", k, i, st.pos, st.q, res);
        }
        int rc = PyList_Append(results, res);
        Py_DECREF(res);
        if (rc < 0)
            return NULL;
    }
    return Py_BuildValue("(nnLLN)", k, (Py_ssize_t)0, st.pos, st.q, PyList_New(0));
}

/* ---- store (writer) ---- */

static PyObject *s_move_to_end;

/* A small int of a Python int object (exact int only); 0 when it is none. */
static int exact_ll(PyObject *o, long long *out)
{
    int overflow = 0;
    if (!PyLong_CheckExact(o))
        return 0;
    *out = PyLong_AsLongLongAndOverflow(o, &overflow);
    return !overflow && !(*out == -1 && PyErr_Occurred());
}

/* dedup_run(table, ids, i, window) -> i
 *
 * DedupTable.add_many's common case (store/dedup.py) for ids[i:]: a lock sending in
 * order (seq == hw + 1, no gaps). A run of consecutive ids of one SN in order is
 * folded into one update of its entry (hw, min(known + k, window), 0) and one
 * move_to_end: the same table as k single adds. Stops at the first other id
 * (returning its index) for DedupTable.add to handle. */
static PyObject *dedup_run(PyObject *self, PyObject *args)
{
    PyObject *table, *ids;
    Py_ssize_t i;
    long long w;
    if (!PyArg_ParseTuple(args, "OO!nL:dedup_run", &table, &PyList_Type, &ids, &i, &w))
        return NULL;
    if (!PyDict_Check(table)) {
        PyErr_SetString(PyExc_TypeError, "table must be a dict");
        return NULL;
    }
    if (i < 0)
        i = 0;
    while (i < PyList_GET_SIZE(ids)) {
        PyObject *id = PyList_GET_ITEM(ids, i);
        if (!PyTuple_CheckExact(id) || PyTuple_GET_SIZE(id) != 2)
            break;
        PyObject *sn = PyTuple_GET_ITEM(id, 0);
        long long seq, hw, known, gaps;
        if (!PyUnicode_CheckExact(sn) || !exact_ll(PyTuple_GET_ITEM(id, 1), &seq))
            break;
        PyObject *e = PyDict_GetItemWithError(table, sn);   /* borrowed */
        if (e == NULL) {
            if (PyErr_Occurred())
                return NULL;
            break;   /* a new SN: add() (it may evict the oldest) */
        }
        if (!PyTuple_CheckExact(e) || PyTuple_GET_SIZE(e) != 3
                || !exact_ll(PyTuple_GET_ITEM(e, 0), &hw)
                || !exact_ll(PyTuple_GET_ITEM(e, 1), &known)
                || !exact_ll(PyTuple_GET_ITEM(e, 2), &gaps)
                || gaps != 0 || hw >= LLONG_MAX / 2 || seq != hw + 1)
            break;
        Py_ssize_t j = i + 1;
        long long last = seq;
        while (j < PyList_GET_SIZE(ids)) {   /* the same SN's next ids, in order */
            PyObject *id2 = PyList_GET_ITEM(ids, j), *sn2;
            long long s2;
            if (!PyTuple_CheckExact(id2) || PyTuple_GET_SIZE(id2) != 2)
                break;
            sn2 = PyTuple_GET_ITEM(id2, 0);
            if (sn2 != sn && !(PyUnicode_CheckExact(sn2) && PyUnicode_Compare(sn2, sn) == 0))
                break;
            if (!exact_ll(PyTuple_GET_ITEM(id2, 1), &s2) || s2 != last + 1 || last >= LLONG_MAX / 2)
                break;
            last = s2;
            j++;
        }
        if (PyErr_Occurred())
            return NULL;
        known = known + (last - hw) < w ? known + (last - hw) : w;
        PyObject *entry = Py_BuildValue("(LLi)", last, known, 0);
        if (entry == NULL)
            return NULL;
        Py_INCREF(sn);   /* the table's old entry may hold the only other reference */
        int rc = PyObject_SetItem(table, sn, entry);
        Py_DECREF(entry);
        PyObject *r = rc < 0 ? NULL : PyObject_CallMethodOneArg(table, s_move_to_end, sn);
        Py_DECREF(sn);
        if (r == NULL)
            return NULL;
        Py_DECREF(r);
        i = j;
    }
    return PyLong_FromSsize_t(i);
}

/* Write buf[0:len] at pos, going on after a short write or EINTR, until all of it
 * is written (GIL released by the caller). -1 with errno set on an error. (One
 * buffer per call: commit_write joins a commit's parts before writing them.) */
static int pwrite_all(int fd, const char *buf, size_t len, off_t pos)
{
    while (len > 0) {
        ssize_t w = pwrite(fd, buf, len, pos);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        if (w == 0) {
            errno = EIO;
            return -1;
        }
        buf += w;
        len -= (size_t)w;
        pos += w;
    }
    return 0;
}

/* commit_write(index_writes, fd, parts, pos, sync) -> None
 *
 * One group commit's file work (store/writer.py GroupCommit._write, one segment):
 * each (index fd, entries, file position) of index_writes, then parts at pos of fd
 * (joined without the GIL, one pwrite), then fdatasync(fd) if sync -- with the GIL released
 * once for all of it instead of once per call, so the writer thread hands the GIL
 * back and forth with the event loop once per commit. OSError (errno set) on an
 * error: the caller undoes the whole batch. */
static PyObject *commit_write(PyObject *self, PyObject *args)
{
    PyObject *iw, *parts;
    int fd, sync;
    long long pos;
    if (!PyArg_ParseTuple(args, "O!iO!Lp:commit_write", &PyList_Type, &iw, &fd,
                          &PyList_Type, &parts, &pos, &sync))
        return NULL;
    Py_ssize_t ni = PyList_GET_SIZE(iw), np = PyList_GET_SIZE(parts), nb = 0, k;
    Py_buffer *bufs = PyMem_Calloc(ni + np + 1, sizeof(Py_buffer));
    int *ifd = PyMem_Calloc(ni + 1, sizeof(int));
    long long *ipos = PyMem_Calloc(ni + 1, sizeof(long long));
    PyObject *result = NULL;
    if (!bufs || !ifd || !ipos) {
        PyErr_NoMemory();
        goto done;
    }
    for (k = 0; k < ni; k++) {
        PyObject *t = PyList_GET_ITEM(iw, k), *b;
        if (!PyTuple_Check(t) || !PyArg_ParseTuple(t, "iOL", &ifd[k], &b, &ipos[k])) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_TypeError, "index_writes: (fd, entries, position)");
            goto done;
        }
        if (PyObject_GetBuffer(b, &bufs[nb], PyBUF_SIMPLE) < 0)
            goto done;
        nb++;
    }
    for (k = 0; k < np; k++) {
        if (PyObject_GetBuffer(PyList_GET_ITEM(parts, k), &bufs[nb], PyBUF_SIMPLE) < 0)
            goto done;
        nb++;
    }
    Py_buffer *part = bufs + ni;   /* the log parts, after the index entries */
    size_t total = 0;
    for (k = 0; k < np; k++)
        total += (size_t)part[k].len;
    /* the parts are copied into one buffer (below, without the GIL) and written
     * with one pwrite: a pwritev of a thousand small parts cost the kernel more
     * than the copy costs here (measured: writer-thread system time doubled) */
    char *joined = np > 1 ? PyMem_RawMalloc(total ? total : 1) : NULL;
    if (np > 1 && joined == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    int rc = 0, err = 0;
    Py_BEGIN_ALLOW_THREADS
    for (k = 0; k < ni && rc == 0; k++)
        rc = pwrite_all(ifd[k], bufs[k].buf, (size_t)bufs[k].len, (off_t)ipos[k]);
    if (rc == 0 && joined != NULL) {
        size_t at = 0;
        for (k = 0; k < np; k++) {
            memcpy(joined + at, part[k].buf, (size_t)part[k].len);
            at += (size_t)part[k].len;
        }
        rc = pwrite_all(fd, joined, total, (off_t)pos);
    } else if (rc == 0 && np == 1)
        rc = pwrite_all(fd, part[0].buf, (size_t)part[0].len, (off_t)pos);
    if (rc == 0 && sync) {
        do
            rc = fdatasync(fd);
        while (rc < 0 && errno == EINTR);
    }
    if (rc < 0)
        err = errno;   /* the failed call's, before anything else can set it */
    Py_END_ALLOW_THREADS
    PyMem_RawFree(joined);
    if (rc < 0) {
        errno = err;
        PyErr_SetFromErrno(PyExc_OSError);
        goto done;
    }
    result = Py_NewRef(Py_None);
done:
    if (bufs)
        for (k = 0; k < nb; k++)
            PyBuffer_Release(&bufs[k]);
    PyMem_Free(bufs);
    PyMem_Free(ifd);
    PyMem_Free(ipos);
    return result;
}

/* ---- broker loop ---- */

/* The broker's publish queueing on the event-loop thread (Connection._on_publishes):
 * runs of scan_publishes tuples that need no check of their own, turned into the
 * store's records in one call instead of a Python loop step each. */

/* The store's record class (store/records.py NewRecord) is its six __slots__ and
 * an __init__ that fills them: built here, the record skips that Python frame (the
 * largest Python cost per queued record). Only for a class laid out that way (each
 * name a writable object slot of the class itself, no __dict__, object's __new__);
 * anything else -- a subclass (its own __init__), another callable -- is called as
 * before. One class is remembered (held), so the lookup runs once. */
static const char *const RECORD_SLOTS[6] = {"topic", "sn", "seq", "lock_ts_ms", "payload",
                                            "headers"};
static PyTypeObject *record_class = NULL;
static Py_ssize_t record_offsets[6];

/* 1: ``cls`` is a record class as above (its slot offsets in record_offsets), 0: it
 * is not (call it), -1: an error */
static int record_layout(PyObject *cls)
{
    if ((PyTypeObject *)cls == record_class)
        return 1;
    if (!PyType_Check(cls))
        return 0;
    PyTypeObject *tp = (PyTypeObject *)cls;
    if (tp->tp_new != PyBaseObject_Type.tp_new || tp->tp_dictoffset != 0
            || tp->tp_itemsize != 0 || tp->tp_alloc == NULL)
        return 0;
    Py_ssize_t offsets[6];
    for (int k = 0; k < 6; k++) {
        PyObject *d = PyObject_GetAttrString(cls, RECORD_SLOTS[k]);
        if (d == NULL) {
            if (!PyErr_ExceptionMatches(PyExc_AttributeError))
                return -1;
            PyErr_Clear();
            return 0;
        }
        int ok = Py_IS_TYPE(d, &PyMemberDescr_Type)
            && PyDescr_TYPE(d) == tp   /* its own slots: a subclass is called */
            && ((PyMemberDescrObject *)d)->d_member->type == T_OBJECT_EX
            && !(((PyMemberDescrObject *)d)->d_member->flags & READONLY);
        if (ok)
            offsets[k] = ((PyMemberDescrObject *)d)->d_member->offset;
        Py_DECREF(d);
        if (!ok || offsets[k] < (Py_ssize_t)sizeof(PyObject)
                || offsets[k] + (Py_ssize_t)sizeof(PyObject *) > tp->tp_basicsize)
            return 0;
    }
    Py_INCREF(tp);
    Py_XSETREF(record_class, tp);
    memcpy(record_offsets, offsets, sizeof offsets);
    return 1;
}

/* record_class(topic, sn, seq, lock_ts_ms, payload) as its __init__ fills it
 * (headers None), without running it */
static PyObject *new_record(PyObject *const *values)
{
    PyObject *rec = record_class->tp_alloc(record_class, 0);   /* zeroed, GC-tracked */
    if (rec == NULL)
        return NULL;
    for (int k = 0; k < 6; k++) {
        PyObject *v = k < 5 ? values[k] : Py_None;
        Py_INCREF(v);
        *(PyObject **)((char *)rec + record_offsets[k]) = v;
    }
    return rec;
}

/* queue_run(pubs, start, limit, record_type, queue, records) -> (stop, size)
 *
 * The run of (opaque, flags, sn, topic, seq, lock_ts_ms, payload) tuples from
 * pubs[start] on that go to one topic (pubs[start]'s) and want an answer (no ONEWAY
 * flag), at most ``limit`` long, queued as Connection._publish queues a record:
 * rec = record_type(topic, sn, seq, lock_ts_ms, payload) appended to ``records``
 * (built without its __init__ when it is a record class: see record_layout)
 * and (opaque, False, rec) to ``queue``. Returns where the run stopped and the
 * records' buffer cost (payload length + 64 each); stop == start when pubs[start]
 * is ONEWAY. METH_FASTCALL: a read's run costs one call and no argument tuple. */
static PyObject *queue_run(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6 || !PyList_Check(args[0]) || !PyList_Check(args[4])
            || !PyList_Check(args[5])) {
        PyErr_SetString(PyExc_TypeError,
                        "queue_run(pubs: list, start, limit, record_type, queue: list, "
                        "records: list)");
        return NULL;
    }
    PyObject *pubs = args[0], *record_type = args[3], *queue = args[4], *records = args[5];
    Py_ssize_t start = PyLong_AsSsize_t(args[1]), limit = PyLong_AsSsize_t(args[2]);
    if ((start == -1 || limit == -1) && PyErr_Occurred())
        return NULL;
    if (start < 0 || start > PyList_GET_SIZE(pubs)) {
        PyErr_SetString(PyExc_ValueError, "start out of range");
        return NULL;
    }
    int layout = record_layout(record_type);   /* 1: built here, no __init__ call */
    if (layout < 0)
        return NULL;
    PyObject *topic = NULL;   /* pubs[start]'s, held: record_type's code may run */
    Py_ssize_t i, size = 0;
    Py_ssize_t queued = PyList_GET_SIZE(queue), recorded = PyList_GET_SIZE(records);
    for (i = start; i < PyList_GET_SIZE(pubs) && i - start < limit; i++) {
        PyObject *p = PyList_GET_ITEM(pubs, i);
        if (!PyTuple_Check(p) || PyTuple_GET_SIZE(p) != 7) {
            PyErr_SetString(PyExc_TypeError, "pubs items must be scan_publishes tuples");
            goto error;
        }
        PyObject *flags = PyTuple_GET_ITEM(p, 1), *t = PyTuple_GET_ITEM(p, 3);
        if (!PyLong_CheckExact(flags) || !PyUnicode_CheckExact(t))
            break;
        long fl = PyLong_AsLong(flags);
        if (fl == -1 && PyErr_Occurred())
            goto error;
        if (fl & FLAG_ONEWAY)
            break;
        if (topic == NULL) {
            topic = t;
            Py_INCREF(topic);
        } else if (t != topic) {
            int eq = PyUnicode_Compare(t, topic);   /* exact strs: runs no Python code */
            if (eq == -1 && PyErr_Occurred())
                goto error;
            if (eq != 0)
                break;
        }
        Py_INCREF(p);   /* held while record_type's code runs */
        PyObject *payload = PyTuple_GET_ITEM(p, 6);
        Py_ssize_t plen = PyObject_Length(payload);
        PyObject *argv[5] = {t, PyTuple_GET_ITEM(p, 2), PyTuple_GET_ITEM(p, 4),
                             PyTuple_GET_ITEM(p, 5), payload};
        PyObject *rec = plen < 0 ? NULL : layout ? new_record(argv)
            : PyObject_Vectorcall(record_type, argv, 5, NULL);
        PyObject *entry = rec == NULL ? NULL :
            PyTuple_Pack(3, PyTuple_GET_ITEM(p, 0), Py_False, rec);
        Py_DECREF(p);
        if (entry == NULL || PyList_Append(records, rec) < 0) {
            Py_XDECREF(entry);
            Py_XDECREF(rec);
            goto error;
        }
        Py_DECREF(rec);
        if (PyList_Append(queue, entry) < 0) {
            Py_DECREF(entry);
            goto error;
        }
        Py_DECREF(entry);
        size += plen + 64;
    }
    Py_XDECREF(topic);
    return Py_BuildValue("(nn)", i, size);
error:   /* nothing of this call stays queued: the caller answers the error */
    Py_XDECREF(topic);
    if (PyList_GET_SIZE(queue) > queued)
        PyList_SetSlice(queue, queued, PyList_GET_SIZE(queue), NULL);
    if (PyList_GET_SIZE(records) > recorded)
        PyList_SetSlice(records, recorded, PyList_GET_SIZE(records), NULL);
    return NULL;
}

/* -------------------------------------------------------------------- lane */

/* Lane: a lock's steady publish reads and their acks below Python (issue #14).
 *
 * At one record per read, every read entering Python (uvloop's callback, the bytes,
 * the GIL, the publish path's calls) cost the broker ~4 us of its ~11 per record. A
 * connection in its steady state -- established, only PUBLISHes to topics already
 * allowed -- is handed to the lane (broker/lane.py): its transport
 * stops reading, and its socket joins the lane's epoll set, which the broker's loop
 * watches as one fd. When it is readable, one poll() reads every ready socket,
 * checks each frame as scan_publishes does, and returns the records of all of them
 * with one plan of who gets which ack; one answer() packs and sends every ack of a
 * group commit. Python then runs per loop iteration, not per read. A session with
 * frame MACs (a lock on plain TCP) hands its key's pads and both counters over: the
 * lane checks each PUBLISH's tag as scan_sealed_publishes does, seals each ack, and
 * gives the counters back with the socket.
 *
 * Whatever is not that steady state goes back to the connection's Python path with
 * the unread bytes ("bail"): another opcode, a bad or ONEWAY frame, a bad tag, another
 * SN, a topic not yet allowed, the rate credit used up, EOF or a socket error, a
 * frame too large for the read buffer. The Python path then raises the protocol's
 * own errors, so error behaviour cannot drift. The lane never writes while Python
 * holds unsent bytes for the socket: Python takes a socket back (release) before it
 * writes to it, and an ack the socket does not take whole is handed to Python too.
 *
 * Per socket the lane keeps a partial frame (at most max_frame bytes), the bytes of
 * records read and not yet answered (above ``limit`` it stops reading the socket
 * until answers bring them to half) and a rate credit Python took from the
 * lock's budget (-1: no limit). Slots carry a generation so that an answer for a
 * socket released (and its fd number reused) is never written to the new one. */

#include <pthread.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>

#define LANE_EVENTS 256
#define LANE_READ 65536   /* bytes read per socket per poll, beyond a held partial frame */

typedef struct {
    PyObject *conn;       /* the connection (held): bails and answers name it */
    PyObject *sn;         /* the session's SN (held): the records' producer id */
    const char *sn_utf8;  /* (valid while sn is held) */
    Py_ssize_t sn_size;
    PyObject *topics;     /* topics the connection's Python path allowed (a set, held) */
    long long credit;     /* records left of the rate credit; -1: no limit */
    long long pending;    /* record bytes read, not yet answered */
    long long limit;      /* above it, the socket is not read */
    unsigned long long gen;
    int paused;
    int bailed;           /* poll(defer=1) gave it up: out of the set, its unread bytes
                             in tail, until take_bails() or release() hands it back */
    uint8_t *tail;        /* a partial frame carried to the next read */
    Py_ssize_t tail_len;
    int sealed;           /* the session has frame MACs: its frames are checked and its
                             acks sealed here, with the session's counters, which the
                             lane keeps while it holds the socket */
    uint32_t mids[16];    /* (sealed) the session key's pads' midstates (mac_pads) */
    uint32_t rx, tx;      /* (sealed) frames opened from / sealed to the lock so far */
} lane_slot;

typedef struct {
    PyObject_HEAD
    int epfd;
    lane_slot **slots;    /* by fd */
    int nslots;
    unsigned long long next_gen;
    Py_ssize_t max_frame;
    uint8_t *rbuf;
    Py_ssize_t rsize;
    Py_ssize_t adopted;   /* sockets in the lane now */
    Py_ssize_t bailed;    /* of them, bailed and not yet taken back */
    /* Two threads call the lane (the loop, and the store's writer through poll):
     * each call holds this (recursive) for its whole run, because a call can let the
     * other thread run Python in its middle (an allocation's garbage collection). */
    pthread_mutex_t mu;
} LaneObject;

/* Take the lane's mutex; while another thread holds it, without the GIL (that thread
 * may need the GIL to finish its call). */
static void lane_lock(LaneObject *ln)
{
    if (pthread_mutex_trylock(&ln->mu) != 0) {
        Py_BEGIN_ALLOW_THREADS
        pthread_mutex_lock(&ln->mu);
        Py_END_ALLOW_THREADS
    }
}

/* one record of a poll: whose ack it is */
typedef struct {
    PyObject *conn;
    int fd;
    unsigned long long gen;
    uint32_t opaque;
    uint32_t size;
    int sealed;   /* its ack needs the session's next counter (Python's if the socket left) */
} plan_entry;

typedef struct {
    PyObject_HEAD
    Py_ssize_t n, cap;
    plan_entry *e;
} PlanObject;

static PyObject *s_last_seen;

static void plan_dealloc(PlanObject *p)
{
    for (Py_ssize_t i = 0; i < p->n; i++)
        Py_DECREF(p->e[i].conn);
    PyMem_Free(p->e);
    Py_TYPE(p)->tp_free((PyObject *)p);
}

static Py_ssize_t plan_len(PlanObject *p)
{
    return p->n;
}

static PySequenceMethods plan_as_sequence = {.sq_length = (lenfunc)plan_len};

static PyTypeObject PlanType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "lockmq._speedups.LanePlan",
    .tp_doc = "Who gets which ack of one Lane.poll (opaque to Python; len: records).",
    .tp_basicsize = sizeof(PlanObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_dealloc = (destructor)plan_dealloc,
    .tp_as_sequence = &plan_as_sequence,
};

static int plan_add(PlanObject *p, PyObject *conn, int fd, unsigned long long gen,
                    uint32_t opaque, uint32_t size, int sealed)
{
    if (p->n == p->cap) {
        Py_ssize_t cap = p->cap ? p->cap * 2 : 64;
        plan_entry *e = PyMem_Realloc(p->e, cap * sizeof(plan_entry));
        if (e == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        p->e = e;
        p->cap = cap;
    }
    Py_INCREF(conn);
    p->e[p->n++] = (plan_entry){conn, fd, gen, opaque, size, sealed};
    return 0;
}

static void slot_free(lane_slot *s)
{
    Py_XDECREF(s->conn);
    Py_XDECREF(s->sn);
    Py_XDECREF(s->topics);
    PyMem_Free(s->tail);
    PyMem_Free(s);
}

/* The slot of fd, or NULL; with ``gen``, only the slot of that generation. */
static lane_slot *lane_slot_of(LaneObject *ln, int fd, unsigned long long gen)
{
    if (fd < 0 || fd >= ln->nslots || ln->slots[fd] == NULL)
        return NULL;
    lane_slot *s = ln->slots[fd];
    return gen == 0 || s->gen == gen ? s : NULL;
}

/* Take fd out of the lane: (conn, held bytes, credit left, rx, tx) for Python, or
 * NULL on an error (rx, tx: a sealed session's counters, which are Python's again).
 * ``extra``: unread bytes of this poll to hand back after the held tail. */
static PyObject *lane_detach(LaneObject *ln, int fd, const uint8_t *extra, Py_ssize_t n)
{
    lane_slot *s = ln->slots[fd];
    ln->slots[fd] = NULL;
    ln->adopted--;
    if (s->bailed)
        ln->bailed--;
    if (!s->paused)   /* (a paused socket is out of the set already) */
        epoll_ctl(ln->epfd, EPOLL_CTL_DEL, fd, NULL);   /* (fails only if fd was closed) */
    PyObject *data = PyBytes_FromStringAndSize(NULL, s->tail_len + n);
    PyObject *res = NULL;
    if (data != NULL) {
        memcpy(PyBytes_AS_STRING(data), s->tail, s->tail_len);
        memcpy(PyBytes_AS_STRING(data) + s->tail_len, extra, n);
        res = Py_BuildValue("(OOLkk)", s->conn, data, s->credit, (unsigned long)s->rx,
                            (unsigned long)s->tx);
        Py_DECREF(data);
    }
    slot_free(s);
    return res;
}

static int lane_watch(LaneObject *ln, int fd, int op, uint32_t events)
{
    struct epoll_event ev = {.events = events, .data.fd = fd};
    if (epoll_ctl(ln->epfd, op, fd, &ev) < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    return 0;
}

static PyObject *lane_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    PyObject *record_type;
    Py_ssize_t max_frame;
    if (!PyArg_ParseTuple(args, "On:Lane", &record_type, &max_frame))
        return NULL;
    int layout = record_layout(record_type);
    if (layout <= 0) {
        if (layout == 0)
            PyErr_SetString(PyExc_TypeError, "Lane needs a record class with six own slots");
        return NULL;
    }
    if (max_frame < MIN_FRAME || max_frame > (1 << 30)) {
        PyErr_SetString(PyExc_ValueError, "max_frame out of range");
        return NULL;
    }
    LaneObject *ln = (LaneObject *)type->tp_alloc(type, 0);
    if (ln == NULL)
        return NULL;
    pthread_mutexattr_t attr;
    pthread_mutexattr_init(&attr);
    pthread_mutexattr_settype(&attr, PTHREAD_MUTEX_RECURSIVE);
    pthread_mutex_init(&ln->mu, &attr);
    pthread_mutexattr_destroy(&attr);
    ln->epfd = -1;
    ln->next_gen = 1;
    ln->max_frame = max_frame;
    ln->rsize = max_frame + LANE_READ;
    ln->rbuf = PyMem_Malloc(ln->rsize);
    ln->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (ln->rbuf == NULL || ln->epfd < 0) {
        if (ln->rbuf == NULL)
            PyErr_NoMemory();
        else
            PyErr_SetFromErrno(PyExc_OSError);
        Py_DECREF(ln);
        return NULL;
    }
    return (PyObject *)ln;
}

static void lane_clear_slots(LaneObject *ln)
{
    for (int fd = 0; fd < ln->nslots; fd++)
        if (ln->slots[fd] != NULL) {
            if (!ln->slots[fd]->paused)
                epoll_ctl(ln->epfd, EPOLL_CTL_DEL, fd, NULL);
            slot_free(ln->slots[fd]);
            ln->slots[fd] = NULL;
        }
    ln->adopted = 0;
    ln->bailed = 0;
}

static void lane_dealloc(LaneObject *ln)
{
    lane_clear_slots(ln);
    PyMem_Free(ln->slots);
    PyMem_Free(ln->rbuf);
    if (ln->epfd >= 0)
        close(ln->epfd);
    pthread_mutex_destroy(&ln->mu);
    Py_TYPE(ln)->tp_free((PyObject *)ln);
}

static PyObject *lane_fileno(LaneObject *ln, PyObject *unused)
{
    return PyLong_FromLong(ln->epfd);
}

/* adopt(fd, conn, sn, topics, credit, limit, pads=None, rx=0, tx=0); a session with
 * frame MACs passes its key's mac_pads and its counters (release hands them back) */
static PyObject *lane_adopt_unlocked(LaneObject *ln, PyObject *args)
{
    int fd;
    PyObject *conn, *sn, *topics, *pads = Py_None;
    long long credit, limit;
    unsigned long rx = 0, tx = 0;
    if (!PyArg_ParseTuple(args, "iOUO!LL|Okk:adopt", &fd, &conn, &sn, &PySet_Type, &topics,
                          &credit, &limit, &pads, &rx, &tx))
        return NULL;
    uint32_t mids[16];
    if (pads != Py_None) {
        Py_buffer view;
        if (PyObject_GetBuffer(pads, &view, PyBUF_SIMPLE) < 0)
            return NULL;
        int ok = read_mids(&view, mids);
        PyBuffer_Release(&view);
        if (!ok)
            return NULL;
    }
    if (fd < 0 || fd >= (1 << 24) || limit <= 0) {
        PyErr_SetString(PyExc_ValueError, "fd or limit out of range");
        return NULL;
    }
    if (fd >= ln->nslots) {
        int n = fd + 1 > ln->nslots * 2 ? fd + 1 : ln->nslots * 2;
        lane_slot **slots = PyMem_Realloc(ln->slots, n * sizeof(lane_slot *));
        if (slots == NULL)
            return PyErr_NoMemory();
        memset(slots + ln->nslots, 0, (n - ln->nslots) * sizeof(lane_slot *));
        ln->slots = slots;
        ln->nslots = n;
    }
    if (ln->slots[fd] != NULL) {
        PyErr_SetString(PyExc_ValueError, "fd is in the lane already");
        return NULL;
    }
    lane_slot *s = PyMem_Calloc(1, sizeof(lane_slot));
    if (s == NULL)
        return PyErr_NoMemory();
    s->sn_utf8 = PyUnicode_AsUTF8AndSize(sn, &s->sn_size);
    if (s->sn_utf8 == NULL || s->sn_size > MAX_SN) {
        if (s->sn_utf8 != NULL)
            PyErr_SetString(PyExc_ValueError, "sn too long");
        PyMem_Free(s);
        return NULL;
    }
    if (lane_watch(ln, fd, EPOLL_CTL_ADD, EPOLLIN) < 0) {
        PyMem_Free(s);
        return NULL;
    }
    s->conn = Py_NewRef(conn);
    s->sn = Py_NewRef(sn);
    s->topics = Py_NewRef(topics);
    s->credit = credit;
    s->limit = limit;
    if (pads != Py_None) {
        s->sealed = 1;
        memcpy(s->mids, mids, sizeof mids);
        s->rx = (uint32_t)rx;
        s->tx = (uint32_t)tx;
    }
    s->gen = ln->next_gen++;
    ln->slots[fd] = s;
    ln->adopted++;
    Py_RETURN_NONE;
}

/* release(fd) -> (conn, held bytes, credit left, rx, tx), or None if fd is not in
 * the lane */
static PyObject *lane_release_unlocked(LaneObject *ln, PyObject *args)
{
    int fd;
    if (!PyArg_ParseTuple(args, "i:release", &fd))
        return NULL;
    if (lane_slot_of(ln, fd, 0) == NULL)
        Py_RETURN_NONE;
    return lane_detach(ln, fd, NULL, 0);
}

/* One socket's read: its whole PUBLISH frames become records (and plan entries);
 * returns the offset where the lane stops taking frames -- n when it took them all
 * (then any partial frame is kept), less when the rest is Python's (a bail) -- or
 * -1 on an error. */
static Py_ssize_t lane_take(LaneObject *ln, lane_slot *s, int fd, const uint8_t *buf,
                            Py_ssize_t n, PyObject *records, PlanObject *plan,
                            Py_ssize_t *frames)
{
    Py_ssize_t pos = 0;
    PyObject *topic = NULL;   /* the last topic (one per lock, usually) */
    const uint8_t *topic_raw = NULL;
    Py_ssize_t topic_n = -1;
    uint32_t length;
    while (pos < n) {
        const uint8_t *f = buf + pos;
        int got = s->sealed   /* (a bad tag stops here: the session's path says BAD_MAC) */
            ? check_sealed_publish(f, n - pos, ln->max_frame, s->sn_utf8, s->sn_size,
                                   s->mids, s->rx, &length)
            : check_publish(f, n - pos, ln->max_frame, s->sn_utf8, s->sn_size, &length);
        if (got == FRAME_PARTIAL)
            goto partial;   /* (length <= max_frame: rbuf holds it and a read more) */
        publish_view v;   /* (a sealed frame's fields: those of the frame without its tag) */
        if (got == FRAME_STOP || !view_publish(f, s->sealed ? length - TAG_SIZE : length, &v)
                || (v.flags & FLAG_ONEWAY))
            break;   /* the Python path's: its errors, ONEWAY's no-answer rule */
        if (s->credit == 0)
            break;   /* the lock's rate: Python asks its budget */
        if (topic == NULL || topic_n != v.topic_len || memcmp(topic_raw, v.topic, v.topic_len) != 0) {
            PyObject *t = PyUnicode_DecodeUTF8((const char *)v.topic, v.topic_len, NULL);
            if (t == NULL) {
                PyErr_Clear();
                break;
            }
            int ok = PySet_Contains(s->topics, t);
            if (ok <= 0) {
                Py_DECREF(t);
                if (ok < 0)
                    goto error;
                break;   /* not allowed yet: Python checks it (and may allow it) */
            }
            Py_XSETREF(topic, t);
            topic_raw = v.topic;
            topic_n = v.topic_len;
        }
        PyObject *seq = PyLong_FromUnsignedLong(v.seq);
        PyObject *ts = PyLong_FromUnsignedLongLong(v.lock_ts_ms);
        PyObject *payload = PyBytes_FromStringAndSize((const char *)v.payload, v.payload_len);
        PyObject *rec = NULL;
        if (seq != NULL && ts != NULL && payload != NULL) {
            PyObject *values[5] = {topic, s->sn, seq, ts, payload};
            rec = new_record(values);
        }
        Py_XDECREF(seq);
        Py_XDECREF(ts);
        Py_XDECREF(payload);
        if (rec == NULL)
            goto error;
        uint32_t size = (uint32_t)(v.payload_len + 64);   /* Connection._pub_size's measure */
        int rc = PyList_Append(records, rec);
        Py_DECREF(rec);
        if (rc < 0 || plan_add(plan, s->conn, fd, s->gen, v.opaque, size, s->sealed) < 0) {
            if (rc == 0)   /* keep records and plan in step */
                PyList_SetSlice(records, PyList_GET_SIZE(records) - 1, PyList_GET_SIZE(records), NULL);
            goto error;
        }
        s->pending += size;
        if (s->credit > 0)
            s->credit--;
        if (s->sealed)
            s->rx++;
        (*frames)++;
        pos += length;
    }
    Py_XDECREF(topic);
    return pos;
partial:   /* a frame's first bytes: kept for the next read */
    Py_XDECREF(topic);
    {
        uint8_t *t = PyMem_Realloc(s->tail, n - pos);
        if (t == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        memmove(t, buf + pos, n - pos);
        s->tail = t;
        s->tail_len = n - pos;
    }
    return n;
error:
    Py_XDECREF(topic);
    return -1;
}

/* Keep a socket the lane gives up (poll with defer) until the loop takes it back:
 * out of the set, the bytes it did not take (``extra``) after its held partial frame. */
static int lane_defer_bail(LaneObject *ln, lane_slot *s, int fd, const uint8_t *extra,
                           Py_ssize_t n)
{
    if (n > 0) {
        uint8_t *t = PyMem_Realloc(s->tail, s->tail_len + n);
        if (t == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        memmove(t + s->tail_len, extra, n);
        s->tail = t;
        s->tail_len += n;
    }
    if (!s->paused && lane_watch(ln, fd, EPOLL_CTL_DEL, 0) < 0)
        return -1;
    s->paused = 1;
    s->bailed = 1;
    ln->bailed++;
    return 0;
}

/* poll(max_records, defer=0) -> (records, plan, bails, bytes_in, frames_in)
 *
 * Reads each ready socket once. ``records``: NewRecords for the store, in order;
 * ``plan``: whose ack each is (for answer()); ``bails``: (conn, bytes, credit, rx, tx) of
 * each socket the lane gave back this poll (bytes: what Python must read now, empty
 * at EOF or on an error: the transport, reading again, sees it). With ``defer``
 * (a thread other than the loop's polls), a socket given up stays in the lane,
 * unread and holding those bytes, until the loop takes it back with take_bails()
 * or release(): so the loop never sees a socket that is in neither place. */
static PyObject *lane_poll_unlocked(LaneObject *ln, PyObject *args)
{
    Py_ssize_t max_records;
    int defer = 0;
    if (!PyArg_ParseTuple(args, "n|p:poll", &max_records, &defer))
        return NULL;
    struct epoll_event ev[LANE_EVENTS];
    int k = epoll_wait(ln->epfd, ev, LANE_EVENTS, 0);
    if (k < 0 && errno != EINTR)
        return PyErr_SetFromErrno(PyExc_OSError);
    PyObject *records = PyList_New(0), *bails = PyList_New(0), *now = NULL;
    PlanObject *plan = PyObject_New(PlanObject, &PlanType);
    if (plan != NULL) {
        plan->n = plan->cap = 0;
        plan->e = NULL;
    }
    struct timespec tv;
    clock_gettime(CLOCK_MONOTONIC, &tv);   /* time.monotonic()'s clock on Linux */
    now = PyFloat_FromDouble((double)tv.tv_sec + tv.tv_nsec * 1e-9);
    if (records == NULL || bails == NULL || plan == NULL || now == NULL)
        goto error;
    Py_ssize_t bytes_in = 0, frames = 0;
    for (int i = 0; i < k && PyList_GET_SIZE(records) < max_records; i++) {
        int fd = ev[i].data.fd;
        lane_slot *s = lane_slot_of(ln, fd, 0);
        if (s == NULL || s->paused)
            continue;
        Py_ssize_t held = s->tail_len;
        memcpy(ln->rbuf, s->tail, held);
        ssize_t r = recv(fd, ln->rbuf + held, ln->rsize - held, 0);
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
            continue;
        PyObject *bail;
        if (r <= 0) {   /* EOF or a socket error: the transport reads it again */
            if (defer) {   /* (its tail still holds the partial frame, if any) */
                if (lane_defer_bail(ln, s, fd, NULL, 0) < 0)
                    goto error;
                continue;
            }
            bail = lane_detach(ln, fd, NULL, 0);
        } else {
            Py_ssize_t n = held + r;
            s->tail_len = 0;
            bytes_in += r;
            if (PyObject_SetAttr(s->conn, s_last_seen, now) < 0)
                goto error;
            Py_ssize_t pos = lane_take(ln, s, fd, ln->rbuf, n, records, plan, &frames);
            if (pos < 0)
                goto error;
            if (pos == n) {
                if (s->pending > s->limit) {   /* out of the set: a hang-up is */
                    if (lane_watch(ln, fd, EPOLL_CTL_DEL, 0) < 0)   /* reported whatever */
                        goto error;                                 /* the mask */
                    s->paused = 1;
                }
                continue;
            }
            bytes_in -= n - pos;   /* (Python counts what it reads) */
            if (defer) {
                if (lane_defer_bail(ln, s, fd, ln->rbuf + pos, n - pos) < 0)
                    goto error;
                continue;
            }
            bail = lane_detach(ln, fd, ln->rbuf + pos, n - pos);
        }
        if (bail == NULL || PyList_Append(bails, bail) < 0) {
            Py_XDECREF(bail);
            goto error;
        }
        Py_DECREF(bail);
    }
    Py_DECREF(now);
    return Py_BuildValue("(NNNnn)", records, (PyObject *)plan, bails, bytes_in, frames);
error:
    Py_XDECREF(records);
    Py_XDECREF(bails);
    Py_XDECREF(plan);
    Py_XDECREF(now);
    return NULL;
}

/* Is results[i] an Appended (a 4-tuple: offset, topic, queue_offset, duplicate)? */
static int is_appended(PyObject *a)
{
    return PyTuple_Check(a) && PyTuple_GET_SIZE(a) == 4;
}

/* answer(plan, results) -> (stored, duplicates, frames_out, bytes_out, leftovers)
 *
 * The store's results for one poll's records, in order. Each socket still in the
 * lane gets its acks in one send; what the lane cannot finish is a leftover for
 * Python, one per connection: (1, conn, batch, results) when a record was refused,
 * or a sealed session's socket left the lane (Connection._answer_publishes answers
 * them all, in order; those counts are Python's); (2, conn, acks, frames) when the
 * socket left the lane (Python writes them); (3, conn, unsent, held, credit, rx, tx)
 * when the socket did not take its acks whole (the lane gave it back as release()
 * does; Python writes the rest). A sealed session's acks in the lane take the slot's
 * counter, one each. */
static PyObject *lane_answer_unlocked(LaneObject *ln, PyObject *args)
{
    PlanObject *plan;
    PyObject *results;
    if (!PyArg_ParseTuple(args, "O!O!:answer", &PlanType, &plan, &PyList_Type, &results))
        return NULL;
    if (PyList_GET_SIZE(results) != plan->n) {
        PyErr_SetString(PyExc_ValueError, "one result per planned record");
        return NULL;
    }
    PyObject *leftovers = PyList_New(0);
    if (leftovers == NULL)
        return NULL;
    Py_ssize_t stored = 0, dup = 0, frames_out = 0, bytes_out = 0;
    uint8_t *acks = NULL;
    Py_ssize_t i = 0, n = plan->n;
    while (i < n) {
        plan_entry *e = &plan->e[i];
        Py_ssize_t j = i, refused = 0;
        long long size = 0;
        for (; j < n && plan->e[j].conn == e->conn && plan->e[j].gen == e->gen; j++) {
            size += plan->e[j].size;
            if (!is_appended(PyList_GET_ITEM(results, j)))
                refused = 1;
        }
        lane_slot *s = lane_slot_of(ln, e->fd, e->gen);
        if (s != NULL) {
            s->pending -= size;
            if (s->paused && !s->bailed && s->pending <= s->limit / 2) {
                if (lane_watch(ln, e->fd, EPOLL_CTL_ADD, EPOLLIN) < 0)
                    goto error;
                s->paused = 0;
            }
        }
        PyObject *left = NULL;
        /* Python answers the group, refusals and acks in order, when one was refused, and
         * a sealed session's acks once the socket has left the lane: their tags take the
         * session's counters as they are written, which are Python's again */
        if (refused || (e->sealed && s == NULL)) {
            PyObject *batch = PyList_New(j - i), *res = PyList_GetSlice(results, i, j);
            if (batch == NULL || res == NULL) {
                Py_XDECREF(batch);
                Py_XDECREF(res);
                goto error;
            }
            for (Py_ssize_t m = i; m < j; m++) {
                PyObject *t = Py_BuildValue("(kOO)", (unsigned long)plan->e[m].opaque,
                                            Py_False, Py_None);
                if (t == NULL) {
                    Py_DECREF(batch);
                    Py_DECREF(res);
                    goto error;
                }
                PyList_SET_ITEM(batch, m - i, t);
            }
            left = Py_BuildValue("(iONN)", 1, e->conn, batch, res);
        } else {
            int sealed = s != NULL && s->sealed;
            Py_ssize_t unit = sealed ? SEALED_ACK_LEN : ACK_FRAME_LEN;
            Py_ssize_t len = (j - i) * unit;
            uint8_t *o = PyMem_Realloc(acks, len);
            if (o == NULL) {
                PyErr_NoMemory();
                goto error;
            }
            acks = o;
            for (Py_ssize_t m = i; m < j; m++) {
                PyObject *a = PyList_GET_ITEM(results, m);
                Py_INCREF(a);   /* (IsTrue and AsLongLong may run Python code) */
                int is_dup = PyObject_IsTrue(PyTuple_GET_ITEM(a, 3));
                long long offset = PyLong_AsLongLong(PyTuple_GET_ITEM(a, 0));
                Py_DECREF(a);
                if (is_dup < 0 || (offset == -1 && PyErr_Occurred()))
                    goto error;
                is_dup ? dup++ : stored++;
                if (sealed)   /* (the slot's counter: Python's session gets it back on release) */
                    put_sealed_publish_ack(o + (m - i) * unit, s->mids, s->tx++,
                                           plan->e[m].opaque, is_dup, offset);
                else
                    put_publish_ack(o + (m - i) * unit, plan->e[m].opaque, is_dup, offset);
            }
            frames_out += j - i;
            Py_ssize_t sent = 0;
            if (s != NULL) {
                ssize_t w = send(e->fd, acks, len, MSG_DONTWAIT | MSG_NOSIGNAL);
                sent = w > 0 ? w : 0;
                bytes_out += sent;
            }
            if (sent < len) {
                PyObject *rest = PyBytes_FromStringAndSize((const char *)acks + sent, len - sent);
                if (rest == NULL)
                    goto error;
                if (s != NULL) {   /* the socket is Python's again, with the rest to write */
                    /* (conn, held, credit, rx, tx) */
                    PyObject *back = lane_detach(ln, e->fd, NULL, 0);
                    if (back == NULL) {
                        Py_DECREF(rest);
                        goto error;
                    }
                    left = Py_BuildValue("(iONOOOO)", 3, e->conn, rest, PyTuple_GET_ITEM(back, 1),
                                         PyTuple_GET_ITEM(back, 2), PyTuple_GET_ITEM(back, 3),
                                         PyTuple_GET_ITEM(back, 4));
                    Py_DECREF(back);
                } else {
                    left = Py_BuildValue("(iONn)", 2, e->conn, rest, j - i);
                }
            }
        }
        if (left != NULL) {
            int rc = PyList_Append(leftovers, left);
            Py_DECREF(left);
            if (rc < 0)
                goto error;
        } else if (PyErr_Occurred()) {
            goto error;
        }
        i = j;
    }
    PyMem_Free(acks);
    return Py_BuildValue("(nnnnN)", stored, dup, frames_out, bytes_out, leftovers);
error:
    PyMem_Free(acks);
    Py_DECREF(leftovers);
    return NULL;
}

/* take_bails() -> [(conn, bytes, credit, rx, tx)]: every socket poll(defer=1) gave up, out of
 * the lane now (bytes: what Python must read first, as poll's bails). */
static PyObject *lane_take_bails_unlocked(LaneObject *ln, PyObject *unused)
{
    PyObject *bails = PyList_New(0);
    if (bails == NULL)
        return NULL;
    for (int fd = 0; fd < ln->nslots && ln->bailed > 0; fd++) {
        lane_slot *s = ln->slots[fd];
        if (s == NULL || !s->bailed)
            continue;
        PyObject *bail = lane_detach(ln, fd, NULL, 0);
        if (bail == NULL || PyList_Append(bails, bail) < 0) {
            Py_XDECREF(bail);
            Py_DECREF(bails);
            return NULL;
        }
        Py_DECREF(bail);
    }
    return bails;
}

/* bailed() -> how many sockets poll(defer=1) gave up that the loop has not taken */
static PyObject *lane_bailed_unlocked(LaneObject *ln, PyObject *unused)
{
    return PyLong_FromSsize_t(ln->bailed);
}

static PyObject *lane_len_unlocked(LaneObject *ln, PyObject *unused)
{
    return PyLong_FromSsize_t(ln->adopted);
}

static PyObject *lane_close_unlocked(LaneObject *ln, PyObject *unused)
{
    lane_clear_slots(ln);
    Py_RETURN_NONE;
}

/* The methods, each under the lane's mutex (see LaneObject.mu). */
#define LANE_LOCKED(name)                                              \
    static PyObject *name(LaneObject *ln, PyObject *args)              \
    {                                                                  \
        lane_lock(ln);                                                 \
        PyObject *res = name##_unlocked(ln, args);                     \
        pthread_mutex_unlock(&ln->mu);                                 \
        return res;                                                    \
    }
LANE_LOCKED(lane_adopt)
LANE_LOCKED(lane_release)
LANE_LOCKED(lane_poll)
LANE_LOCKED(lane_answer)
LANE_LOCKED(lane_take_bails)
LANE_LOCKED(lane_bailed)
LANE_LOCKED(lane_len)
LANE_LOCKED(lane_close)

static PyMethodDef lane_methods[] = {
    {"fileno", (PyCFunction)lane_fileno, METH_NOARGS, "The epoll fd the loop watches."},
    {"adopt", (PyCFunction)lane_adopt, METH_VARARGS,
     "adopt(fd, conn, sn, topics, credit, limit, pads=None, rx=0, tx=0): read fd's steady "
     "publishes here (pads, rx, tx: a session with frame MACs, its mac_pads and counters)."},
    {"release", (PyCFunction)lane_release, METH_VARARGS,
     "release(fd) -> (conn, held bytes, credit left, rx, tx), or None: give fd back to "
     "Python (rx, tx: a sealed session's counters now)."},
    {"poll", (PyCFunction)lane_poll, METH_VARARGS,
     "poll(max_records, defer=False) -> (records, plan, bails, bytes_in, frames_in)"},
    {"take_bails", (PyCFunction)lane_take_bails, METH_NOARGS,
     "take_bails() -> [(conn, bytes, credit, rx, tx)]: the sockets poll(defer=True) gave up."},
    {"bailed", (PyCFunction)lane_bailed, METH_NOARGS,
     "How many sockets poll(defer=True) gave up and take_bails() has not taken."},
    {"answer", (PyCFunction)lane_answer, METH_VARARGS,
     "answer(plan, results) -> (stored, duplicates, frames_out, bytes_out, leftovers)"},
    {"adopted", (PyCFunction)lane_len, METH_NOARGS, "How many sockets are in the lane."},
    {"close", (PyCFunction)lane_close, METH_NOARGS, "Drop every socket (no answers)."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject LaneType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "lockmq._speedups.Lane",
    .tp_doc = "Lane(record_type, max_frame): steady publish reads and their acks in C "
              "(see the C comment and broker/lane.py).",
    .tp_basicsize = sizeof(LaneObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = lane_new,
    .tp_dealloc = (destructor)lane_dealloc,
    .tp_methods = lane_methods,
};

/* ------------------------------------------------------ broker: MESSAGES out */

#define MSG_FIXED 30   /* queue_offset u64, delivery u16, seq u32, lock_ts_ms u64, broker_ts_us u64 */

static PyObject *s_wire, *s_rec, *s_deliveries, *s_retries;

/* The UTF-8 of a str field (<= 255 bytes for a str8), or NULL with no error set. */
static const char *str8_utf8(PyObject *s, Py_ssize_t *n)
{
    if (!PyUnicode_Check(s))
        return NULL;
    const char *u = PyUnicode_AsUTF8AndSize(s, n);
    if (u == NULL || *n > 255) {
        PyErr_Clear();
        return NULL;
    }
    return u;
}

typedef struct {
    unsigned long long wire, seq, lts, bts;
    unsigned delivery;
    const char *sn, *topic;
    Py_ssize_t sn_len, topic_len;
    PyObject *payload;   /* borrowed from the lease's record, which the list holds */
} lease_view;

/* A lease's fields for its MESSAGES entry; 0 (no error set) for one the Python
 * encoder must write: headers or retries, a field out of its wire range. */
static int view_lease(PyObject *lease, lease_view *v)
{
    int ok = 0;
    PyObject *rec = PyObject_GetAttr(lease, s_rec);
    PyObject *wire = PyObject_GetAttr(lease, s_wire);
    PyObject *dl = PyObject_GetAttr(lease, s_deliveries);
    PyObject *rt = PyObject_GetAttr(lease, s_retries);
    if (rec == NULL || wire == NULL || dl == NULL || rt == NULL
            || !PyTuple_Check(rec) || PyTuple_GET_SIZE(rec) != 9)
        goto out;
    PyObject *headers = PyTuple_GET_ITEM(rec, 7);
    if (!(headers == Py_None || (PyDict_CheckExact(headers) && PyDict_GET_SIZE(headers) == 0)))
        goto out;
    long long dlv = small_uint(dl, 0xFFFF), seq = small_uint(PyTuple_GET_ITEM(rec, 4), MAX_SEQ);
    if (small_uint(rt, 0) != 0 || dlv < 0 || seq < 0)   /* (retries: the Python encoder) */
        goto out;
    v->delivery = (unsigned)dlv;
    v->seq = (unsigned long long)seq;
    /* (u64 on the wire: a retry's queue offset has its top bit set) */
    v->wire = PyLong_AsUnsignedLongLong(wire);
    v->lts = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(rec, 5));
    v->bts = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(rec, 6));
    if (PyErr_Occurred())
        goto out;
    v->payload = PyTuple_GET_ITEM(rec, 8);
    if (!PyBytes_CheckExact(v->payload) || PyBytes_GET_SIZE(v->payload) > 0xFFFFFFFFLL
            || (v->sn = str8_utf8(PyTuple_GET_ITEM(rec, 3), &v->sn_len)) == NULL
            || (v->topic = str8_utf8(PyTuple_GET_ITEM(rec, 2), &v->topic_len)) == NULL)
        goto out;
    ok = 1;
out:
    PyErr_Clear();   /* (whatever went wrong: the Python encoder says it) */
    Py_XDECREF(rec);
    Py_XDECREF(wire);
    Py_XDECREF(dl);
    Py_XDECREF(rt);
    return ok;
}

/* encode_leases(sub_id, leases) -> bytes or None
 *
 * broker/connection.py encode_leases for a pull's leases when none has headers or
 * retries (the common case): the MESSAGES body (SPEC 4) in one buffer, the same
 * bytes as the Python one. None, with no error set, for any other batch: a lease
 * with headers or retries, a field out of its range, more than 65535 leases; the
 * Python encoder then writes it (and raises its own errors). */
static PyObject *encode_leases_c(PyObject *self, PyObject *args)
{
    unsigned long sub_id;
    PyObject *leases;
    if (!PyArg_ParseTuple(args, "kO!:encode_leases", &sub_id, &PyList_Type, &leases))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(leases);
    if (n > 0xFFFF || sub_id > 0xFFFFFFFFUL)
        Py_RETURN_NONE;
    lease_view *views = PyMem_Malloc(sizeof(lease_view) * (n ? n : 1));
    if (views == NULL)
        return PyErr_NoMemory();
    PyObject *out = NULL;
    Py_ssize_t size = 6;
    for (Py_ssize_t k = 0; k < n; k++) {
        if (!view_lease(PyList_GET_ITEM(leases, k), &views[k])) {
            out = Py_NewRef(Py_None);
            goto done;
        }
        size += MSG_FIXED + 2 + views[k].sn_len + views[k].topic_len + 2 + 4
            + PyBytes_GET_SIZE(views[k].payload);
    }
    if ((out = PyBytes_FromStringAndSize(NULL, size)) == NULL)
        goto done;
    uint8_t *w = (uint8_t *)PyBytes_AS_STRING(out);
    put_be32(w, (uint32_t)sub_id);
    w[4] = (uint8_t)(n >> 8);
    w[5] = (uint8_t)n;
    w += 6;
    for (Py_ssize_t k = 0; k < n; k++) {
        lease_view *v = &views[k];
        Py_ssize_t plen = PyBytes_GET_SIZE(v->payload);
        put_be64(w, v->wire);
        w[8] = (uint8_t)(v->delivery >> 8);
        w[9] = (uint8_t)v->delivery;
        put_be32(w + 10, (uint32_t)v->seq);
        put_be64(w + 14, v->lts);
        put_be64(w + 22, v->bts);
        w += MSG_FIXED;
        *w++ = (uint8_t)v->sn_len;
        memcpy(w, v->sn, v->sn_len);
        w += v->sn_len;
        *w++ = (uint8_t)v->topic_len;
        memcpy(w, v->topic, v->topic_len);
        w += v->topic_len;
        *w++ = 0;   /* no headers */
        *w++ = 0;
        put_be32(w, (uint32_t)plen);
        memcpy(w + 4, PyBytes_AS_STRING(v->payload), plen);
        w += 4 + plen;
    }
done:
    PyMem_Free(views);
    return out;
}

/* ------------------------------------------------------ store: reading records */

/* An entry's commit-log offset (the first item of an index entry tuple), or -1. */
static long long entry_offset(PyObject *entries, Py_ssize_t m)
{
    PyObject *e = PyList_GET_ITEM(entries, m);
    if (!PyTuple_Check(e) || PyTuple_GET_SIZE(e) < 1)
        return -1;
    long long off;
    if (!exact_ll(PyTuple_GET_ITEM(e, 0), &off) || off < 0)
        return -1;
    return off;
}

/* A name's text from a name cache ``texts`` (raw bytes -> str, emptied at ``cap``
 * entries as the Python caches are), decoding and remembering it on a miss: as UTF-8
 * (protocol/_fast.py _text8: NULL with no error set when it is not UTF-8), or with
 * ``ascii_replace`` as ASCII with "replace" (store/records.py _text for an SN: never
 * refused). NULL with an error set: out of memory. */
static PyObject *cached_text(PyObject *texts, Py_ssize_t cap, const uint8_t *raw, Py_ssize_t n,
                             int ascii_replace)
{
    PyObject *key = PyBytes_FromStringAndSize((const char *)raw, n);
    if (key == NULL)
        return NULL;
    PyObject *text = PyDict_GetItemWithError(texts, key);
    if (text != NULL) {
        Py_DECREF(key);
        Py_INCREF(text);
        return text;
    }
    if (!PyErr_Occurred())
        text = ascii_replace ? PyUnicode_DecodeASCII((const char *)raw, n, "replace")
                             : PyUnicode_DecodeUTF8((const char *)raw, n, NULL);
    if (text == NULL) {
        Py_DECREF(key);
        if (!ascii_replace && PyErr_ExceptionMatches(PyExc_UnicodeDecodeError))
            PyErr_Clear();   /* (not UTF-8: the Python decoder says so) */
        return NULL;
    }
    if (PyDict_GET_SIZE(texts) >= cap)
        PyDict_Clear(texts);
    int bad = PyDict_SetItem(texts, key, text);
    Py_DECREF(key);
    if (bad) {
        Py_DECREF(text);
        return NULL;
    }
    return text;
}

/* read_run(data, base, entries, i, j, queue_offset, topic, topic_bytes, record_type, texts,
 *          cap, out) -> m
 *
 * store/reads.py read_topic's records entries[i:j] of one pread, ``data`` read at
 * commit-log offset ``base``: each appended to ``out`` as decode_record makes it,
 * record_type(offset, queue_offset + m, topic, sn, seq, lock_ts_ms, broker_ts_us,
 * None, payload). Returns the index of the first entry it did not take (j when it
 * took them all): a record outside ``data``, not whole, of another format, with a
 * bad CRC-32, of another topic than ``topic_bytes``, or with headers (JSON: Python
 * parses them). decode_record then reads that one, raising its own CorruptRecord,
 * so the errors cannot drift. The SN comes from decode_record's name cache
 * ``texts`` (raw -> str, emptied at ``cap`` entries), decoded as it does on a miss. */
static PyObject *read_run(PyObject *self, PyObject *args)
{
    Py_buffer view, tview;
    long long base, qoff;
    Py_ssize_t i, j, cap;
    PyObject *entries, *topic, *cls, *texts, *out;
    if (!PyArg_ParseTuple(args, "y*LO!nnLUy*O!O!nO!:read_run", &view, &base, &PyList_Type,
                          &entries, &i, &j, &qoff, &topic, &tview, &PyType_Type, &cls,
                          &PyDict_Type, &texts, &cap, &PyList_Type, &out))
        return NULL;
    const uint8_t *b = (const uint8_t *)view.buf, *tb = (const uint8_t *)tview.buf;
    Py_ssize_t size = view.len, tlen_want = tview.len;
    PyObject *result = NULL;
    if (!PyType_IsSubtype((PyTypeObject *)cls, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "read_run: record_type must be a tuple type");
        goto done;
    }
    if (i < 0)
        i = 0;
    if (j > PyList_GET_SIZE(entries))
        j = PyList_GET_SIZE(entries);
    Py_ssize_t m;
    for (m = i; m < j; m++) {
        long long off = entry_offset(entries, m);
        if (off < base || off - base > size - RECORD_HEADER)
            break;
        const uint8_t *r = b + (off - base);
        Py_ssize_t avail = size - (Py_ssize_t)(off - base);
        uint32_t length = le32(r), crc = le32(r + 4);
        unsigned fmt = r[8], tlen = r[10] | r[11] << 8, slen = r[12], hlen = r[14] | r[15] << 8;
        uint32_t seq = le32(r + 16), plen = le32(r + 20);
        if (length < RECORD_HEADER - 4 || (Py_ssize_t)length > avail - 4 || fmt != FORMAT_VERSION
                || (uint64_t)RECORD_HEADER + tlen + slen + hlen + plen != (uint64_t)length + 4
                || crc32(r + 8, (Py_ssize_t)length - 4, 0) != crc
                || hlen != 0 || (Py_ssize_t)tlen != tlen_want || memcmp(r + RECORD_HEADER, tb, tlen) != 0)
            break;
        PyObject *sn = cached_text(texts, cap, r + RECORD_HEADER + tlen, slen, 1);
        if (sn == NULL)
            goto done;
        PyObject *rec = ((PyTypeObject *)cls)->tp_alloc((PyTypeObject *)cls, 9);
        if (rec == NULL) {
            Py_DECREF(sn);
            goto done;
        }
        Py_INCREF(topic);
        PyTuple_SET_ITEM(rec, 2, topic);
        PyTuple_SET_ITEM(rec, 3, sn);
        PyTuple_SET_ITEM(rec, 7, Py_NewRef(Py_None));
        PyObject *v;
        int bad = 0;
        bad |= (v = PyLong_FromLongLong(off)) == NULL;
        if (v) PyTuple_SET_ITEM(rec, 0, v);
        bad |= (v = PyLong_FromLongLong(qoff + m)) == NULL;
        if (v) PyTuple_SET_ITEM(rec, 1, v);
        bad |= (v = PyLong_FromUnsignedLong(seq)) == NULL;
        if (v) PyTuple_SET_ITEM(rec, 4, v);
        bad |= (v = PyLong_FromUnsignedLongLong(le64(r + 24))) == NULL;
        if (v) PyTuple_SET_ITEM(rec, 5, v);
        bad |= (v = PyLong_FromUnsignedLongLong(le64(r + 32))) == NULL;
        if (v) PyTuple_SET_ITEM(rec, 6, v);
        bad |= (v = PyBytes_FromStringAndSize((const char *)r + RECORD_HEADER + tlen + slen, plen)) == NULL;
        if (v) PyTuple_SET_ITEM(rec, 8, v);
        if (bad || PyList_Append(out, rec) < 0) {
            Py_DECREF(rec);
            goto done;
        }
        Py_DECREF(rec);
    }
    result = PyLong_FromSsize_t(m);
done:
    PyBuffer_Release(&view);
    PyBuffer_Release(&tview);
    return result;
}

/* ---------------------------------------------------------- consumer: MESSAGES */



/* messages_fields(body, texts, cap) -> (sub_id, rows) or None.
 *
 * A MESSAGES body (SPEC 4, protocol/_consume.py) as one tuple per message, in the
 * order lockmq.client.Message takes them: (topic, sn, seq, payload, delivery,
 * lock_ts_ms, broker_ts_us, headers bytes, queue_offset). None, with no error set,
 * for any body the Python decoder would refuse (truncated, trailing bytes, a name
 * that is not UTF-8): the caller then decodes it there, which raises the protocol's
 * own BadBody, so the errors cannot drift. */
static PyObject *messages_fields(PyObject *self, PyObject *args)
{
    Py_buffer view;
    PyObject *texts;
    Py_ssize_t cap;
    if (!PyArg_ParseTuple(args, "y*O!n:messages_fields", &view, &PyDict_Type, &texts, &cap))
        return NULL;
    const uint8_t *b = (const uint8_t *)view.buf;
    Py_ssize_t size = view.len, pos = 6;
    PyObject *rows = NULL, *out = NULL;
    if (size < 6)
        goto refuse;
    uint32_t sub_id = be32(b);
    unsigned count = (unsigned)b[4] << 8 | b[5];
    /* each message takes at least MSG_FIXED + 2 + 2 + 4 bytes: a count the body
     * cannot hold is refused before any list of that size is made */
    if ((Py_ssize_t)count * (MSG_FIXED + 8) > size - 6)
        goto refuse;
    if ((rows = PyList_New(count)) == NULL)
        goto done;
    for (unsigned i = 0; i < count; i++) {
        if (size - pos < MSG_FIXED + 1)
            goto refuse;
        const uint8_t *m = b + pos;
        Py_ssize_t at = pos + MSG_FIXED;
        Py_ssize_t sn_at = at + 1, sn_len = b[at];
        at = sn_at + sn_len;
        if (size - at < 1)
            goto refuse;
        Py_ssize_t tp_at = at + 1, tp_len = b[at];
        at = tp_at + tp_len;
        if (size - at < 2)
            goto refuse;
        Py_ssize_t h_len = (Py_ssize_t)b[at] << 8 | b[at + 1];
        Py_ssize_t h_at = at + 2;
        at = h_at + h_len;
        if (size - at < 4)
            goto refuse;
        Py_ssize_t p_len = (Py_ssize_t)be32(b + at);
        Py_ssize_t p_at = at + 4;
        if (size - p_at < p_len)
            goto refuse;
        pos = p_at + p_len;
        PyObject *sn = cached_text(texts, cap, b + sn_at, sn_len, 0);
        if (sn == NULL)
            goto refuse_or_fail;
        PyObject *topic = cached_text(texts, cap, b + tp_at, tp_len, 0);
        if (topic == NULL) {
            Py_DECREF(sn);
            goto refuse_or_fail;
        }
        PyObject *row = PyTuple_New(9);
        if (row == NULL) {
            Py_DECREF(sn);
            Py_DECREF(topic);
            goto done;
        }
        PyTuple_SET_ITEM(row, 0, topic);
        PyTuple_SET_ITEM(row, 1, sn);
        PyList_SET_ITEM(rows, i, row);   /* (a row half made is freed with the list) */
        PyObject *v;
        if (!(v = PyLong_FromUnsignedLong(be32(m + 10)))) goto done;
        PyTuple_SET_ITEM(row, 2, v);
        if (!(v = PyBytes_FromStringAndSize((const char *)b + p_at, p_len))) goto done;
        PyTuple_SET_ITEM(row, 3, v);
        if (!(v = PyLong_FromUnsignedLong((unsigned long)m[8] << 8 | m[9]))) goto done;
        PyTuple_SET_ITEM(row, 4, v);
        if (!(v = PyLong_FromUnsignedLongLong(be64(m + 14)))) goto done;
        PyTuple_SET_ITEM(row, 5, v);
        if (!(v = PyLong_FromUnsignedLongLong(be64(m + 22)))) goto done;
        PyTuple_SET_ITEM(row, 6, v);
        if (!(v = PyBytes_FromStringAndSize((const char *)b + h_at, h_len))) goto done;
        PyTuple_SET_ITEM(row, 7, v);
        if (!(v = PyLong_FromUnsignedLongLong(be64(m)))) goto done;
        PyTuple_SET_ITEM(row, 8, v);
    }
    if (pos != size)
        goto refuse;
    out = Py_BuildValue("(kN)", (unsigned long)sub_id, rows);
    rows = NULL;
    goto done;
refuse_or_fail:
    if (PyErr_Occurred())
        goto done;
refuse:
    out = Py_NewRef(Py_None);
done:
    Py_XDECREF(rows);
    PyBuffer_Release(&view);
    return out;
}

/* ------------------------------------------------------------ checksums API */

static PyObject *py_crc16(PyObject *self, PyObject *args)
{
    Py_buffer v;
    unsigned int crc = 0xFFFF;
    if (!PyArg_ParseTuple(args, "y*|I:crc16", &v, &crc))
        return NULL;
    uint16_t r = crc16((const uint8_t *)v.buf, v.len, (uint16_t)crc);
    PyBuffer_Release(&v);
    return PyLong_FromUnsignedLong(r);
}

static PyObject *py_crc32(PyObject *self, PyObject *args)
{
    Py_buffer v;
    unsigned int crc = 0;
    if (!PyArg_ParseTuple(args, "y*|I:crc32", &v, &crc))
        return NULL;
    uint32_t r = crc32((const uint8_t *)v.buf, v.len, crc);
    PyBuffer_Release(&v);
    return PyLong_FromUnsignedLong(r);
}

static PyMethodDef methods[] = {
    {"scan_publishes", scan_publishes, METH_VARARGS,
     "scan_publishes(buf, pos, max_frame, sn, limit) -> (list, pos): the field tuples "
     "(opaque, flags, sn, topic, seq, lock_ts_ms, payload) of the whole, valid PUBLISH "
     "frames from buf[pos:] on, at most limit; pos: where the scan stopped."},
    {"scan_frame", scan_frame, METH_VARARGS,
     "scan_frame(buf, pos, max_frame, known) -> (opcode, sn, flags, opaque, body, end) "
     "of the whole, valid frame at buf[pos:] with an opcode in known, or None."},
    {"encode_records", encode_records, METH_VARARGS,
     "encode_records(records, broker_ts_us, max_record_bytes, topic_cache, known) -> "
     "(list, total, new_topics, slow): commit-log bytes per record, None where the "
     "Python encoder must run (slow: how many)."},
    {"publish_acks", publish_acks, METH_VARARGS,
     "publish_acks(batch, results, start) -> (bytes, frames, stored, duplicates, next)"},
    {"sealed_publish_acks", sealed_publish_acks, METH_VARARGS,
     "sealed_publish_acks(batch, results, start, pads, tx) -> as publish_acks, each ack "
     "sealed with a frame MAC, the i-th for the counter tx + i."},
    {"queue_run", (PyCFunction)(void (*)(void))queue_run, METH_FASTCALL,
     "queue_run(pubs, start, limit, record_type, queue, records) -> (stop, size): the "
     "run of answered scan_publishes tuples to pubs[start]'s topic, at most limit, "
     "queued as Connection._publish queues records (see the C comment)."},
    {"plan_run", plan_run, METH_VARARGS,
     "plan_run(records, enc, i, pos, q, topic, seg_limit, active_base, seen, high_water, "
     "ids, parts, blob, results, ts_s, appended) -> (i, pos, q): the store writer's "
     "loop over new records of one topic (see the C comment)."},
    {"dedup_run", dedup_run, METH_VARARGS,
     "dedup_run(table, ids, i, window) -> i: DedupTable.add_many's in-order ids from "
     "ids[i:] on (see the C comment)."},
    {"commit_write", commit_write, METH_VARARGS,
     "commit_write(index_writes, fd, parts, pos, sync): a group commit's pwrites and "
     "fdatasync with the GIL released once (see the C comment)."},
    {"plan_calls", plan_calls, METH_VARARGS,
     "plan_calls(batch, k, pos, q, topic, seg_limit, active_base, seen, high_water, ids, "
     "parts, blob, results, appended) -> (k, i, pos, q, res): plan_run over whole append "
     "calls of a group commit (see the C comment)."},
    {"mac_pads", py_mac_pads, METH_VARARGS,
     "mac_pads(key) -> 64 bytes: the midstates of key's two HMAC-SHA256 pads."},
    {"frame_tag", py_frame_tag, METH_VARARGS,
     "frame_tag(pads, direction, counter, opcode, flags, opaque, sn, body) -> the 16-byte "
     "tag of a frame MAC (protocol/_mac.py frame_tag), from mac_pads' midstates."},
    {"scan_sealed_publishes", scan_sealed_publishes, METH_VARARGS,
     "scan_sealed_publishes(buf, pos, max_frame, sn, limit, pads, rx) -> (list, pos, rx): "
     "scan_publishes for a session with frame MACs: each PUBLISH's tag checked against "
     "the session's rx-th, cut off its payload, rx advanced per frame."},
    {"encode_leases", encode_leases_c, METH_VARARGS,
     "encode_leases(sub_id, leases) -> bytes or None: broker/connection.py encode_leases "
     "for leases without headers or retries; None for any other batch."},
    {"read_run", read_run, METH_VARARGS,
     "read_run(data, base, entries, i, j, queue_offset, topic, topic_bytes, record_type, "
     "texts, cap, out) -> m: store/reads.py's records entries[i:j] from one pread, "
     "appended to out; m: the first one decode_record must read (see the C comment)."},
    {"messages_fields", messages_fields, METH_VARARGS,
     "messages_fields(body, texts, cap) -> (sub_id, rows) or None: a MESSAGES body's "
     "messages as (topic, sn, seq, payload, delivery, lock_ts_ms, broker_ts_us, headers, "
     "queue_offset) tuples; None for a body the Python decoder refuses."},
    {"crc16", py_crc16, METH_VARARGS, "crc16(data, crc=0xFFFF): CRC-16/CCITT-FALSE"},
    {"crc32", py_crc32, METH_VARARGS, "crc32(data, crc=0): zlib's CRC-32"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "lockmq._speedups",
    "The broker's per-record hot path in C (optional; see lockmq.accel).", -1, methods,
};

PyMODINIT_FUNC PyInit__speedups(void)
{
    init_tables();
    sha256_pick();
    if (!(s_topic = PyUnicode_InternFromString("topic")) || !(s_sn = PyUnicode_InternFromString("sn"))
            || !(s_seq = PyUnicode_InternFromString("seq"))
            || !(s_lock_ts_ms = PyUnicode_InternFromString("lock_ts_ms"))
            || !(s_payload = PyUnicode_InternFromString("payload"))
            || !(s_headers = PyUnicode_InternFromString("headers"))
            || !(s_move_to_end = PyUnicode_InternFromString("move_to_end")))
        return NULL;
    if (!(s_last_seen = PyUnicode_InternFromString("last_seen"))
            || !(s_wire = PyUnicode_InternFromString("wire"))
            || !(s_rec = PyUnicode_InternFromString("rec"))
            || !(s_deliveries = PyUnicode_InternFromString("deliveries"))
            || !(s_retries = PyUnicode_InternFromString("retries")))
        return NULL;
    if (PyType_Ready(&LaneType) < 0 || PyType_Ready(&PlanType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "Lane", (PyObject *)&LaneType) < 0
            || PyModule_AddStringConstant(m, "SHA256", sha256_impl) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
