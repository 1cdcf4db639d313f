/* SPDX-License-Identifier: Apache-2.0
 *
 * loomrun - starts N local ranks of a program and supervises them. Each rank
 * gets the LOOM_* variables that loomCommInitFromEnv reads (rank, world size,
 * local rank and size, rendezvous address, job secret, optional host id), is
 * optionally pinned to one CPU and optionally has its output prefixed by its
 * rank. The first rank to fail takes the job down and lends loomrun its exit
 * status. It deliberately does not link libloom, nor start anything on other
 * machines: multi-host jobs belong to Slurm, torchrun or mpirun, whose
 * variables the library also reads. Run by users, tests and benchmarks.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_RANKS     4096
#define KILL_GRACE_MS 2000
/* A longer line is passed on in pieces, each with its own prefix. */
#define MAX_LINE 65536

static const char usage_text[] =
    "usage: loomrun -n N [options] [--] PROGRAM [ARGS...]\n"
    "Starts N local ranks of PROGRAM and waits for them. Each rank gets LOOM_RANK,\n"
    "LOOM_WORLD_SIZE, LOOM_LOCAL_RANK, LOOM_LOCAL_SIZE, LOOM_COMM_ID (127.0.0.1 and a\n"
    "free port) and LOOM_SECRET (a fresh random job secret) for loomCommInitFromEnv.\n"
    "\n"
    "  -n N               number of ranks, 1 to 4096\n"
    "  -l                 prefix every output line with \"[RANK] \"\n"
    "  --host-groups G    model G hosts: split the ranks into G contiguous groups, set\n"
    "                     LOOM_HOST_ID=host<g>, local rank and size within the group\n"
    "  --host-map M       how ranks go to the G hosts: block (contiguous groups, the\n"
    "                     default) or cyclic (rank r on host r mod G, as a round-robin\n"
    "                     launcher places them)\n"
    "  --bind core|none   pin rank r to the (r mod C)-th of the C CPUs loomrun may use\n"
    "                     (core, the default), or leave the ranks unpinned (none)\n"
    "  --timeout SEC      stop all ranks after SEC seconds and exit 124\n"
    "  --keep-going       a rank that fails does not stop the others (for jobs whose\n"
    "                     survivors go on without it, as loom-train --elastic does);\n"
    "                     loomrun waits for every rank, then exits with the status of\n"
    "                     the first one that failed (0 if none did)\n"
    "  -v                 print what each rank is given (rank, host id, cpu)\n"
    "  -h, --help         print this text\n"
    "\n"
    "SIGINT, SIGTERM and SIGHUP are passed on to the ranks. When a rank fails, the\n"
    "others get SIGTERM, then SIGKILL 2 s later (unless --keep-going), and loomrun\n"
    "exits with the failed rank's status (128+S if signal S killed it). Ranks die\n"
    "when loomrun dies.\n";

struct stream {
    int fd;  /* our end of a rank's stdout or stderr pipe; -1 once closed */
    int out; /* 1 or 2: where its lines go */
    int rank;
    char *pending; /* a line begun without its newline yet */
    size_t len;
    bool cut; /* the last line written was cut at MAX_LINE, its newline still to come */
};

enum stop_reason { RUNNING, STOP_FAILED, STOP_TIMEOUT, STOP_SIGNAL };

static struct {
    int nranks, groups, ncpus, *cpus;
    bool label, bind, verbose, cyclic, keep_going;
    double timeout_s;
    char **prog;
} opt = {.bind = true};

static struct {
    pid_t *pids; /* 0 once reaped */
    int alive, nstreams;
    int exec_err[2]; /* a rank whose exec failed writes its errno here */
    struct stream *streams;
    enum stop_reason stop;
    int exit_code, stop_signal;
    bool failed;     /* --keep-going: a rank failed, and exit_code is its status */
    int64_t kill_at; /* when ranks still alive get SIGKILL; -1: not due */
} job = {.kill_at = -1};

