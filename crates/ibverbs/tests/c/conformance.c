/* Verbs conformance as an unmodified program sees it, checked against what rdma-core
 * and kernel rxe do:
 *   contexts  two ibv_open_device of one device share it (same GID), a QP of each
 *             context talks to the other, each driven from its own thread;
 *   events    comp channel and async fd follow read(2): EAGAIN with O_NONBLOCK, EINTR
 *             on a signal, poll() readiness, ibv_destroy_cq after the acks;
 *   attrs     comp_vector >= num_comp_vectors, cqe out of range, create flags 0,
 *             ibv_resize_cq growing and shrinking, cmd_fd dup() + ibv_import_device.
 * Prints one "ok: ..." line per check; exit status 0 when all pass. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <net/if.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>

#include "testlib.h"

/* Declared in <infiniband/driver.h>, which programs do not include (Open MPI declares it
 * itself to call it). */
const char *ibv_get_sysfs_path(void);

struct side {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	struct ibv_mr *mr;
	char buf[8192];
};

static union ibv_gid gid;

static void make_side(struct side *s, struct ibv_device *dev)
{
	s->ctx = ibv_open_device(dev);
	CHECK(s->ctx);
	s->pd = ibv_alloc_pd(s->ctx);
	CHECK(s->pd);
	s->mr = ibv_reg_mr(s->pd, s->buf, sizeof s->buf,
			   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	CHECK(s->mr);
	s->cq = ibv_create_cq(s->ctx, 64, NULL, NULL, 0);
	CHECK(s->cq);
	struct ibv_qp_init_attr ia = {
		.send_cq = s->cq, .recv_cq = s->cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1,
			 .max_recv_sge = 1 },
	};
	s->qp = ibv_create_qp(s->pd, &ia);
	CHECK(s->qp);
	qp_to_init(s->qp, IBV_ACCESS_REMOTE_WRITE);
}



#define ROUNDS 200

static void post_recv4k(struct side *s)
{
	struct ibv_sge rs = { (uintptr_t)s->buf, 4096, s->mr->lkey };
	struct ibv_recv_wr rw = { .wr_id = 1, .sg_list = &rs, .num_sge = 1 }, *rb;
	CHECK(!ibv_post_recv(s->qp, &rw, &rb));
}

static void send4k(struct side *s, int round, int tag)
{
	for (int i = 0; i < 4096; i++)
		s->buf[4096 + i] = (char)(round * 7 + i + tag);
	struct ibv_sge ss = { (uintptr_t)s->buf + 4096, 4096, s->mr->lkey };
	struct ibv_send_wr sw = { .wr_id = 2, .sg_list = &ss, .num_sge = 1,
				  .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED }, *sb;
	CHECK(!ibv_post_send(s->qp, &sw, &sb));
}

/* Waits for the completion with `wr_id` (the other one may come first, kept in *seen). */
static void wait_for(struct side *s, uint64_t wr_id, int *seen)
{
	while (!seen[wr_id]) {
		struct ibv_wc wc = wait_wc(s->cq);
		CHECK(wc.status == IBV_WC_SUCCESS);
		seen[wc.wr_id] = 1;
	}
	seen[wr_id] = 0;
}

static void check4k(struct side *s, int round, int tag)
{
	for (int i = 0; i < 4096; i++)
		CHECK(s->buf[i] == (char)(round * 7 + i + tag));
}

/* One side of a ping-pong of ROUNDS 4 KiB SENDs whose payload the receiver checks, run
 * by each context's own thread. The initiator has tag 1, the responder tag 2. */
static void *pingpong(void *arg)
{
	struct side *s = arg;
	int initiator = s->buf[8191] == 'I';
	int seen[3] = { 0 };
	post_recv4k(s);
	for (int r = 0; r < ROUNDS; r++) {
		if (initiator) {
			send4k(s, r, 1);
			wait_for(s, 2, seen);
			wait_for(s, 1, seen);
			check4k(s, r, 2);
			post_recv4k(s);
		} else {
			wait_for(s, 1, seen);
			check4k(s, r, 1);
			post_recv4k(s);
			send4k(s, r, 2);
			wait_for(s, 2, seen);
		}
	}
	return NULL;
}

