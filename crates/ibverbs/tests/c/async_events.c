/* Asynchronous events through the plain libibverbs API, as an unmodified program sees
 * them: two RC QP pairs on one device, connected to each other.
 *   1. SRQ limit: 8 receives on an SRQ armed at 6; 3 SENDs -> IBV_EVENT_SRQ_LIMIT_REACHED.
 *   2. Access error: an RDMA WRITE to an MR without remote write -> the requester's
 *      completion is IBV_WC_REM_ACCESS_ERR, the responder QP gets IBV_EVENT_QP_ACCESS_ERR.
 *   3. CQ overrun: 8 SENDs into a QP whose receive CQ holds 1 -> IBV_EVENT_CQ_ERR for
 *      the CQ and IBV_EVENT_QP_FATAL for the QP, which is then in IBV_QPS_ERR.
 * Each event is read from the async fd with poll() (a lost event is a timeout, not a
 * hang) and acknowledged. Prints one line per event; exit status 0 when all arrived. */
#include <poll.h>

#include "testlib.h"

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static union ibv_gid gid;
static char buf[4096];
static struct ibv_mr *mr;

static struct ibv_qp *make_qp(struct ibv_cq *scq, struct ibv_cq *rcq, struct ibv_srq *srq)
{
	struct ibv_qp_init_attr ia = {
		.send_cq = scq, .recv_cq = rcq, .srq = srq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 16, .max_recv_wr = srq ? 0 : 16,
			 .max_send_sge = 1, .max_recv_sge = 1 },
	};
	struct ibv_qp *qp = ibv_create_qp(pd, &ia);
	CHECK(qp);
	qp_to_init(qp, IBV_ACCESS_REMOTE_WRITE);
	return qp;
}


static void post_recv(struct ibv_qp *qp, struct ibv_srq *srq, int n)
{
	for (int i = 0; i < n; i++) {
		struct ibv_sge sge = { (uintptr_t)buf, 64, mr->lkey };
		struct ibv_recv_wr wr = { .wr_id = i, .sg_list = &sge, .num_sge = 1 }, *bad;
		CHECK(!(srq ? ibv_post_srq_recv(srq, &wr, &bad) : ibv_post_recv(qp, &wr, &bad)));
	}
}

static void post_send(struct ibv_qp *qp, enum ibv_wr_opcode op, uint64_t raddr,
		      uint32_t rkey)
{
	struct ibv_sge sge = { (uintptr_t)buf + 2048, 64, mr->lkey };
	struct ibv_send_wr wr = { .sg_list = &sge, .num_sge = 1, .opcode = op,
				  .send_flags = IBV_SEND_SIGNALED }, *bad;
	wr.wr.rdma.remote_addr = raddr;
	wr.wr.rdma.rkey = rkey;
	CHECK(!ibv_post_send(qp, &wr, &bad));
}


/* Waits up to 10 s for the next async event; returns it acknowledged. */
static struct ibv_async_event next_event(void)
{
	struct pollfd p = { .fd = ctx->async_fd, .events = POLLIN };
	struct ibv_async_event ev;
	CHECK(poll(&p, 1, 10000) == 1);
	CHECK(!ibv_get_async_event(ctx, &ev));
	ibv_ack_async_event(&ev);
	printf("event: %s\n", ibv_event_type_str(ev.event_type));
	fflush(stdout);
	return ev;
}

/* Skips events this test did not ask about (e.g. IBV_EVENT_COMM_EST). */
static struct ibv_async_event expect_event(enum ibv_event_type t)
{
	for (int i = 0; i < 16; i++) {
		struct ibv_async_event ev = next_event();
		if (ev.event_type == t)
			return ev;
	}
	fprintf(stderr, "event %s never came\n", ibv_event_type_str(t));
	exit(1);
}

int main(void)
{
	int n;
	struct ibv_device **list = ibv_get_device_list(&n);
	CHECK(list && n > 0);
	ctx = ibv_open_device(list[0]);
	CHECK(ctx);
	ibv_free_device_list(list);
	CHECK(!ibv_query_gid(ctx, 1, 0, &gid));
	pd = ibv_alloc_pd(ctx);
	CHECK(pd);
	mr = ibv_reg_mr(pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE); /* no remote write */
	CHECK(mr);
	struct ibv_cq *cq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	CHECK(cq);

	/* 1. SRQ limit. */
	struct ibv_srq_init_attr si = { .attr = { .max_wr = 16, .max_sge = 1 } };
	struct ibv_srq *srq = ibv_create_srq(pd, &si);
	CHECK(srq);
	struct ibv_qp *a = make_qp(cq, cq, NULL), *b = make_qp(cq, cq, srq);
	qp_connect(a, b->qp_num, &gid, 0, 1);
	qp_connect(b, a->qp_num, &gid, 0, 1);
	post_recv(b, srq, 8);
	struct ibv_srq_attr sa = { .srq_limit = 6 };
	CHECK(!ibv_modify_srq(srq, &sa, IBV_SRQ_LIMIT));
	for (int i = 0; i < 3; i++)
		post_send(a, IBV_WR_SEND, 0, 0);
	struct ibv_async_event ev = expect_event(IBV_EVENT_SRQ_LIMIT_REACHED);
	CHECK(ev.element.srq == srq);
	CHECK(!ibv_query_srq(srq, &sa));
	CHECK(sa.srq_limit == 0); /* the limit disarms when it fires */
	for (int i = 0; i < 6; i++)
		CHECK(wait_wc(cq).status == IBV_WC_SUCCESS);

	/* 2. Remote access error: b's MR has no remote write. */
	post_send(a, IBV_WR_RDMA_WRITE, (uintptr_t)buf, mr->rkey);
	struct ibv_wc wc = wait_wc(cq);
	printf("write completion: %s\n", ibv_wc_status_str(wc.status));
	CHECK(wc.status == IBV_WC_REM_ACCESS_ERR);
	ev = expect_event(IBV_EVENT_QP_ACCESS_ERR);
	CHECK(ev.element.qp == b);

	/* 3. CQ overrun on a one-entry receive CQ. */
	struct ibv_cq *scq = ibv_create_cq(ctx, 64, NULL, NULL, 0), *tiny;
	tiny = ibv_create_cq(ctx, 1, NULL, NULL, 0);
	CHECK(scq && tiny);
	struct ibv_qp *c = make_qp(scq, scq, NULL), *d = make_qp(scq, tiny, NULL);
	qp_connect(c, d->qp_num, &gid, 0, 1);
	qp_connect(d, c->qp_num, &gid, 0, 1);
	post_recv(d, NULL, 16);
	for (int i = 0; i < tiny->cqe + 8; i++)
		post_send(c, IBV_WR_SEND, 0, 0);
	ev = expect_event(IBV_EVENT_CQ_ERR);
	CHECK(ev.element.cq == tiny);
	ev = expect_event(IBV_EVENT_QP_FATAL);
	CHECK(ev.element.qp == d);
	struct ibv_qp_attr qa;
	struct ibv_qp_init_attr qia;
	CHECK(!ibv_query_qp(d, &qa, IBV_QP_STATE, &qia));
	printf("qp state after overrun: %d\n", qa.qp_state);
	CHECK(qa.qp_state == IBV_QPS_ERR);
	printf("all events received\n");
	return 0;
}
