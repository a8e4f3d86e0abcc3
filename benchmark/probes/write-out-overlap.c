// Probe (not part of the build): does starting the write-out of each copied chunk (sync_file_range with
// SYNC_FILE_RANGE_WRITE) shorten "copy in chunks with CPU work between them, then fdatasync"?
// Usage: write-out-overlap FILE   (creates FILE, 256 MiB, written once in full so that no extent is unwritten)
// Prints, for 600 pages in 1, 4 and 8 chunks with 4 ms of CPU work spread between the chunks, the time from the first
// copy to the end of fdatasync (100 rounds, 5 ms apart), without and with the write-out started per chunk.
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double now_ms(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e3 + t.tv_nsec / 1e6; }
static int cmp(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return x < y ? -1 : x > y; }
static void spin(double ms) { double end = now_ms() + ms; while (now_ms() < end) { } }

static char buf[4096 * 600];

int main(int argc, char **argv)
{
    if (argc != 2) { fprintf(stderr, "usage: %s FILE\n", argv[0]); return 2; }
    int fd = open(argv[1], O_RDWR | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) { perror("open"); return 1; }
    const long pagesInFile = (256L << 20) / 4096;
    memset(buf, 1, sizeof buf);
    for (long p = 0; p < pagesInFile; p += 600) pwrite(fd, buf, 4096L * (p + 600 <= pagesInFile ? 600 : pagesInFile - p), p * 4096);
    fsync(fd);
    const int pages = 600, rounds = 100, chunkCounts[] = { 1, 4, 8 };
    for (int mode = 0; mode < 2; mode++)
        for (int k = 0; k < 3; k++)
        {
            int chunks = chunkCounts[k], per = pages / chunks;
            double t[100];
            long base = 0;
            for (int i = 0; i < rounds; i++)
            {
                double start = now_ms();
                for (int c = 0; c < chunks; c++)
                {
                    spin(4.0 / chunks);
                    long offset = (base + (long)c * per) * 4096;
                    pwrite(fd, buf, 4096L * per, offset);
                    if (mode) sync_file_range(fd, offset, 4096L * per, SYNC_FILE_RANGE_WRITE);
                }
                fdatasync(fd);
                t[i] = now_ms() - start;
                base = (base + pages) % (pagesInFile - pages);
                usleep(5000);
            }
            qsort(t, rounds, sizeof t[0], cmp);
            printf("write-out per chunk %-3s chunks %d: p50 %.2f p90 %.2f p99 %.2f ms\n", mode ? "yes" : "no", chunks, t[50], t[90], t[98]);
        }
    close(fd);
    unlink(argv[1]);
    return 0;
}