static _Noreturn void die_usage(const char *hint, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("loomrun: ", stderr);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\nHINT: %s\n", hint);
    exit(2);
}

static _Noreturn void die_sys(const char *what)
{
    fprintf(stderr, "loomrun: %s: %s\n", what, strerror(errno));
    exit(1);
}

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void setenv_int(const char *name, int v)
{
    char s[16];
    snprintf(s, sizeof(s), "%d", v);
    setenv(name, s, 1);
}

static int parse_int(const char *s, const char *name, long lo, long hi)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        die_usage("see loomrun --help", "%s wants a whole number from %ld to %ld, not '%s'", name,
                  lo, hi, s);
    return (int)v;
}

static void parse_args(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"help", no_argument, NULL, 'h'},
        {"host-groups", required_argument, NULL, 'g'},
        {"host-map", required_argument, NULL, 'm'},
        {"bind", required_argument, NULL, 'b'},
        {"timeout", required_argument, NULL, 't'},
        {"keep-going", no_argument, NULL, 'k'},
        {NULL, 0, NULL, 0},
    };
    const char *hint = "see loomrun --help", *example = "loomrun -n 4 ./program args...";
    char *end;
    int c;

    opterr = 0;
    /* '+' ends the options at the program name: the rest are the program's. */
    while ((c = getopt_long(argc, argv, "+:n:lvh", longopts, NULL)) != -1) {
        switch (c) {
        case 'n':
            opt.nranks = parse_int(optarg, "-n", 1, MAX_RANKS);
            break;
        case 'l':
            opt.label = true;
            break;
        case 'v':
            opt.verbose = true;
            break;
        case 'g':
            opt.groups = parse_int(optarg, "--host-groups", 1, MAX_RANKS);
            break;
        case 'm':
            if (strcmp(optarg, "block") && strcmp(optarg, "cyclic"))
                die_usage(hint, "--host-map wants block or cyclic, not '%s'", optarg);
            opt.cyclic = !strcmp(optarg, "cyclic");
            break;
        case 'b':
            if (strcmp(optarg, "core") && strcmp(optarg, "none"))
                die_usage(hint, "--bind wants core or none, not '%s'", optarg);
            opt.bind = !strcmp(optarg, "core");
            break;
        case 't':
            opt.timeout_s = strtod(optarg, &end);
            if (end == optarg || *end || !(opt.timeout_s > 0 && opt.timeout_s < 1e9))
                die_usage(hint, "--timeout wants a positive number of seconds, not '%s'", optarg);
            break;
        case 'k':
            opt.keep_going = true;
            break;
        case 'h':
            fputs(usage_text, stdout);
            exit(0);
        case ':':
            die_usage(hint, "%s needs a value", argv[optind - 1]);
        default:
            if (optopt)
                die_usage(hint, "unknown option '-%c'", optopt);
            die_usage(hint, "unknown option '%s'", argv[optind - 1]);
        }
    }
    if (!opt.nranks)
        die_usage(example, "the number of ranks (-n N) is missing");
    if (optind >= argc)
        die_usage(example, "no program to run");
    if (opt.groups > opt.nranks)
        die_usage("use at most one group per rank", "--host-groups %d is more than the %d ranks",
                  opt.groups, opt.nranks);
    opt.prog = argv + optind;
}

/* The CPUs loomrun itself may run on, in order; ranks are dealt onto them. */
static void read_cpus(void)
{
    for (int n = 1024;; n *= 2) {
        cpu_set_t *set = CPU_ALLOC(n);
        size_t size = CPU_ALLOC_SIZE(n);
        if (!set || !(opt.cpus = malloc(sizeof(int) * (size_t)n)))
            die_sys("malloc");
        if (sched_getaffinity(0, size, set) == 0) {
            for (int i = 0; i < n; i++)
                if (CPU_ISSET_S(i, size, set))
                    opt.cpus[opt.ncpus++] = i;
            CPU_FREE(set);
            return;
        }
        if (errno != EINVAL || n > (1 << 20))
            die_sys("sched_getaffinity");
        CPU_FREE(set);
        free(opt.cpus);
    }
}

