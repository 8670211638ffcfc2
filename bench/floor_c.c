/* The compiled floor: what this machine can do for a lockmq-speaking server.
 *
 * Same answers as bench/floors.py, in C: one thread, one epoll loop, non-blocking
 * sockets. Every frame is checked (version, length, CRC-16/CCITT-FALSE) and each
 * PUBLISH body's topic, seq and time are read, as a broker must; CONNECT gets a
 * CHALLENGE, AUTH a CONNECT_ACK, PUBLISH a PUBLISH_ACK, HEARTBEAT (not oneway) its
 * answer, DISCONNECT a close.
 *   --mode ack    acknowledge every PUBLISH at once, store nothing;
 *   --mode fsync  append every PUBLISH (sn + body) of one epoll round to one file,
 *                 one write() and one fdatasync() for the round (group commit),
 *                 and only then send that round's acks.
 * Built by bench/bench_broker.py with `cc -O2` into a temp dir:
 *   cc -O2 -o floor_c bench/floor_c.c && ./floor_c --mode fsync --port 6900 --dir /tmp/x
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

enum { OP_CONNECT = 0x01, OP_CHALLENGE = 0x02, OP_AUTH = 0x03, OP_CONNECT_ACK = 0x04,
       OP_HEARTBEAT = 0x05, OP_DISCONNECT = 0x06, OP_PUBLISH = 0x10, OP_PUBLISH_ACK = 0x11 };
enum { F_ONEWAY = 0x01, F_RESPONSE = 0x02 };
#define MIN_FRAME 15
#define MAX_SN 64
#define MAX_FRAME (1024 * 1024)

typedef struct { unsigned char *p; size_t len, cap; } buf_t;

typedef struct conn {
    int fd;
    buf_t in, out, acks;      /* acks: waiting for this round's fdatasync (fsync mode) */
    uint64_t offset;          /* records acknowledged on this connection */
    int waiting;              /* on the round's list of connections with acks */
    int closing;
} conn_t;

static uint16_t crc_table[256];
static int fsync_mode, log_fd = -1, ep;
static buf_t round_data;      /* fsync mode: this round's records */
static conn_t **round_conns;  /* fsync mode: connections with acks in this round */
static size_t n_round, cap_round;
static conn_t **dead;         /* closed this round, freed at its end */
static size_t n_dead, cap_dead;

static void crc_init(void) {
    for (int i = 0; i < 256; i++) {
        uint16_t c = (uint16_t)(i << 8);
        for (int b = 0; b < 8; b++) c = (c & 0x8000) ? (uint16_t)((c << 1) ^ 0x1021) : (uint16_t)(c << 1);
        crc_table[i] = c;
    }
}

static uint16_t crc16(const unsigned char *d, size_t n) {
    uint16_t c = 0xFFFF;
    while (n--) c = (uint16_t)((c << 8) ^ crc_table[((c >> 8) ^ *d++) & 0xFF]);
    return c;
}

static void reserve(buf_t *b, size_t more) {
    if (b->len + more <= b->cap) return;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + more) cap *= 2;
    b->p = realloc(b->p, cap);
    if (!b->p) { perror("realloc"); exit(1); }
    b->cap = cap;
}

static void put(buf_t *b, const void *d, size_t n) { reserve(b, n); memcpy(b->p + b->len, d, n); b->len += n; }
static void be16(unsigned char *p, uint32_t v) { p[0] = v >> 8; p[1] = v; }
static void be32(unsigned char *p, uint32_t v) { p[0] = v >> 24; p[1] = v >> 16; p[2] = v >> 8; p[3] = v; }
static void be64(unsigned char *p, uint64_t v) { be32(p, (uint32_t)(v >> 32)); be32(p + 4, (uint32_t)v); }
static uint32_t rd32(const unsigned char *p) { return (uint32_t)p[0] << 24 | p[1] << 16 | p[2] << 8 | p[3]; }

static uint64_t now_ms(void) {
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (uint64_t)tv.tv_sec * 1000 + tv.tv_usec / 1000;
}