static void check_two_contexts(struct ibv_device *dev)
{
	static struct side a, b;
	make_side(&a, dev);
	make_side(&b, dev);
	union ibv_gid ga, gb;
	CHECK(!ibv_query_gid(a.ctx, 1, 0, &ga));
	CHECK(!ibv_query_gid(b.ctx, 1, 0, &gb));
	CHECK(!memcmp(&ga, &gb, sizeof ga));
	CHECK(a.ctx != b.ctx);
	CHECK(a.qp->qp_num != b.qp->qp_num);
	gid = ga;
	OK("two opens of one device share its GID table and QPN space");
	qp_connect(a.qp, b.qp->qp_num, &gid, 0, 1);
	qp_connect(b.qp, a.qp->qp_num, &gid, 0, 1);
	a.buf[8191] = 'I';
	b.buf[8191] = 'R';
	pthread_t ta, tb;
	CHECK(!pthread_create(&tb, NULL, pingpong, &b));
	CHECK(!pthread_create(&ta, NULL, pingpong, &a));
	CHECK(!pthread_join(ta, NULL));
	CHECK(!pthread_join(tb, NULL));
	OK("QPs of two contexts exchange 200 verified SENDs, one thread per context");
	CHECK(!ibv_destroy_qp(a.qp) && !ibv_destroy_qp(b.qp));
	CHECK(!ibv_dereg_mr(a.mr) && !ibv_dereg_mr(b.mr));
	CHECK(!ibv_destroy_cq(a.cq) && !ibv_destroy_cq(b.cq));
	CHECK(!ibv_dealloc_pd(a.pd) && !ibv_dealloc_pd(b.pd));
	CHECK(!ibv_close_device(b.ctx));
	/* The device lives on in the other context. */
	struct ibv_pd *pd = ibv_alloc_pd(a.ctx);
	CHECK(pd);
	CHECK(!ibv_dealloc_pd(pd));
	CHECK(!ibv_close_device(a.ctx));
	OK("closing one context leaves the other working");
}

static void on_alarm(int sig)
{
	(void)sig;
}

static void check_events(struct ibv_device *dev)
{
	static struct side s;
	make_side(&s, dev);
	CHECK(!ibv_query_gid(s.ctx, 1, 0, &gid));
	struct ibv_comp_channel *ch = ibv_create_comp_channel(s.ctx);
	CHECK(ch);
	struct ibv_cq *cq = ibv_create_cq(s.ctx, 16, (void *)0x1234, ch, 0);
	CHECK(cq);
	struct ibv_cq *ecq;
	void *ectx;

	/* Blocking by default, as the kernel's fds. */
	CHECK(!(fcntl(ch->fd, F_GETFL) & O_NONBLOCK));
	CHECK(!(fcntl(s.ctx->async_fd, F_GETFL) & O_NONBLOCK));

	/* O_NONBLOCK: EAGAIN with nothing pending. */
	CHECK(!fcntl(ch->fd, F_SETFL, fcntl(ch->fd, F_GETFL) | O_NONBLOCK));
	errno = 0;
	CHECK(ibv_get_cq_event(ch, &ecq, &ectx) == -1 && errno == EAGAIN);
	CHECK(!fcntl(s.ctx->async_fd, F_SETFL, fcntl(s.ctx->async_fd, F_GETFL) | O_NONBLOCK));
	struct ibv_async_event aev;
	errno = 0;
	CHECK(ibv_get_async_event(s.ctx, &aev) == -1 && errno == EAGAIN);
	OK("O_NONBLOCK event fds give EAGAIN");

	/* A blocking wait is interrupted by a signal whose handler has no SA_RESTART. */
	CHECK(!fcntl(ch->fd, F_SETFL, fcntl(ch->fd, F_GETFL) & ~O_NONBLOCK));
	struct sigaction sa = { .sa_handler = on_alarm };
	sigemptyset(&sa.sa_mask);
	CHECK(!sigaction(SIGALRM, &sa, NULL));
	alarm(1);
	errno = 0;
	CHECK(ibv_get_cq_event(ch, &ecq, &ectx) == -1 && errno == EINTR);
	CHECK(!fcntl(s.ctx->async_fd, F_SETFL, fcntl(s.ctx->async_fd, F_GETFL) & ~O_NONBLOCK));
	alarm(1);
	errno = 0;
	CHECK(ibv_get_async_event(s.ctx, &aev) == -1 && errno == EINTR);
	OK("a signal interrupts blocking waits with EINTR");

	/* Readiness: not readable before, readable after an armed CQ completes. */
	struct pollfd p = { .fd = ch->fd, .events = POLLIN };
	CHECK(poll(&p, 1, 0) == 0);
	struct ibv_qp_init_attr ia = {
		.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1,
			 .max_recv_sge = 1 },
	};
	struct ibv_qp *qp = ibv_create_qp(s.pd, &ia);
	CHECK(qp);
	qp_to_init(qp, 0);
	qp_connect(qp, qp->qp_num, &gid, 0, 1); /* loopback to itself */
	CHECK(!ibv_req_notify_cq(cq, 0));
	struct ibv_sge sge = { (uintptr_t)s.buf, 16, s.mr->lkey };
	struct ibv_recv_wr rw = { .wr_id = 7, .sg_list = &sge, .num_sge = 1 }, *rb;
	CHECK(!ibv_post_recv(qp, &rw, &rb));
	struct ibv_send_wr sw = { .wr_id = 8, .sg_list = &sge, .num_sge = 1,
				  .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED }, *sb;
	CHECK(!ibv_post_send(qp, &sw, &sb));
	CHECK(poll(&p, 1, 10000) == 1 && (p.revents & POLLIN));
	CHECK(!ibv_get_cq_event(ch, &ecq, &ectx));
	CHECK(ecq == cq && ectx == (void *)0x1234);
	p.revents = 0;
	CHECK(poll(&p, 1, 0) == 0);
	OK("the channel fd is readable exactly while an event is pending");
	struct ibv_wc wc[4];
	int got = 0;
	while (got < 2) {
		int n = ibv_poll_cq(cq, 4, wc);
		CHECK(n >= 0);
		got += n;
	}
	ibv_ack_cq_events(cq, 1);
	CHECK(cq->comp_events_completed == 1);
	CHECK(!ibv_destroy_qp(qp));
	CHECK(!ibv_destroy_cq(cq));
	CHECK(!ibv_destroy_comp_channel(ch));
	OK("events acknowledged, CQ and channel destroyed");
}