/* The port is only probed, not held: rank 0's library binds it moments later,
 * and reports it if another process took it in between. */
static int free_port(void)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t alen = sizeof(a);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof(a)) ||
        getsockname(fd, (struct sockaddr *)&a, &alen))
        die_sys("cannot find a free port on 127.0.0.1");
    close(fd);
    return ntohs(a.sin_port);
}

static void set_common_env(void)
{
    unsigned char b[16];
    char v[40];
    if (getrandom(b, sizeof(b), 0) != (ssize_t)sizeof(b))
        die_sys("getrandom");
    for (int i = 0; i < 16; i++)
        snprintf(v + 2 * i, 3, "%02x", b[i]);
    setenv("LOOM_SECRET", v, 1);
    snprintf(v, sizeof(v), "127.0.0.1:%d", free_port());
    setenv("LOOM_COMM_ID", v, 1);
    if (opt.verbose)
        fprintf(stderr, "loomrun: %d ranks of %s, LOOM_COMM_ID=%s\n", opt.nranks, opt.prog[0], v);
    setenv_int("LOOM_WORLD_SIZE", opt.nranks);
}

/* Writes all of iov. A failed write drops the rest of the line, so that a
 * broken log file does not stop the supervision of the ranks. */
static void write_iov(int fd, struct iovec *iov, int n)
{
    while (n > 0) {
        ssize_t w = writev(fd, iov, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0)
            return;
        for (; n > 0 && (size_t)w >= iov->iov_len; iov++, n--)
            w -= (ssize_t)iov->iov_len;
        if (n > 0) {
            iov->iov_base = (char *)iov->iov_base + w;
            iov->iov_len -= (size_t)w;
        }
    }
}

/* One writev per line, so lines of different ranks do not mix. */
static void emit_line(struct stream *s, const char *text, size_t n, bool add_newline)
{
    char prefix[16];
    int plen = snprintf(prefix, sizeof(prefix), "[%d] ", s->rank);
    struct iovec iov[4] = {{prefix, (size_t)plen},
                           {s->pending, s->len},
                           {(void *)text, n},
                           {"\n", add_newline ? 1 : 0}};
    write_iov(s->out, iov, 4);
    s->len = 0;
}

/* Reads once (or until the pipe is empty, with all); false at end of file. */
static bool read_stream(struct stream *s, bool all)
{
    static char buf[65536];
    do {
        ssize_t r = read(s->fd, buf, sizeof(buf));
        if (r < 0 && (errno == EINTR || errno == EAGAIN))
            return true;
        if (r <= 0)
            return false;
        char *p = buf, *end = buf + r, *nl;
        for (; (nl = memchr(p, '\n', (size_t)(end - p))); p = nl + 1) {
            if (!s->cut || nl > p)
                emit_line(s, p, (size_t)(nl + 1 - p), false);
            s->cut = false;
        }
        size_t rest = (size_t)(end - p);
        if (rest)
            s->cut = s->len + rest > MAX_LINE;
        if (s->cut) {
            emit_line(s, p, rest, true);
        } else if (rest) {
            if (!s->pending && !(s->pending = malloc(MAX_LINE)))
                die_sys("malloc");
            memcpy(s->pending + s->len, p, rest);
            s->len += rest;
        }
    } while (all);
    return true;
}

static void close_stream(struct stream *s)
{
    if (s->len)
        emit_line(s, "", 0, true);
    free(s->pending);
    s->pending = NULL;
    close(s->fd);
    s->fd = -1;
}

static void signal_ranks(int sig)
{
    for (int r = 0; r < opt.nranks; r++)
        if (job.pids[r] > 0)
            kill(job.pids[r], sig);
}