/* A response frame (empty SN, RESPONSE flag) with ``body`` appended to ``b``. */
static void response(buf_t *b, uint16_t op, uint32_t opaque, const unsigned char *body, size_t n) {
    size_t len = MIN_FRAME + n;
    reserve(b, len);
    unsigned char *f = b->p + b->len;
    f[0] = 1; be32(f + 1, (uint32_t)len); be16(f + 5, op); f[7] = 0; f[8] = F_RESPONSE;
    be32(f + 9, opaque);
    memcpy(f + 13, body, n);
    be16(f + 13 + n, crc16(f, 13 + n));
    b->len += len;
}

static void watch(conn_t *c, int want_out) {
    struct epoll_event ev = { .events = EPOLLIN | (want_out ? EPOLLOUT : 0), .data.ptr = c };
    epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev);
}

/* Close a connection; it is freed at the end of the round (a later event of the same
 * epoll round, or the round's ack list, may still point at it). */
static void drop(conn_t *c) {
    if (c->fd < 0) return;
    epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    c->fd = -1;
    if (n_dead == cap_dead) {
        cap_dead = cap_dead ? cap_dead * 2 : 256;
        dead = realloc(dead, cap_dead * sizeof *dead);
    }
    dead[n_dead++] = c;
}

static void free_dead(void) {
    for (size_t i = 0; i < n_dead; i++) {
        conn_t *c = dead[i];
        free(c->in.p); free(c->out.p); free(c->acks.p); free(c);
    }
    n_dead = 0;
}

/* Write what is queued; 0 if the connection is gone. */
static int flush_out(conn_t *c) {
    size_t done = 0;
    while (done < c->out.len) {
        ssize_t w = write(c->fd, c->out.p + done, c->out.len - done);
        if (w < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN) break;
            drop(c);
            return 0;
        }
        done += (size_t)w;
    }
    memmove(c->out.p, c->out.p + done, c->out.len - done);
    c->out.len -= done;
    watch(c, c->out.len > 0);
    if (c->closing && !c->out.len) { drop(c); return 0; }
    return 1;
}

/* Every whole frame in ``c->in``; -1 on a bad frame (the connection is dropped). */
static int on_frames(conn_t *c) {
    size_t pos = 0;
    unsigned char body[64];
    while (c->in.len - pos >= 8) {
        unsigned char *f = c->in.p + pos;
        uint32_t len = rd32(f + 1);
        unsigned sn_len = f[7];
        if (f[0] != 1 || sn_len > MAX_SN || len < MIN_FRAME + sn_len || len > MAX_FRAME) return -1;
        if (c->in.len - pos < len) break;
        if (crc16(f, len - 2) != (uint16_t)(f[len - 2] << 8 | f[len - 1])) return -1;
        uint16_t op = (uint16_t)(f[5] << 8 | f[6]);
        unsigned flags = f[8 + sn_len];
        uint32_t opaque = rd32(f + 9 + sn_len);
        const unsigned char *b = f + 13 + sn_len;
        size_t n = len - MIN_FRAME - sn_len;
        if (op == OP_PUBLISH) {
            if (n < 13 || n < 13u + b[0]) return -1;     /* topic, seq u32, ts u64, payload */
            c->offset++;
            if (fsync_mode) {
                put(&round_data, f + 8, sn_len);
                put(&round_data, b, n);
            }
            if (!(flags & F_ONEWAY)) {
                body[0] = 0; be64(body + 1, c->offset);
                response(fsync_mode ? &c->acks : &c->out, OP_PUBLISH_ACK, opaque, body, 9);
                if (fsync_mode && !c->waiting) {
                    if (n_round == cap_round) {
                        cap_round = cap_round ? cap_round * 2 : 256;
                        round_conns = realloc(round_conns, cap_round * sizeof *round_conns);
                    }
                    round_conns[n_round++] = c;
                    c->waiting = 1;
                }
            }
        } else if (op == OP_CONNECT) {
            for (int i = 0; i < 16; i++) body[i] = (unsigned char)rand();
            be64(body + 16, now_ms()); body[24] = 3;
            response(&c->out, OP_CHALLENGE, opaque, body, 25);
        } else if (op == OP_AUTH) {
            be16(body, 30); be32(body + 2, MAX_FRAME); be64(body + 6, now_ms());
            be32(body + 14, 0xFFFFFFFFu); be32(body + 18, 1);
            response(&c->out, OP_CONNECT_ACK, opaque, body, 22);
        } else if (op == OP_HEARTBEAT) {
            if (!(flags & F_ONEWAY)) response(&c->out, OP_HEARTBEAT, opaque, body, 0);
        } else if (op == OP_DISCONNECT) {
            c->closing = 1;
        }
        pos += len;
    }
    memmove(c->in.p, c->in.p + pos, c->in.len - pos);
    c->in.len -= pos;
    return 0;
}

