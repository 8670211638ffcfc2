/* The compiled floor: what this machine can do for a lockmq-speaking server.
 *
 * Same answers as bench/floors.py, in C: one epoll loop on one thread, non-blocking
 * sockets. Every frame is checked (version, length, CRC-16/CCITT-FALSE) and each
 * PUBLISH body's topic, seq and time are read, as a broker must; CONNECT gets a
 * CHALLENGE, AUTH a CONNECT_ACK, PUBLISH a PUBLISH_ACK, HEARTBEAT (not oneway) its
 * answer, DISCONNECT a close.
 *   --mode ack    acknowledge every PUBLISH at once, store nothing;
 *   --mode fsync  append every PUBLISH (sn + body) of one epoll round to one file,
 *                 one write() and one fdatasync() for the round (group commit),
 *                 and only then send that round's acks: INLINE on the one thread, so
 *                 nothing is read while the disk syncs;
 *   --mode fsync-thread  the same records and acks, but each round's records and acks
 *                 are handed to one writer thread, and the epoll thread goes on
 *                 reading. The writer takes everything queued since its last
 *                 fdatasync (group commit: one write, one fdatasync), then hands the
 *                 acks back through an eventfd; the epoll thread writes them. As in
 *                 fsync mode, no ack leaves before its record's fdatasync.
 *                 --writers N (default 1): N writer threads, so up to N fdatasyncs
 *                 are in flight at once. Each takes what is queued and writes it in
 *                 turn (the log stays in take order), then fdatasyncs without waiting
 *                 for the others; acks go back in take order, each batch's only after
 *                 its own fdatasync and every earlier batch's.
 *   --mode delay  fsync-thread without the disk: the writer takes the queued batch as
 *                 there, then waits --delay-us instead of its write and fdatasync, and
 *                 stores nothing. So its acks are as late as a durable server's, at no
 *                 I/O cost: what durability's latency alone costs a closed-loop load.
 *                 --delay-us 0 or absent: the median of 200 4 KiB pwrite + fdatasync
 *                 of a file in --dir, measured at start (this disk's idle latency).
 * Built by bench/bench_broker.py with `cc -O2 -pthread` into a temp dir:
 *   cc -O2 -pthread -o floor_c bench/floor_c.c
 *   ./floor_c --mode fsync-thread --port 6900 --dir /tmp/x
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

enum { OP_CONNECT = 0x01, OP_CHALLENGE = 0x02, OP_AUTH = 0x03, OP_CONNECT_ACK = 0x04,
       OP_HEARTBEAT = 0x05, OP_DISCONNECT = 0x06, OP_PUBLISH = 0x10, OP_PUBLISH_ACK = 0x11 };
enum { F_ONEWAY = 0x01, F_RESPONSE = 0x02 };
enum mode { MODE_ACK, MODE_FSYNC, MODE_FSYNC_THREAD, MODE_DELAY };
/* fsync-thread and delay share the writer thread and the hand-offs */
#define THREADED(m) ((m) == MODE_FSYNC_THREAD || (m) == MODE_DELAY)
#define MIN_FRAME 15
#define MAX_SN 64
#define MAX_FRAME (1024 * 1024)

typedef struct { unsigned char *p; size_t len, cap; } buf_t;

typedef struct conn {
    int fd;
    buf_t in, out, acks;      /* acks: waiting for this round's fdatasync (storing modes) */
    uint64_t offset;          /* records acknowledged on this connection */
    int waiting;              /* on the round's list of connections with acks */
    int closing;
    int want_out;             /* EPOLLOUT is registered (unsent output) */
    unsigned in_flight;       /* fsync-thread: ack runs held by the writer (not yet freed) */
} conn_t;

/* fsync-thread: what travels between the epoll thread and the writer. The records of
 * one or more rounds, their acks, and which connection each run of acks is for. */
typedef struct { conn_t *conn; size_t off, len; } ack_run_t;
typedef struct {
    buf_t data;               /* records to append */
    buf_t acks;               /* ack frames, back to back */
    ack_run_t *runs;          /* runs[i]: acks.p[off, off + len) go to runs[i].conn */
    size_t n_runs, cap_runs;
} batch_t;

