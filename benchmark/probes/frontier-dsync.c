// Probe (not part of the build): can a 16-byte "frontier" write avoid waiting for another thread's dirty pages by using
// pwritev2(RWF_DSYNC) (which syncs only its own range) instead of pwrite + fdatasync?
// Usage: frontier-dsync FILE   (creates FILE, 256 MiB, written once in full)
// A background thread keeps copying 50 x 64 KiB and fdatasync-ing (as the stocker's formats do); the main thread copies
// 400 pages, fdatasyncs (the version's fence), then writes the 16-byte frontier both ways in turn; 300 rounds each.
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

static double now_ms(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e3 + t.tv_nsec / 1e6; }
static int cmp(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return x < y ? -1 : x > y; }

static int fd;
static volatile int stop;

static void *background(void *unused)
{
    static char chunk[65536];
    long offset = 128L << 20;
    while (!stop)
    {
        for (int i = 0; i < 50; i++) { pwrite(fd, chunk, sizeof chunk, offset); offset += sizeof chunk; if (offset > (250L << 20)) offset = 128L << 20; }
        fdatasync(fd);
        usleep(5000);
    }
    return unused;
}

int main(int argc, char **argv)
{
    if (argc != 2) { fprintf(stderr, "usage: %s FILE\n", argv[0]); return 2; }
    fd = open(argv[1], O_RDWR | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) { perror("open"); return 1; }
    static char buf[4096 * 400];
    memset(buf, 2, sizeof buf);
    for (long offset = 0; offset < (256L << 20); offset += sizeof buf) pwrite(fd, buf, sizeof buf, offset);
    fsync(fd);
    for (int mode = 0; mode < 2; mode++)
    {
        stop = 0;
        pthread_t thread;
        pthread_create(&thread, NULL, background, NULL);
        double frontier[300];
        long page = 0;
        for (int i = 0; i < 300; i++)
        {
            pwrite(fd, buf, sizeof buf, (4096 + (page % 20000)) * 4096L);
            page += 400;
            fdatasync(fd);
            double start = now_ms();
            if (mode == 0) { pwrite(fd, buf, 16, 64); fdatasync(fd); }
            else { struct iovec v = { buf, 16 }; if (pwritev2(fd, &v, 1, 64, RWF_DSYNC) != 16) perror("pwritev2"); }
            frontier[i] = now_ms() - start;
            usleep(8000);
        }
        stop = 1;
        pthread_join(thread, NULL);
        qsort(frontier, 300, sizeof frontier[0], cmp);
        printf("frontier by %-24s p50 %.2f p90 %.2f p99 %.2f max %.2f ms\n", mode ? "pwritev2(RWF_DSYNC):" : "pwrite + fdatasync:", frontier[150], frontier[270], frontier[297], frontier[299]);
    }
    close(fd);
    unlink(argv[1]);
    return 0;
}