static void check_attrs(struct ibv_device *dev)
{
	struct ibv_context *ctx = ibv_open_device(dev);
	CHECK(ctx);
	struct ibv_device_attr da;
	CHECK(!ibv_query_device(ctx, &da));
	CHECK(ctx->num_comp_vectors >= 1);

	errno = 0;
	CHECK(!ibv_create_cq(ctx, 16, NULL, NULL, ctx->num_comp_vectors) && errno == EINVAL);
	errno = 0;
	CHECK(!ibv_create_cq(ctx, 0, NULL, NULL, 0) && errno == EINVAL);
	errno = 0;
	CHECK(!ibv_create_cq(ctx, da.max_cqe + 1, NULL, NULL, 0) && errno == EINVAL);
	struct ibv_cq_init_attr_ex cx = { .cqe = 16, .comp_vector = ctx->num_comp_vectors,
					  .wc_flags = IBV_WC_STANDARD_FLAGS };
	errno = 0;
	CHECK(!ibv_create_cq_ex(ctx, &cx) && errno == EINVAL);
	cx.comp_vector = 0;
	struct ibv_cq_ex *cqx = ibv_create_cq_ex(ctx, &cx);
	CHECK(cqx);
	OK("create_cq: comp_vector and cqe ranges as the kernel checks them");

	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	CHECK(pd);
	struct ibv_qp_init_attr_ex qx = {
		.send_cq = ibv_cq_ex_to_cq(cqx), .recv_cq = ibv_cq_ex_to_cq(cqx),
		.qp_type = IBV_QPT_RC, .pd = pd,
		.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_CREATE_FLAGS,
		.create_flags = 0,
		.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1,
			 .max_recv_sge = 1 },
	};
	struct ibv_qp *qp = ibv_create_qp_ex(ctx, &qx);
	CHECK(qp);
	CHECK(!ibv_destroy_qp(qp));
	OK("create_qp_ex accepts IBV_QP_INIT_ATTR_CREATE_FLAGS with no flags");

	struct ibv_cq *cq = ibv_create_cq(ctx, 8, NULL, NULL, 0);
	CHECK(cq);
	CHECK(!ibv_resize_cq(cq, 200) && cq->cqe >= 200);
	CHECK(!ibv_resize_cq(cq, 4) && cq->cqe >= 4 && cq->cqe < 200);
	errno = 0;
	CHECK(ibv_resize_cq(cq, da.max_cqe + 1) != 0);
	CHECK(!ibv_destroy_cq(cq));
	CHECK(!ibv_destroy_cq(ibv_cq_ex_to_cq(cqx)));
	OK("resize_cq grows and shrinks");

	/* UD sends complete once they leave: posted and not polled, they count against a
	 * smaller size at once (rdma-core's test_resize_cq). */
	cq = ibv_create_cq(ctx, 8, NULL, NULL, 0);
	CHECK(cq);
	struct ibv_qp_init_attr ua = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_UD,
				       .cap = { .max_send_wr = 8, .max_recv_wr = 1,
						.max_send_sge = 1, .max_recv_sge = 1 } };
	struct ibv_qp *ud = ibv_create_qp(pd, &ua);
	CHECK(ud);
	struct ibv_qp_attr qa = { .qp_state = IBV_QPS_INIT, .port_num = 1, .qkey = 0x11 };
	CHECK(!ibv_modify_qp(ud, &qa, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
				     IBV_QP_QKEY));
	qa.qp_state = IBV_QPS_RTR;
	CHECK(!ibv_modify_qp(ud, &qa, IBV_QP_STATE));
	qa.qp_state = IBV_QPS_RTS;
	qa.sq_psn = 1;
	CHECK(!ibv_modify_qp(ud, &qa, IBV_QP_STATE | IBV_QP_SQ_PSN));
	union ibv_gid g;
	CHECK(!ibv_query_gid(ctx, 1, 0, &g));
	struct ibv_ah_attr aa = { .is_global = 1, .port_num = 1,
				  .grh = { .dgid = g, .hop_limit = 64 } };
	struct ibv_ah *ah = ibv_create_ah(pd, &aa);
	CHECK(ah);
	static char msg[64];
	struct ibv_mr *mmr = ibv_reg_mr(pd, msg, sizeof msg, 0);
	CHECK(mmr);
	for (int i = 0; i < 5; i++) {
		struct ibv_sge sg = { .addr = (uintptr_t)msg, .length = sizeof msg,
				      .lkey = mmr->lkey };
		struct ibv_send_wr wr = { .wr_id = i, .sg_list = &sg, .num_sge = 1,
					  .opcode = IBV_WR_SEND,
					  .send_flags = IBV_SEND_SIGNALED }, *bad;
		wr.wr.ud.ah = ah;
		wr.wr.ud.remote_qpn = ud->qp_num;
		wr.wr.ud.remote_qkey = 0x11;
		CHECK(!ibv_post_send(ud, &wr, &bad));
	}
	CHECK(ibv_resize_cq(cq, 1) == EINVAL);
	/* Multicast as uverbs and rxe check it: a multicast GID only, no detaching what
	 * is not attached, and no destroying a QP that is attached. */
	union ibv_gid mg = { .raw = { [10] = 0xff, [11] = 0xff, 239, 6, 6, 7 } };
	CHECK(ibv_attach_mcast(ud, &g, 0) == EINVAL);
	CHECK(ibv_detach_mcast(ud, &mg, 0) == EINVAL);
	CHECK(!ibv_attach_mcast(ud, &mg, 0));
	CHECK(!ibv_attach_mcast(ud, &mg, 0));
	CHECK(ibv_destroy_qp(ud) == EBUSY);
	CHECK(!ibv_detach_mcast(ud, &mg, 0));
	OK("attach_mcast / detach_mcast: EINVAL for a unicast GID or a group not joined, "
	   "EBUSY destroying an attached QP");
	CHECK(!ibv_destroy_qp(ud));
	CHECK(!ibv_destroy_ah(ah));
	CHECK(!ibv_dereg_mr(mmr));
	CHECK(!ibv_destroy_cq(cq));
	OK("resize_cq below the completions of sends posted and not polled fails with EINVAL");

	struct ibv_gid_entry ge;
	CHECK(!ibv_query_gid_ex(ctx, 1, 0, &ge, 0));
	CHECK(ge.gid_type == IBV_GID_TYPE_ROCE_V2 && ge.ndev_ifindex == if_nametoindex("lo"));
	OK("query_gid_ex names the GID's network interface (a loopback address: lo)");

	int fd = dup(ctx->cmd_fd);
	CHECK(fd >= 0);
	errno = 0;
	CHECK(!ibv_import_device(fd) && errno == EOPNOTSUPP);
	close(fd);
	OK("cmd_fd can be dup()ed; ibv_import_device is refused with EOPNOTSUPP");
	CHECK(!ibv_dealloc_pd(pd));
	CHECK(!ibv_close_device(ctx));
}