static uint16_t crc_table[256];
static enum mode mode;
static int log_fd = -1, ep, wake_fd = -1;
static int commit_delay_ms;   /* tests: hold each commit before its write (see main) */
static long delay_us;         /* delay: each batch's wait instead of its write and fdatasync */
static int n_writers = 1;     /* fsync-thread: writer threads (fdatasyncs in flight) */
static buf_t round_data;      /* storing modes: this round's records */
static conn_t **round_conns;  /* storing modes: connections with acks in this round */
static size_t n_round, cap_round;
static conn_t **dead;         /* closed; freed at a round's end once nothing points at them */
static size_t n_dead, cap_dead;
/* fsync-thread: ``queued`` (epoll thread -> writer) and ``durable`` (writer -> epoll
 * thread), both under ``lock``; the writer sleeps on ``queued_cond``. */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t queued_cond = PTHREAD_COND_INITIALIZER;
static batch_t queued, durable;
/* fsync-thread with several writers: ``write_mu`` keeps the log in take order; batch
 * number ``taken`` is the next to take, ``released`` the next whose acks may go */
static pthread_mutex_t write_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t released_cond = PTHREAD_COND_INITIALIZER;
static unsigned long long taken, released;
static int loop_asleep;       /* the epoll thread may sleep: wake it through the eventfd */
static char wake_tag;         /* epoll data.ptr of the eventfd (the listener's is NULL) */

static void die(const char *what) { perror(what); exit(1); }

static void *xrealloc(void *p, size_t n) {
    p = realloc(p, n);
    if (!p) die("realloc");
    return p;
}

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
    b->p = xrealloc(b->p, cap);
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

/* Ask for EPOLLOUT while output is left unsent; a syscall only when that changes. */
static void watch(conn_t *c, int want_out) {
    if (c->want_out == want_out) return;
    c->want_out = want_out;
    struct epoll_event ev = { .events = EPOLLIN | (want_out ? EPOLLOUT : 0), .data.ptr = c };
    if (epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev) < 0) die("epoll_ctl MOD");
}

/* Close a connection; it is freed at the end of a round (a later event of the same
 * epoll round, the round's ack list or the writer's ack runs may still point at it). */
static void drop(conn_t *c) {
    if (c->fd < 0) return;
    epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);   /* close() would remove it anyway */
    close(c->fd);
    c->fd = -1;
    if (n_dead == cap_dead) {
        cap_dead = cap_dead ? cap_dead * 2 : 256;
        dead = xrealloc(dead, cap_dead * sizeof *dead);
    }
    dead[n_dead++] = c;
}

