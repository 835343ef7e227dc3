/* MPI over UCX over softhca: a ping-pong (latency and bandwidth, every byte checked),
 * one-sided puts and gets (checked), an allreduce whose result is checked and a ring,
 * between the ranks of one job. Prints one line per part and "mpi_check: OK" from
 * rank 0 when everything matched; exits non-zero (MPI_Abort) on the first mismatch. */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int rank, size;

static void fail(const char *what, long at, long got, long want)
{
    fprintf(stderr, "mpi_check: rank %d: %s mismatch at %ld: got %ld, want %ld\n", rank,
            what, at, got, want);
    MPI_Abort(MPI_COMM_WORLD, 2);
}

/* The byte at offset i of the message of iteration it sent by rank r. */
static unsigned char pattern(long i, int it, int r)
{
    return (unsigned char)(i * 31 + it * 7 + r * 101 + (i >> 12));
}

static void pingpong(long len, int iters)
{
    unsigned char *buf = malloc(len);
    int peer = rank ^ 1;
    double t0 = 0;
    if (buf == NULL) {
        MPI_Abort(MPI_COMM_WORLD, 3);
    }
    if (peer >= size) {
        free(buf);
        return;
    }
    MPI_Barrier(MPI_COMM_WORLD);
    for (int it = 0; it < iters; it++) {
        if (it == 1) {
            t0 = MPI_Wtime(); /* the first round trip sets the connection up */
        }
        if (rank % 2 == 0) {
            for (long i = 0; i < len; i++) {
                buf[i] = pattern(i, it, rank);
            }
            MPI_Send(buf, (int)len, MPI_BYTE, peer, it, MPI_COMM_WORLD);
            MPI_Recv(buf, (int)len, MPI_BYTE, peer, it, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            for (long i = 0; i < len; i++) {
                if (buf[i] != pattern(i, it, peer)) {
                    fail("ping-pong", i, buf[i], pattern(i, it, peer));
                }
            }
        } else {
            MPI_Recv(buf, (int)len, MPI_BYTE, peer, it, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            for (long i = 0; i < len; i++) {
                if (buf[i] != pattern(i, it, peer)) {
                    fail("ping-pong", i, buf[i], pattern(i, it, peer));
                }
                buf[i] = pattern(i, it, rank);
            }
            MPI_Send(buf, (int)len, MPI_BYTE, peer, it, MPI_COMM_WORLD);
        }
    }
    double dt = MPI_Wtime() - t0;
    if (rank == 0) {
        double half_rtt_us = dt / (iters - 1) / 2 * 1e6;
        printf("ping-pong %8ld B: %d round trips checked, half round trip %.1f us, %.1f MB/s\n",
               len, iters, half_rtt_us, (double)len / half_rtt_us);
    }
    free(buf);
}

static void allreduce(long n)
{
    int64_t *in = malloc(n * sizeof(*in)), *out = malloc(n * sizeof(*out));
    if (in == NULL || out == NULL) {
        MPI_Abort(MPI_COMM_WORLD, 3);
    }
    for (long i = 0; i < n; i++) {
        in[i] = (int64_t)(rank + 1) * (i + 1);
    }
    MPI_Allreduce(in, out, (int)n, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
    /* sum over ranks of (r + 1) * (i + 1) */
    int64_t ranks = (int64_t)size * (size + 1) / 2;
    for (long i = 0; i < n; i++) {
        if (out[i] != ranks * (i + 1)) {
            fail("allreduce", i, (long)out[i], (long)(ranks * (i + 1)));
        }
    }
    if (rank == 0) {
        printf("allreduce %ld int64 sums checked\n", n);
    }
    free(in);
    free(out);
}

/* A token goes round the ring `laps` times; each rank adds its rank + 1. */
static void ring(int laps)
{
    int64_t token = 0;
    int next = (rank + 1) % size, prev = (rank + size - 1) % size;
    for (int lap = 0; lap < laps; lap++) {
        if (rank == 0) {
            token += 1;
            MPI_Send(&token, 1, MPI_INT64_T, next, lap, MPI_COMM_WORLD);
            MPI_Recv(&token, 1, MPI_INT64_T, prev, lap, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        } else {
            MPI_Recv(&token, 1, MPI_INT64_T, prev, lap, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            token += rank + 1;
            MPI_Send(&token, 1, MPI_INT64_T, next, lap, MPI_COMM_WORLD);
        }
    }
    if (rank == 0) {
        int64_t want = (int64_t)laps * size * (size + 1) / 2;
        if (token != want) {
            fail("ring", laps, (long)token, (long)want);
        }
        printf("ring %d laps over %d ranks: token %ld checked\n", laps, size, (long)token);
    }
}

/* One-sided: each rank puts `len` bytes into the next rank's window and gets `len`
 * bytes of the previous rank's window back (osc ucx: RDMA WRITE and READ over UCX). */
static void put_get(long len)
{
    unsigned char *win_buf, *local = malloc(len);
    MPI_Win win;
    int next = (rank + 1) % size, prev = (rank + size - 1) % size;
    if (local == NULL) {
        MPI_Abort(MPI_COMM_WORLD, 3);
    }
    MPI_Win_allocate(len, 1, MPI_INFO_NULL, MPI_COMM_WORLD, &win_buf, &win);
    memset(win_buf, 0, len);
    for (long i = 0; i < len; i++) {
        local[i] = pattern(i, 1, rank);
    }
    MPI_Win_fence(0, win);
    MPI_Put(local, (int)len, MPI_BYTE, next, 0, (int)len, MPI_BYTE, win);
    MPI_Win_fence(0, win);
    for (long i = 0; i < len; i++) {
        if (win_buf[i] != pattern(i, 1, prev)) {
            fail("put", i, win_buf[i], pattern(i, 1, prev));
        }
        win_buf[i] = pattern(i, 2, rank);
    }
    MPI_Win_fence(0, win);
    MPI_Get(local, (int)len, MPI_BYTE, prev, 0, (int)len, MPI_BYTE, win);
    MPI_Win_fence(0, win);
    for (long i = 0; i < len; i++) {
        if (local[i] != pattern(i, 2, prev)) {
            fail("get", i, local[i], pattern(i, 2, prev));
        }
    }
    MPI_Win_free(&win);
    free(local);
    if (rank == 0) {
        printf("put/get %8ld B: checked\n", len);
    }
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    const long sizes[] = {8, 4096, 65536, 1 << 20, 4 << 20};
    for (unsigned k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
        pingpong(sizes[k], sizes[k] >= (1 << 20) ? 10 : 100);
    }
    put_get(8);
    put_get(1 << 20);
    allreduce(1 << 16);
    ring(100);
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) {
        printf("mpi_check: OK\n");
    }
    MPI_Finalize();
    return 0;
}