/* Stops the job for the reason just printed, keeping that reason's status. */
static void stop_job(enum stop_reason why, int code)
{
    if (job.alive > 0)
        fprintf(stderr, "loomrun: killing the remaining %d rank%s\n", job.alive,
                job.alive == 1 ? "" : "s");
    signal_ranks(SIGTERM);
    job.stop = why;
    job.exit_code = code;
    job.kill_at = now_ms() + KILL_GRACE_MS;
}

/* A rank failed with status code: the job stops, or with --keep-going goes on, remembering
 * the first failure's status for loomrun's own. */
static void rank_failed(int code)
{
    if (!opt.keep_going) {
        stop_job(STOP_FAILED, code);
    } else if (!job.failed) {
        job.failed = true;
        job.exit_code = code;
    }
}

/* Runs in the child between fork and exec. */
static void exec_rank(int r, int local_rank, int local_size, const char *host_id, pid_t parent,
                      const sigset_t *mask, const int *out_fds)
{
    /* PR_SET_PDEATHSIG covers loomrun dying even by SIGKILL; the getppid()
     * check covers it having died before the request was made. */
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) || getppid() != parent)
        _exit(127);
    sigprocmask(SIG_SETMASK, mask, NULL);
    if (opt.label && (dup2(out_fds[0], 1) < 0 || dup2(out_fds[1], 2) < 0))
        _exit(127);
    if (opt.bind) {
        int cpu = opt.cpus[r % opt.ncpus];
        cpu_set_t *set = CPU_ALLOC(cpu + 1);
        size_t size = CPU_ALLOC_SIZE(cpu + 1);
        if (set) {
            CPU_ZERO_S(size, set);
            CPU_SET_S(cpu, size, set);
            sched_setaffinity(0, size, set);
        }
    }
    setenv_int("LOOM_RANK", r);
    setenv_int("LOOM_LOCAL_RANK", local_rank);
    setenv_int("LOOM_LOCAL_SIZE", local_size);
    if (host_id)
        setenv("LOOM_HOST_ID", host_id, 1);
    execvp(opt.prog[0], opt.prog);
    /* loomrun says it once, rather than every rank racing to say it. */
    int err = errno;
    if (write(job.exec_err[1], &err, sizeof(err)) < 0)
        dprintf(2, "loomrun: cannot run %s: %s\n", opt.prog[0], strerror(err));
    _exit(127);
}

static void launch(const sigset_t *child_mask)
{
    int ngroups = opt.groups ? opt.groups : 1;
    int base = opt.nranks / ngroups, group = 0, group_start = 0;
    int gsize = base + (opt.nranks % ngroups > 0);
    pid_t self = getpid();
    const char *inherited_host = getenv("LOOM_HOST_ID");
    char host[24];

    for (int r = 0; r < opt.nranks; r++) {
        int lrank;
        if (opt.cyclic) { /* host r mod G, local rank r / G */
            group = r % ngroups;
            lrank = r / ngroups;
            gsize = base + (group < opt.nranks % ngroups);
        } else {
            if (r - group_start == gsize) {
                group++;
                group_start = r;
                gsize = base + (group < opt.nranks % ngroups);
            }
            lrank = r - group_start;
        }
        int fds[2][2] = {{-1, -1}, {-1, -1}};
        for (int k = 0; opt.label && k < 2; k++) {
            if (pipe2(fds[k], O_CLOEXEC))
                die_sys("pipe");
            /* Only our end is non-blocking: the rank's own stdout blocks. */
            fcntl(fds[k][0], F_SETFL, O_NONBLOCK);
            job.streams[job.nstreams++] = (struct stream){.fd = fds[k][0], .out = k + 1, .rank = r};
        }
        snprintf(host, sizeof(host), "host%d", group);
        if (opt.verbose) {
            char cpu[24] = "any cpu";
            if (opt.bind)
                snprintf(cpu, sizeof(cpu), "cpu %d", opt.cpus[r % opt.ncpus]);
            const char *shown = opt.groups ? host : inherited_host ? inherited_host : "(not set)";
            fprintf(stderr, "loomrun: rank %d: local rank %d of %d, host id %s, %s\n", r, lrank,
                    gsize, shown, cpu);
        }
        pid_t pid = fork();
        if (pid == 0)
            exec_rank(r, lrank, gsize, opt.groups ? host : NULL, self, child_mask,
                      (int[]){fds[0][1], fds[1][1]});
        if (opt.label) {
            close(fds[0][1]);
            close(fds[1][1]);
        }
        if (pid < 0) {
            fprintf(stderr, "loomrun: cannot start rank %d: %s\n", r, strerror(errno));
            stop_job(STOP_FAILED, 1);
            return;
        }
        job.pids[r] = pid;
        job.alive++;
    }
}