/* Free the closed connections nothing points at any more; keep the others. */
static void free_dead(void) {
    size_t kept = 0;
    for (size_t i = 0; i < n_dead; i++) {
        conn_t *c = dead[i];
        if (c->in_flight) { dead[kept++] = c; continue; }
        free(c->in.p); free(c->out.p); free(c->acks.p); free(c);
    }
    n_dead = kept;
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
            int storing = mode != MODE_ACK;
            if (n < 13 || n < 13u + b[0]) return -1;     /* topic, seq u32, ts u64, payload */
            c->offset++;
            if (storing) {
                put(&round_data, f + 8, sn_len);
                put(&round_data, b, n);
            }
            if (!(flags & F_ONEWAY)) {
                body[0] = 0; be64(body + 1, c->offset);
                response(storing ? &c->acks : &c->out, OP_PUBLISH_ACK, opaque, body, 9);
                if (storing && !c->waiting) {
                    if (n_round == cap_round) {
                        cap_round = cap_round ? cap_round * 2 : 256;
                        round_conns = xrealloc(round_conns, cap_round * sizeof *round_conns);
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

/* One write (whole) of ``data`` to the log. */
static void append(const buf_t *data) {
    if (commit_delay_ms) usleep((useconds_t)commit_delay_ms * 1000);
    size_t done = 0;
    while (done < data->len) {
        ssize_t w = write(log_fd, data->p + done, data->len - done);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) die("write");
        done += (size_t)w;
    }
}

/* One write (whole) and one fdatasync of ``data`` to the log. */
static void append_durably(const buf_t *data) {
    append(data);
    if (fdatasync(log_fd) < 0) die("fdatasync");
}

/* fsync mode, once per epoll round: one write and one fdatasync, then the acks. */
static void commit_round(void) {
    if (round_data.len) {
        append_durably(&round_data);
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

/* fsync-thread: append ``c``'s waiting acks to ``b`` as one run. */
static void add_run(batch_t *b, conn_t *c, const unsigned char *acks, size_t len) {
    if (b->n_runs == b->cap_runs) {
        b->cap_runs = b->cap_runs ? b->cap_runs * 2 : 256;
        b->runs = xrealloc(b->runs, b->cap_runs * sizeof *b->runs);
    }
    b->runs[b->n_runs++] = (ack_run_t){ c, b->acks.len, len };
    put(&b->acks, acks, len);
}

static void swap_batches(batch_t *a, batch_t *b) { batch_t t = *a; *a = *b; *b = t; }
static void clear_batch(batch_t *b) { b->data.len = b->acks.len = b->n_runs = 0; }

/* fsync-thread, once per epoll round: hand the round's records and acks to the writer.
 * The connections stay allocated until their acks come back (``in_flight``). What waits
 * here is bounded by what the clients have in flight: they wait for their acks. */
static void hand_round(void) {
    if (!round_data.len && !n_round) return;
    pthread_mutex_lock(&lock);
    put(&queued.data, round_data.p, round_data.len);
    for (size_t i = 0; i < n_round; i++) {
        conn_t *c = round_conns[i];
        c->waiting = 0;
        if (c->fd >= 0 && c->acks.len) {
            add_run(&queued, c, c->acks.p, c->acks.len);
            c->in_flight++;
        }
        c->acks.len = 0;
    }
    pthread_cond_signal(&queued_cond);
    pthread_mutex_unlock(&lock);
    round_data.len = 0;
    n_round = 0;
}

/* fsync-thread: the writer. Takes everything queued since its last fdatasync, makes
 * it durable (one write, one fdatasync), then passes its acks to the epoll thread. */
static void *writer(void *unused) {
    (void)unused;
    batch_t work = { 0 };
    for (;;) {
        pthread_mutex_lock(&lock);
        while (!queued.data.len && !queued.n_runs) pthread_cond_wait(&queued_cond, &lock);
        swap_batches(&work, &queued);
        unsigned long long mine = taken++;
        pthread_mutex_lock(&write_mu);   /* (taken under lock: the log is in take order) */
        pthread_mutex_unlock(&lock);
        if (work.data.len && mode != MODE_DELAY) append(&work.data);
        pthread_mutex_unlock(&write_mu);
        /* the others may write and sync meanwhile: their fdatasyncs overlap this one */
        if (work.data.len && mode == MODE_DELAY) {
            struct timespec ts = { delay_us / 1000000, (delay_us % 1000000) * 1000 };
            while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {}
        } else if (work.data.len && fdatasync(log_fd) < 0) die("fdatasync");

        pthread_mutex_lock(&lock);
        while (released != mine)   /* acks in take order: an earlier batch's first */
            pthread_cond_wait(&released_cond, &lock);
        released++;
        pthread_cond_broadcast(&released_cond);
        if (!work.n_runs) {
            pthread_mutex_unlock(&lock);
        } else {
            for (size_t i = 0; i < work.n_runs; i++)
                add_run(&durable, work.runs[i].conn, work.acks.p + work.runs[i].off, work.runs[i].len);
            int wake = loop_asleep;   /* else it looks before it sleeps (ready_to_sleep) */
            loop_asleep = 0;
            pthread_mutex_unlock(&lock);
            uint64_t one = 1;
            while (wake && write(wake_fd, &one, sizeof one) < 0 && errno == EINTR) {}
        }
        clear_batch(&work);
    }
    return NULL;
}

/* fsync-thread: send the acks whose records are durable. */
static void send_durable_acks(void) {
    static batch_t ready;
    pthread_mutex_lock(&lock);
    swap_batches(&ready, &durable);
    pthread_mutex_unlock(&lock);
    for (size_t i = 0; i < ready.n_runs; i++) {
        conn_t *c = ready.runs[i].conn;
        c->in_flight--;
        if (c->fd >= 0) put(&c->out, ready.acks.p + ready.runs[i].off, ready.runs[i].len);
    }
    for (size_t i = 0; i < ready.n_runs; i++) {   /* one write per connection */
        conn_t *c = ready.runs[i].conn;
        if (c->fd >= 0 && c->out.len) flush_out(c);
    }
    clear_batch(&ready);
}

/* fsync-thread, before epoll_wait: 0 if acks became durable meanwhile (they were
 * sent: look again), else 1, and the writer will wake us through the eventfd. A busy
 * epoll thread so picks acks up without an eventfd write, read and wake-up. */
static int ready_to_sleep(void) {
    pthread_mutex_lock(&lock);
    int ready = durable.n_runs > 0;
    loop_asleep = !ready;
    pthread_mutex_unlock(&lock);
    if (ready) send_durable_acks();
    return !ready;
}

static void accept_all(int ls) {
    int fd, one = 1;
    while ((fd = accept4(ls, NULL, NULL, SOCK_NONBLOCK)) >= 0) {
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        conn_t *nc = calloc(1, sizeof *nc);
        if (!nc) die("calloc");
        nc->fd = fd;
        struct epoll_event cev = { .events = EPOLLIN, .data.ptr = nc };
        if (epoll_ctl(ep, EPOLL_CTL_ADD, fd, &cev) < 0) {   /* e.g. max_user_watches */
            perror("epoll_ctl ADD");
            close(fd);
            free(nc);
        }
    }
}

static int cmp_long(const void *a, const void *b) {
    long x = *(const long *)a, y = *(const long *)b;
    return (x > y) - (x < y);
}

/* delay: this disk's idle flush latency, in microseconds. The median of 200 commits
 * of 2 KiB (about a sync-100 commit's records), each a pwrite after the one before
 * and an fdatasync, in a file of zeros in ``dir`` written and synced first: a sync of
 * data alone, as the broker's preallocated segments make it. */
static long flush_latency_us(const char *dir) {
    enum { N = 200, COMMIT = 2048 };
    char path[4096];
    snprintf(path, sizeof path, "%s/floor-latency.tmp", dir);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) die(path);
    static char zeros[N * COMMIT], commit[COMMIT];
    long us[N];
    if (pwrite(fd, zeros, sizeof zeros, 0) != sizeof zeros || fsync(fd) < 0) die("pwrite");
    memset(commit, 'r', sizeof commit);
    for (int i = 0; i < N; i++) {
        struct timespec a, b;
        clock_gettime(CLOCK_MONOTONIC, &a);
        if (pwrite(fd, commit, COMMIT, (off_t)i * COMMIT) != COMMIT || fdatasync(fd) < 0)
            die("fdatasync");
        clock_gettime(CLOCK_MONOTONIC, &b);
        us[i] = (b.tv_sec - a.tv_sec) * 1000000L + (b.tv_nsec - a.tv_nsec) / 1000;
    }
    close(fd);
    unlink(path);
    qsort(us, N, sizeof us[0], cmp_long);
    return us[N / 2] > 0 ? us[N / 2] : 1;
}

int main(int argc, char **argv) {
    const char *mode_name = "ack", *dir = ".", *host = "127.0.0.1";
    int port = 6900, bad = argc % 2 == 0;   /* every option takes one value */
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--mode")) mode_name = argv[i + 1];
        else if (!strcmp(argv[i], "--port")) port = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--dir")) dir = argv[i + 1];
        else if (!strcmp(argv[i], "--host")) host = argv[i + 1];
        /* tests only: an ack sent before its commit would then find its record
         * missing from the file (tests/harness/test_floor_c.py) */
        else if (!strcmp(argv[i], "--commit-delay-ms")) commit_delay_ms = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--writers")) n_writers = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--delay-us")) delay_us = atol(argv[i + 1]);
        else bad = 1;
    }
    if (!strcmp(mode_name, "ack")) mode = MODE_ACK;
    else if (!strcmp(mode_name, "fsync")) mode = MODE_FSYNC;
    else if (!strcmp(mode_name, "fsync-thread")) mode = MODE_FSYNC_THREAD;
    else if (!strcmp(mode_name, "delay")) mode = MODE_DELAY;
    else bad = 1;
    if (n_writers < 1 || n_writers > 16 || delay_us < 0) bad = 1;
    if (bad) {
        fprintf(stderr, "usage: floor_c [--mode ack|fsync|fsync-thread|delay] [--port P] [--dir D]\n"
                        "               [--host H] [--commit-delay-ms MS] [--writers N] [--delay-us US]\n");
        return 2;
    }
    crc_init();
    srand((unsigned)now_ms());
    if (mode == MODE_DELAY && !delay_us) delay_us = flush_latency_us(dir);
    if (mode != MODE_ACK && mode != MODE_DELAY) {
        char path[4096];
        snprintf(path, sizeof path, "%s/floor.log", dir);
        log_fd = open(path, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (log_fd < 0) die(path);
    }
    int ls = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0), one = 1;
    if (ls < 0) die("socket");
    setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
    if (inet_pton(AF_INET, host, &a.sin_addr) != 1) { fprintf(stderr, "bad host %s\n", host); return 2; }
    if (bind(ls, (struct sockaddr *)&a, sizeof a) < 0 || listen(ls, 8192) < 0) die("listen");
    socklen_t alen = sizeof a;   /* --port 0: the kernel picked it; say which */
    if (getsockname(ls, (struct sockaddr *)&a, &alen) < 0) die("getsockname");
    port = ntohs(a.sin_port);
    ep = epoll_create1(0);
    if (ep < 0) die("epoll_create1");
    struct epoll_event ev = { .events = EPOLLIN, .data.ptr = NULL };
    if (epoll_ctl(ep, EPOLL_CTL_ADD, ls, &ev) < 0) die("epoll_ctl ADD listener");
    if (THREADED(mode)) {
        wake_fd = eventfd(0, EFD_NONBLOCK);
        if (wake_fd < 0) die("eventfd");
        struct epoll_event wev = { .events = EPOLLIN, .data.ptr = &wake_tag };
        if (epoll_ctl(ep, EPOLL_CTL_ADD, wake_fd, &wev) < 0) die("epoll_ctl ADD eventfd");
        for (int i = 0; i < n_writers; i++) {
            pthread_t t;
            int err = pthread_create(&t, NULL, writer, NULL);
            if (err) { errno = err; die("pthread_create"); }
        }
    }
    if (mode == MODE_DELAY) {   /* (stdout has the one listening line) */
        fprintf(stderr, "floor_c delay %ld us\n", delay_us);
        fflush(stderr);
    }
    printf("floor_c %s listening on %s:%d\n", mode_name, host, port);
    fflush(stdout);
    struct epoll_event evs[512];
    for (;;) {
        if (THREADED(mode)) while (!ready_to_sleep()) {}
        int n = epoll_wait(ep, evs, 512, -1);
        if (n < 0) {
            if (errno == EINTR) continue;
            die("epoll_wait");
        }
        for (int i = 0; i < n; i++) {
            conn_t *c = evs[i].data.ptr;
            if (c == NULL) { accept_all(ls); continue; }
            if ((void *)c == &wake_tag) {
                uint64_t count;
                while (read(wake_fd, &count, sizeof count) < 0 && errno == EINTR) {}
                send_durable_acks();
                continue;
            }
            if (c->fd < 0) continue;    /* dropped earlier in this round */
            if (evs[i].events & EPOLLOUT) { if (!flush_out(c)) continue; }
            if (evs[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) on_readable(c);
        }
        if (mode == MODE_FSYNC) commit_round();
        else if (THREADED(mode)) hand_round();
        free_dead();
    }
}
