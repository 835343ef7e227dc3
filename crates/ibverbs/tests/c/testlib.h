/* What the C test programs share: a CHECK that names the failed expression and errno,
 * an "ok: ..." line per passed check, RC QP bring-up (INIT, then RTR/RTS towards a
 * GID on port 1) and a bounded completion wait. */
#ifndef SOFTHCA_TESTLIB_H
#define SOFTHCA_TESTLIB_H

#include <errno.h>
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(x)                                                                  \
	do {                                                                      \
		if (!(x)) {                                                       \
			fprintf(stderr, "%s:%d: %s failed (errno %d: %s)\n", __FILE__, \
				__LINE__, #x, errno, strerror(errno));            \
			exit(1);                                                  \
		}                                                                 \
	} while (0)

#define OK(what) printf("ok: %s\n", what), fflush(stdout)

/* RESET -> INIT on port 1 with the given remote rights. */
static inline void qp_to_init(struct ibv_qp *qp, unsigned access)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1,
				 .qp_access_flags = access };
	CHECK(!ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
					 IBV_QP_ACCESS_FLAGS));
}

/* INIT -> RTR -> RTS towards QP `dest` at `dgid`, from GID `sgid_index`; both
 * directions start at PSN `psn`. MTU 1024, 4 READs/atomics each way, perftest's
 * timeout and retries, a short RNR timer. */
static inline void qp_connect(struct ibv_qp *qp, uint32_t dest, const union ibv_gid *dgid,
			      uint8_t sgid_index, uint32_t psn)
{
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_1024, .dest_qp_num = dest,
		.rq_psn = psn, .max_dest_rd_atomic = 4, .min_rnr_timer = 1,
		.ah_attr = { .is_global = 1, .port_num = 1,
			     .grh = { .dgid = *dgid, .sgid_index = sgid_index,
				      .hop_limit = 64 } },
	};
	CHECK(!ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
					 IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
					 IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.sq_psn = psn;
	a.max_rd_atomic = 4;
	CHECK(!ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
					 IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
					 IBV_QP_MAX_QP_RD_ATOMIC));
}

/* The next completion of `cq`; exits if none comes within a few seconds of spinning. */
static inline struct ibv_wc wait_wc(struct ibv_cq *cq)
{
	struct ibv_wc wc;
	for (long spins = 0; spins < 400000000L; spins++) {
		int n = ibv_poll_cq(cq, 1, &wc);
		CHECK(n >= 0);
		if (n == 1)
			return wc;
	}
	fprintf(stderr, "no completion\n");
	exit(1);
}

#endif