static void reap(void)
{
    int status, r;
    pid_t pid;
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
        for (r = 0; r < opt.nranks && job.pids[r] != pid; r++)
            ;
        if (r == opt.nranks)
            continue;
        job.pids[r] = 0;
        job.alive--;
        if (job.stop != RUNNING || (WIFEXITED(status) && WEXITSTATUS(status) == 0))
            continue;
        int err;
        if (WIFEXITED(status) && WEXITSTATUS(status) == 127 &&
            read(job.exec_err[0], &err, sizeof(err)) == sizeof(err)) {
            fprintf(stderr, "loomrun: cannot run %s: %s\n", opt.prog[0], strerror(err));
            fprintf(stderr,
                    "HINT: PROGRAM must be an executable file, looked up in PATH unless "
                    "its name has a '/' (./%s for one here)\n",
                    opt.prog[0]);
        }
        if (WIFEXITED(status)) {
            fprintf(stderr, "loomrun: rank %d (pid %d) exited with status %d\n", r, (int)pid,
                    WEXITSTATUS(status));
            rank_failed(WEXITSTATUS(status));
        } else {
            int sig = WTERMSIG(status);
            const char *abbrev = sigabbrev_np(sig);
            fprintf(stderr, "loomrun: rank %d (pid %d) killed by signal %s%s%s\n", r, (int)pid,
                    abbrev ? "SIG" : "", abbrev ? abbrev : strsignal(sig),
                    WCOREDUMP(status) ? " (core dumped)" : "");
            rank_failed(128 + sig);
        }
    }
}

static void on_signals(int sfd)
{
    struct signalfd_siginfo si;
    while (read(sfd, &si, sizeof(si)) == sizeof(si)) {
        int sig = (int)si.ssi_signo;
        if (sig == SIGCHLD)
            continue;
        /* A signal from the terminal has reached every rank already, as they
         * share loomrun's process group; only kill()ed ones are passed on. */
        if (si.ssi_code != SI_KERNEL)
            signal_ranks(sig);
        if (job.stop == RUNNING) {
            job.stop = STOP_SIGNAL;
            job.stop_signal = sig;
            job.kill_at = now_ms() + KILL_GRACE_MS;
        } else {
            /* A second signal means the user is done waiting. */
            signal_ranks(SIGKILL);
        }
    }
}

/* Ranks as "0-3,7,9-10". */
static void print_running(void)
{
    for (int r = 0, first = 1; r < opt.nranks; r++) {
        if (!job.pids[r])
            continue;
        int last = r;
        while (last + 1 < opt.nranks && job.pids[last + 1])
            last++;
        fprintf(stderr, first ? " %d" : ",%d", r);
        if (last > r)
            fprintf(stderr, "-%d", last);
        r = last;
        first = 0;
    }
    fputc('\n', stderr);
}

