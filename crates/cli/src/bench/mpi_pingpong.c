/* The MPI ping-pong of `softhca bench --middleware` (built with mpicc at run time).
 *
 * mpi_pingpong SECONDS SIZE...: for each size, rank 0 sends SIZE bytes to rank 1, which
 * sends them back. Twenty round trips warm up (and set the connection up) and time the
 * pair; then about SECONDS worth of round trips are timed. Rank 0 prints one line per
 * size: "pingpong <bytes> <round trips> <half round trip us> <MB/s>", MB/s being the
 * bytes of one direction per half round trip (10^6 bytes per second). */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static double round_trips(char *buf, long len, long n, int rank)
{
    int peer = 1 - rank;
    double t0;

    MPI_Barrier(MPI_COMM_WORLD);
    t0 = MPI_Wtime();
    for (long i = 0; i < n; i++) {
        if (rank == 0) {
            MPI_Send(buf, (int)len, MPI_BYTE, peer, 0, MPI_COMM_WORLD);
            MPI_Recv(buf, (int)len, MPI_BYTE, peer, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        } else {
            MPI_Recv(buf, (int)len, MPI_BYTE, peer, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            MPI_Send(buf, (int)len, MPI_BYTE, peer, 0, MPI_COMM_WORLD);
        }
    }
    return MPI_Wtime() - t0;
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
        long n;
        if (buf == NULL) {
            MPI_Abort(MPI_COMM_WORLD, 3);
        }
        memset(buf, rank, len);
        double warm = round_trips(buf, len, 20, rank);
        n = (long)(secs / (warm / 20));
        n = n < 20 ? 20 : n > 2000000 ? 2000000 : n;
        MPI_Bcast(&n, 1, MPI_LONG, 0, MPI_COMM_WORLD);
        double t = round_trips(buf, len, n, rank);
        if (rank == 0) {
            double half_us = t / (2.0 * n) * 1e6;
            printf("pingpong %ld %ld %.3f %.2f\n", len, n, half_us, len / half_us);
            fflush(stdout);
        }
        free(buf);
    }
    MPI_Finalize();
    return 0;
}