/* On-demand paging as rxe offers it: explicit regions, RC and UD, and ibv_advise_mr
 * prefetching them; not implicit ODP, and not a region registered without it. */
static void check_odp(struct ibv_device *dev)
{
	struct ibv_context *ctx = ibv_open_device(dev);
	CHECK(ctx);
	struct ibv_device_attr_ex dx;
	CHECK(!ibv_query_device_ex(ctx, NULL, &dx));
	CHECK(dx.odp_caps.general_caps & IBV_ODP_SUPPORT);
	CHECK(!(dx.odp_caps.general_caps & IBV_ODP_SUPPORT_IMPLICIT));
	CHECK((dx.odp_caps.per_transport_caps.rc_odp_caps & (IBV_ODP_SUPPORT_SEND |
		IBV_ODP_SUPPORT_RECV | IBV_ODP_SUPPORT_WRITE | IBV_ODP_SUPPORT_READ)) ==
	      (IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV | IBV_ODP_SUPPORT_WRITE |
	       IBV_ODP_SUPPORT_READ));
	OK("query_device_ex reports explicit on-demand paging for RC and UD");

	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	CHECK(pd);
	size_t len = 1 << 20;
	/* Mapped, never touched: the prefetch faults it in. */
	char *buf = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	CHECK(buf != MAP_FAILED);
	int rw = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
	struct ibv_mr *odp = ibv_reg_mr(pd, buf, len, rw | IBV_ACCESS_ON_DEMAND);
	CHECK(odp);
	struct ibv_mr *plain = ibv_reg_mr(pd, buf, len, rw);
	CHECK(plain);
	struct ibv_sge sge = { .addr = (uintptr_t)buf + 4096, .length = 65536, .lkey = odp->lkey };
	CHECK(!ibv_advise_mr(pd, IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE, IBV_ADVISE_MR_FLAG_FLUSH,
			     &sge, 1));
	CHECK(!ibv_advise_mr(pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &sge, 1));
	CHECK(!ibv_advise_mr(pd, IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT, 0, &sge, 1));
	OK("advise_mr prefetches a range of an on-demand region");

	struct ibv_sge outside = { .addr = (uintptr_t)buf + len - 8, .length = 16,
				   .lkey = odp->lkey };
	CHECK(ibv_advise_mr(pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &outside, 1) == EINVAL);
	struct ibv_sge not_odp = { .addr = (uintptr_t)buf, .length = 64, .lkey = plain->lkey };
	CHECK(ibv_advise_mr(pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &not_odp, 1) == EINVAL);
	CHECK(ibv_advise_mr(pd, 7, 0, &sge, 1) == EOPNOTSUPP);
	CHECK(ibv_advise_mr(pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &sge, 0) == EINVAL);
	errno = 0;
	CHECK(!ibv_reg_mr(pd, NULL, SIZE_MAX, rw | IBV_ACCESS_ON_DEMAND) && errno == EINVAL);
	OK("advise_mr refuses a range outside, a region not on demand, an unknown advice; "
	   "no implicit ODP");

	/* As libibverbs with rxe's provider, which has no rereg_mr: bad arguments are
	 * IBV_REREG_MR_ERR_INPUT/EINVAL, a valid request IBV_REREG_MR_ERR_CMD/EOPNOTSUPP. */
	errno = 0;
	CHECK(ibv_rereg_mr(plain, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0,
			   IBV_ACCESS_LOCAL_WRITE) == IBV_REREG_MR_ERR_CMD && errno == EOPNOTSUPP);
	errno = 0;
	CHECK(ibv_rereg_mr(plain, 1 << 3, NULL, NULL, 0, 0) == IBV_REREG_MR_ERR_INPUT &&
	      errno == EINVAL);
	errno = 0;
	CHECK(ibv_rereg_mr(plain, IBV_REREG_MR_CHANGE_TRANSLATION, NULL, NULL, 0, 0) ==
		      IBV_REREG_MR_ERR_INPUT && errno == EINVAL);
	errno = 0;
	CHECK(ibv_rereg_mr(plain, IBV_REREG_MR_CHANGE_PD, pd, NULL, 0, IBV_ACCESS_LOCAL_WRITE) ==
		      IBV_REREG_MR_ERR_INPUT && errno == EINVAL);
	CHECK(plain->pd == pd && plain->addr == buf && plain->length == len);
	OK("rereg_mr fails as libibverbs does over rxe, the MR unchanged");
	CHECK(!ibv_dereg_mr(plain));
	CHECK(!ibv_dereg_mr(odp));
	munmap(buf, len);
	CHECK(!ibv_dealloc_pd(pd));
	CHECK(!ibv_close_device(ctx));
}

int main(void)
{
	/* libibverbs' rule: $SYSFS_PATH, trailing slashes dropped, read at the first call. */
	setenv("SYSFS_PATH", "/tmp/softhca-sysfs//", 1);
	CHECK(!strcmp(ibv_get_sysfs_path(), "/tmp/softhca-sysfs"));
	OK("ibv_get_sysfs_path follows SYSFS_PATH as libibverbs does");
	int n;
	struct ibv_device **list = ibv_get_device_list(&n);
	CHECK(list && n > 0);
	check_two_contexts(list[0]);
	check_events(list[0]);
	check_attrs(list[0]);
	check_odp(list[0]);
	ibv_free_device_list(list);
	printf("all conformance checks passed\n");
	return 0;
}
