/* The MPI ping-pong of `softhca bench --middleware` (built with mpicc at run time).
 *
 * mpi_pingpong SECONDS SIZE...: for each size, rank 0 sends SIZE bytes to rank 1, which
 * sends them back. Twenty round trips warm up (and set the connection up); then round
 * trips are timed for SECONDS (rank 0 marks the last one with tag 1, so a loaded machine
 * cannot stretch the run). Rank 0 prints one line per size: "pingpong <bytes> <round
 * trips> <mean half round trip us> <median half round trip us> <MB/s>", MB/s being the
 * bytes of one direction per mean half round trip (10^6 bytes per second); the median,
 * like ucx_perftest's latency, leaves out the round trips a descheduled rank stretched. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Round trips whose times rank 0 keeps for the median. */
#define KEPT (1 << 20)
static double kept[KEPT];

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Round trips until rank 0 has spent `secs` (at least `min` of them); returns how many,
 * and their time on rank 0 in `*took`. */
static long round_trips(char *buf, long len, double secs, long min, int rank, double *took)
{
    int peer = 1 - rank, last = 0;
    long n = 0;
    double t0;
    MPI_Status st;

    MPI_Barrier(MPI_COMM_WORLD);
    t0 = MPI_Wtime();
    while (!last) {
        if (rank == 0) {
            double t = MPI_Wtime();
            last = n + 1 >= min && t - t0 >= secs;
            MPI_Send(buf, (int)len, MPI_BYTE, peer, last, MPI_COMM_WORLD);
            MPI_Recv(buf, (int)len, MPI_BYTE, peer, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            if (n < KEPT) {
                kept[n] = MPI_Wtime() - t;
            }
        } else {
            MPI_Recv(buf, (int)len, MPI_BYTE, peer, MPI_ANY_TAG, MPI_COMM_WORLD, &st);
            last = st.MPI_TAG == 1;
            MPI_Send(buf, (int)len, MPI_BYTE, peer, 0, MPI_COMM_WORLD);
        }
        n++;
    }
    *took = MPI_Wtime() - t0;
    return n;
}

int main(int argc, char **argv)
{
    int rank, ranks;

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &ranks);
    if (ranks != 2 || argc < 3) {
        if (rank == 0) {
            fprintf(stderr, "usage: mpirun -np 2 mpi_pingpong SECONDS SIZE...\n");
        }
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    double secs = atof(argv[1]);
    for (int a = 2; a < argc; a++) {
        long len = atol(argv[a]);
        char *buf = malloc(len > 0 ? len : 1);
        if (buf == NULL) {
            MPI_Abort(MPI_COMM_WORLD, 3);
        }
        memset(buf, rank, len);
        double t;
        round_trips(buf, len, 0, 20, rank, &t);
        long n = round_trips(buf, len, secs, 20, rank, &t);
        if (rank == 0) {
            long k = n < KEPT ? n : KEPT;
            double half_us = t / (2.0 * n) * 1e6;
            qsort(kept, k, sizeof(kept[0]), cmp);
            printf("pingpong %ld %ld %.3f %.3f %.2f\n", len, n, half_us, kept[k / 2] / 2 * 1e6,
                   len / half_us);
            fflush(stdout);
        }
        free(buf);
    }
    MPI_Finalize();
    return 0;
}