static void on_readable(conn_t *c) {
    for (;;) {
        reserve(&c->in, 65536);
        ssize_t r = read(c->fd, c->in.p + c->in.len, c->in.cap - c->in.len);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0 && errno == EAGAIN) break;
        if (r <= 0) { drop(c); return; }
        c->in.len += (size_t)r;
        if (on_frames(c) < 0) { drop(c); return; }
        if ((size_t)r < 65536) break;
    }
    if (c->out.len || c->closing) flush_out(c);
}

/* fsync mode, once per epoll round: one write and one fdatasync, then the acks. */
static void commit_round(void) {
    if (round_data.len) {
        size_t done = 0;
        while (done < round_data.len) {
            ssize_t w = write(log_fd, round_data.p + done, round_data.len - done);
            if (w < 0 && errno == EINTR) continue;
            if (w < 0) { perror("write"); exit(1); }
            done += (size_t)w;
        }
        if (fdatasync(log_fd) < 0) { perror("fdatasync"); exit(1); }
        round_data.len = 0;
    }
    for (size_t i = 0; i < n_round; i++) {
        conn_t *c = round_conns[i];
        c->waiting = 0;
        if (c->fd < 0) continue;
        put(&c->out, c->acks.p, c->acks.len);
        c->acks.len = 0;
        flush_out(c);
    }
    n_round = 0;
}

int main(int argc, char **argv) {
    const char *mode = "ack", *dir = ".", *host = "127.0.0.1";
    int port = 6900;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--mode")) mode = argv[i + 1];
        else if (!strcmp(argv[i], "--port")) port = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--dir")) dir = argv[i + 1];
        else if (!strcmp(argv[i], "--host")) host = argv[i + 1];
        else { fprintf(stderr, "usage: floor_c [--mode ack|fsync] [--port P] [--dir D]\n"); return 2; }
    }
    fsync_mode = !strcmp(mode, "fsync");
    crc_init();
    srand((unsigned)now_ms());
    if (fsync_mode) {
        char path[4096];
        snprintf(path, sizeof path, "%s/floor.log", dir);
        log_fd = open(path, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (log_fd < 0) { perror(path); return 1; }
    }
    int ls = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0), one = 1;
    setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
    inet_pton(AF_INET, host, &a.sin_addr);
    if (bind(ls, (struct sockaddr *)&a, sizeof a) < 0 || listen(ls, 8192) < 0) { perror("listen"); return 1; }
    ep = epoll_create1(0);
    struct epoll_event ev = { .events = EPOLLIN, .data.ptr = NULL };
    epoll_ctl(ep, EPOLL_CTL_ADD, ls, &ev);
    printf("floor_c %s listening on %s:%d\n", mode, host, port);
    fflush(stdout);
    struct epoll_event evs[512];
    for (;;) {
        int n = epoll_wait(ep, evs, 512, -1);
        if (n < 0 && errno == EINTR) continue;
        for (int i = 0; i < n; i++) {
            conn_t *c = evs[i].data.ptr;
            if (c == NULL) {            /* the listener: accept every waiting connection */
                int fd;
                while ((fd = accept4(ls, NULL, NULL, SOCK_NONBLOCK)) >= 0) {
                    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                    conn_t *nc = calloc(1, sizeof *nc);
                    nc->fd = fd;
                    struct epoll_event cev = { .events = EPOLLIN, .data.ptr = nc };
                    epoll_ctl(ep, EPOLL_CTL_ADD, fd, &cev);
                }
                continue;
            }
            if (c->fd < 0) continue;    /* dropped earlier in this round */
            if (evs[i].events & EPOLLOUT) { if (!flush_out(c)) continue; }
            if (evs[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) on_readable(c);
        }
        if (fsync_mode) commit_round();
        free_dead();
    }
}