static void supervise(int sfd, int64_t timeout_at)
{
    struct pollfd *pfds = calloc((size_t)job.nstreams + 1, sizeof(*pfds));
    if (!pfds)
        die_sys("calloc");
    while (job.alive > 0) {
        int64_t now = now_ms(), wake = job.kill_at;
        if (job.stop == RUNNING && timeout_at >= 0)
            wake = timeout_at;
        pfds[0] = (struct pollfd){.fd = sfd, .events = POLLIN};
        for (int i = 0; i < job.nstreams; i++)
            pfds[i + 1] = (struct pollfd){.fd = job.streams[i].fd, .events = POLLIN};
        int wait_ms = wake < 0 ? -1 : wake > now ? (int)(wake - now) : 0;
        if (poll(pfds, (nfds_t)job.nstreams + 1, wait_ms) < 0 && errno != EINTR)
            die_sys("poll");

        for (int i = 0; i < job.nstreams; i++)
            if (pfds[i + 1].revents && !read_stream(&job.streams[i], false))
                close_stream(&job.streams[i]);
        on_signals(sfd);
        reap();

        now = now_ms();
        if (job.stop == RUNNING && timeout_at >= 0 && now >= timeout_at && job.alive > 0) {
            fprintf(stderr, "loomrun: timed out after %g s; ranks still running:", opt.timeout_s);
            print_running();
            stop_job(STOP_TIMEOUT, 124);
        } else if (job.kill_at >= 0 && now >= job.kill_at) {
            signal_ranks(SIGKILL);
            job.kill_at = -1;
        }
    }
    free(pfds);
}

int main(int argc, char **argv)
{
    parse_args(argc, argv);
    int need_fds = opt.nranks * 2 + 16;
    struct rlimit rl;
    if (opt.label && !getrlimit(RLIMIT_NOFILE, &rl) && rl.rlim_cur < (rlim_t)need_fds) {
        rl.rlim_cur = rl.rlim_max;
        if (rl.rlim_cur < (rlim_t)need_fds || setrlimit(RLIMIT_NOFILE, &rl))
            die_usage("raise the limit with ulimit -n, or drop -l",
                      "-l with %d ranks needs %d open files, more than allowed", opt.nranks,
                      need_fds);
    }
    if (opt.bind)
        read_cpus();
    set_common_env();

    /* Signals come through a signalfd, so one poll() waits for rank exits,
     * our own signals, rank output and deadlines alike. */
    sigset_t mask, oldmask;
    sigemptyset(&mask);
    sigaddset(&mask, SIGCHLD);
    sigaddset(&mask, SIGINT);
    sigaddset(&mask, SIGTERM);
    sigaddset(&mask, SIGHUP);
    sigprocmask(SIG_BLOCK, &mask, &oldmask);
    int sfd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
    job.pids = calloc((size_t)opt.nranks, sizeof(*job.pids));
    job.streams = calloc((size_t)opt.nranks * 2, sizeof(*job.streams));
    if (sfd < 0 || !job.pids || !job.streams || pipe2(job.exec_err, O_CLOEXEC | O_NONBLOCK))
        die_sys("setup");
    fflush(NULL);

    int64_t timeout_at = opt.timeout_s > 0 ? now_ms() + (int64_t)(opt.timeout_s * 1000) : -1;
    launch(&oldmask);
    close(job.exec_err[1]);
    supervise(sfd, timeout_at);

    /* What the ranks wrote is in the pipes now; output of their own children
     * that outlive them is not waited for. */
    for (int i = 0; i < job.nstreams; i++) {
        if (job.streams[i].fd >= 0) {
            read_stream(&job.streams[i], true);
            close_stream(&job.streams[i]);
        }
    }
    if (job.stop == STOP_SIGNAL) {
        /* Dying by the same signal lets a calling shell see the interrupt. */
        sigset_t one;
        sigemptyset(&one);
        sigaddset(&one, job.stop_signal);
        signal(job.stop_signal, SIG_DFL);
        sigprocmask(SIG_UNBLOCK, &one, NULL);
        raise(job.stop_signal);
        return 128 + job.stop_signal;
    }
    return job.exit_code;
}
