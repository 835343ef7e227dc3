/* The reply path of a UD receive: QP a sends to QP b (one device, its GID 0), b builds
 * an address handle from the completion and the GRH area (ibv_init_ah_from_wc,
 * ibv_create_ah_from_wc) and answers through it; a receives the answer. Also checks the
 * GRH area itself (IPv4 header in its last 20 bytes for an IPv4 GID) and that wc.sl
 * carries the RoCEv2 L3 type (2: IPv4), as mlx5 reports it. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(x)                                                                  \
	do {                                                                          \
		if (!(x)) {                                                               \
			fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #x); \
			exit(1);                                                              \
		}                                                                         \
	} while (0)

#define QKEY 0x11111111
#define LEN 64

struct side {
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	struct ibv_mr *mr;
	char buf[40 + LEN];
};

static struct ibv_context *ctx;
static struct ibv_pd *pd;

static void make(struct side *s)
{
	s->cq = ibv_create_cq(ctx, 8, NULL, NULL, 0);
	CHECK(s->cq);
	struct ibv_qp_init_attr ia = {
		.send_cq = s->cq,
		.recv_cq = s->cq,
		.cap = {.max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1},
		.qp_type = IBV_QPT_UD,
	};
	s->qp = ibv_create_qp(pd, &ia);
	CHECK(s->qp);
	s->mr = ibv_reg_mr(pd, s->buf, sizeof s->buf, IBV_ACCESS_LOCAL_WRITE);
	CHECK(s->mr);
	struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .port_num = 1, .qkey = QKEY};
	CHECK(!ibv_modify_qp(s->qp, &a,
			     IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY));
	a.qp_state = IBV_QPS_RTR;
	CHECK(!ibv_modify_qp(s->qp, &a, IBV_QP_STATE));
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = 0;
	CHECK(!ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN));
}

static void post_recv(struct side *s)
{
	struct ibv_sge sge = {(uintptr_t)s->buf, sizeof s->buf, s->mr->lkey};
	struct ibv_recv_wr wr = {.sg_list = &sge, .num_sge = 1}, *bad;
	CHECK(!ibv_post_recv(s->qp, &wr, &bad));
}

static void send_to(struct side *s, struct ibv_ah *ah, uint32_t qpn, char fill)
{
	memset(s->buf + 40, fill, LEN);
	struct ibv_sge sge = {(uintptr_t)(s->buf + 40), LEN, s->mr->lkey};
	struct ibv_send_wr wr = {.sg_list = &sge,
				 .num_sge = 1,
				 .opcode = IBV_WR_SEND,
				 .send_flags = IBV_SEND_SIGNALED,
				 .wr.ud = {.ah = ah, .remote_qpn = qpn, .remote_qkey = QKEY}},
			   *bad;
	CHECK(!ibv_post_send(s->qp, &wr, &bad));
}

static struct ibv_wc wait_wc(struct side *s, enum ibv_wc_opcode op)
{
	struct ibv_wc wc;
	for (;;) {
		int n = ibv_poll_cq(s->cq, 1, &wc);
		CHECK(n >= 0);
		if (n == 1) {
			CHECK(wc.status == IBV_WC_SUCCESS);
			if (wc.opcode == op)
				return wc;
		}
	}
}

int main(void)
{
	int n;
	struct ibv_device **list = ibv_get_device_list(&n);
	CHECK(list && n > 0);
	ctx = ibv_open_device(list[0]);
	CHECK(ctx);
	pd = ibv_alloc_pd(ctx);
	CHECK(pd);
	union ibv_gid gid;
	CHECK(!ibv_query_gid(ctx, 1, 0, &gid));
	struct side a, b;
	make(&a);
	make(&b);

	struct ibv_ah_attr aa = {.is_global = 1, .port_num = 1};
	aa.grh.dgid = gid;
	aa.grh.hop_limit = 64;
	struct ibv_ah *to_b = ibv_create_ah(pd, &aa);
	CHECK(to_b);
	post_recv(&b);
	send_to(&a, to_b, b.qp->qp_num, 'x');
	wait_wc(&a, IBV_WC_SEND);
	struct ibv_wc wc = wait_wc(&b, IBV_WC_RECV);
	CHECK(wc.wc_flags & IBV_WC_GRH);
	CHECK(wc.byte_len == 40 + LEN);
	CHECK(wc.src_qp == a.qp->qp_num);
	CHECK(b.buf[40] == 'x' && b.buf[40 + LEN - 1] == 'x');
	/* An IPv4 GID: the IPv4 header is in the last 20 bytes, daddr = saddr = our address. */
	CHECK(IN6_IS_ADDR_V4MAPPED((struct in6_addr *)gid.raw));
	CHECK(b.buf[20] == 0x45);
	CHECK(!memcmp(b.buf + 32, gid.raw + 12, 4) && !memcmp(b.buf + 36, gid.raw + 12, 4));
	CHECK(wc.sl == 2);
	printf("ok: UD receive: GRH area with the IPv4 header, wc.sl = 2\n");

	struct ibv_ah_attr back;
	CHECK(!ibv_init_ah_from_wc(ctx, 1, &wc, (struct ibv_grh *)b.buf, &back));
	CHECK(back.is_global == 1 && back.port_num == 1);
	CHECK(!memcmp(&back.grh.dgid, &gid, sizeof gid));
	CHECK(back.grh.sgid_index == 0);
	CHECK(back.grh.hop_limit == 64);
	struct ibv_ah *to_a = ibv_create_ah_from_wc(pd, &wc, (struct ibv_grh *)b.buf, 1);
	CHECK(to_a);
	post_recv(&a);
	send_to(&b, to_a, wc.src_qp, 'y');
	wait_wc(&b, IBV_WC_SEND);
	struct ibv_wc wa = wait_wc(&a, IBV_WC_RECV);
	CHECK(wa.src_qp == b.qp->qp_num);
	CHECK(a.buf[40] == 'y' && a.buf[40 + LEN - 1] == 'y');
	printf("ok: ibv_init_ah_from_wc / ibv_create_ah_from_wc answer the sender\n");

	CHECK(!ibv_destroy_ah(to_a) && !ibv_destroy_ah(to_b));
	CHECK(!ibv_destroy_qp(a.qp) && !ibv_destroy_qp(b.qp));
	CHECK(!ibv_dereg_mr(a.mr) && !ibv_dereg_mr(b.mr));
	CHECK(!ibv_destroy_cq(a.cq) && !ibv_destroy_cq(b.cq));
	CHECK(!ibv_dealloc_pd(pd));
	CHECK(!ibv_close_device(ctx));
	ibv_free_device_list(list);
	printf("all ah_from_wc checks passed\n");
	return 0;
}
