/* Memory windows through the plain libibverbs API, as rxe runs them: two RC QPs on one
 * device connected to each other; B owns a region registered with IBV_ACCESS_MW_BIND.
 *   type 1: ibv_bind_mw on B grants REMOTE_WRITE to 512 bytes; A writes through the
 *           window's rkey (data checked), and the old rkey no longer works;
 *   type 2: IBV_WR_BIND_MW on B grants REMOTE_READ; A reads through it (data checked);
 *           IBV_WR_LOCAL_INV on B revokes another type 2 window;
 *   SEND with invalidate from A revokes B's window: B's receive completion carries
 *           IBV_WC_WITH_INV and the rkey, and a READ through it then fails with
 *           IBV_WC_REM_ACCESS_ERR;
 *   a region with a bound window cannot be deregistered; device caps report windows.
 * Prints one "ok: ..." line per check; exit status 0 when all pass. */
#include "testlib.h"

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static union ibv_gid gid;
static char abuf[8192], bbuf[8192];
static struct ibv_mr *amr, *bmr;

static struct ibv_qp *make_qp(struct ibv_cq *cq)
{
	struct ibv_qp_init_attr ia = {
		.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1,
			 .max_recv_sge = 1 },
	};
	struct ibv_qp *qp = ibv_create_qp(pd, &ia);
	CHECK(qp);
	qp_to_init(qp, IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
	return qp;
}



static void rdma(struct ibv_qp *qp, enum ibv_wr_opcode op, char *local, uint32_t len,
		 uint64_t raddr, uint32_t rkey)
{
	struct ibv_sge sge = { (uintptr_t)local, len, amr->lkey };
	struct ibv_send_wr wr = { .wr_id = 1, .sg_list = &sge, .num_sge = 1, .opcode = op,
				  .send_flags = IBV_SEND_SIGNALED }, *bad;
	wr.wr.rdma.remote_addr = raddr;
	wr.wr.rdma.rkey = rkey;
	CHECK(!ibv_post_send(qp, &wr, &bad));
}

static void bind2(struct ibv_qp *qp, struct ibv_mw *mw, uint64_t addr, uint64_t len,
		  unsigned access, struct ibv_cq *cq)
{
	uint32_t rkey = ibv_inc_rkey(mw->rkey);
	struct ibv_send_wr wr = { .wr_id = 50, .opcode = IBV_WR_BIND_MW,
				  .send_flags = IBV_SEND_SIGNALED }, *bad;
	wr.bind_mw.mw = mw;
	wr.bind_mw.rkey = rkey;
	wr.bind_mw.bind_info = (struct ibv_mw_bind_info){ .mr = bmr, .addr = addr,
							  .length = len,
							  .mw_access_flags = access };
	CHECK(!ibv_post_send(qp, &wr, &bad));
	struct ibv_wc wc = wait_wc(cq);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_BIND_MW && wc.wr_id == 50);
	mw->rkey = rkey; /* type 2: the application records the new rkey */
}

int main(void)
{
	int n;
	struct ibv_device **list = ibv_get_device_list(&n);
	CHECK(list && n > 0);
	ctx = ibv_open_device(list[0]);
	CHECK(ctx);
	ibv_free_device_list(list);
	struct ibv_device_attr da;
	CHECK(!ibv_query_device(ctx, &da));
	CHECK(da.max_mw > 0);
	CHECK(da.device_cap_flags & IBV_DEVICE_MEM_WINDOW);
	CHECK(da.device_cap_flags & IBV_DEVICE_MEM_WINDOW_TYPE_2B);
	OK("device reports memory windows");
	CHECK(!ibv_query_gid(ctx, 1, 0, &gid));
	pd = ibv_alloc_pd(ctx);
	CHECK(pd);
	amr = ibv_reg_mr(pd, abuf, sizeof abuf, IBV_ACCESS_LOCAL_WRITE);
	bmr = ibv_reg_mr(pd, bbuf, sizeof bbuf,
			 IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
	CHECK(amr && bmr);
	struct ibv_cq *acq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	struct ibv_cq *bcq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	CHECK(acq && bcq);
	struct ibv_qp *a = make_qp(acq), *b = make_qp(bcq);
	qp_connect(a, b->qp_num, &gid, 0, 1);
	qp_connect(b, a->qp_num, &gid, 0, 1);

	/* Type 1. */
	struct ibv_mw *mw1 = ibv_alloc_mw(pd, IBV_MW_TYPE_1);
	CHECK(mw1 && mw1->type == IBV_MW_TYPE_1);
	uint32_t old = mw1->rkey;
	struct ibv_mw_bind mb = { .wr_id = 40, .send_flags = IBV_SEND_SIGNALED,
				  .bind_info = { .mr = bmr, .addr = (uintptr_t)bbuf + 1024,
						 .length = 512,
						 /* Local rights mean nothing for a window: rxe
						  * accepts them (rdma-core's tests bind so). */
						 .mw_access_flags = IBV_ACCESS_LOCAL_WRITE |
								    IBV_ACCESS_REMOTE_WRITE } };
	CHECK(!ibv_bind_mw(b, mw1, &mb));
	CHECK(mw1->rkey != old && (mw1->rkey >> 8) == (old >> 8));
	struct ibv_wc wc = wait_wc(bcq);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_BIND_MW && wc.wr_id == 40);
	for (int i = 0; i < 512; i++)
		abuf[i] = (char)(i * 3 + 1);
	rdma(a, IBV_WR_RDMA_WRITE, abuf, 512, (uintptr_t)bbuf + 1024, mw1->rkey);
	wc = wait_wc(acq);
	CHECK(wc.status == IBV_WC_SUCCESS);
	CHECK(!memcmp(bbuf + 1024, abuf, 512));
	OK("type 1 window: bind, then an RDMA WRITE through its rkey lands in the region");
	errno = 0;
	CHECK(ibv_dereg_mr(bmr) != 0);
	OK("a region with a bound window cannot be deregistered");

	/* Type 2: bind, READ through it. */
	struct ibv_mw *mw2 = ibv_alloc_mw(pd, IBV_MW_TYPE_2);
	CHECK(mw2);
	for (int i = 0; i < 256; i++)
		bbuf[4096 + i] = (char)(i * 5 + 2);
	bind2(b, mw2, (uintptr_t)bbuf + 4096, 256, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ,
	      bcq);
	memset(abuf + 2048, 0, 256);
	rdma(a, IBV_WR_RDMA_READ, abuf + 2048, 256, (uintptr_t)bbuf + 4096, mw2->rkey);
	wc = wait_wc(acq);
	CHECK(wc.status == IBV_WC_SUCCESS);
	CHECK(!memcmp(abuf + 2048, bbuf + 4096, 256));
	OK("type 2 window: IBV_WR_BIND_MW, then an RDMA READ through its rkey");

	/* LOCAL_INV of another type 2 window. */
	struct ibv_mw *mw3 = ibv_alloc_mw(pd, IBV_MW_TYPE_2);
	CHECK(mw3);
	bind2(b, mw3, (uintptr_t)bbuf, 64, IBV_ACCESS_REMOTE_READ, bcq);
	struct ibv_send_wr inv = { .wr_id = 60, .opcode = IBV_WR_LOCAL_INV,
				   .send_flags = IBV_SEND_SIGNALED }, *bad;
	inv.invalidate_rkey = mw3->rkey;
	CHECK(!ibv_post_send(b, &inv, &bad));
	wc = wait_wc(bcq);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_LOCAL_INV && wc.wr_id == 60);
	OK("IBV_WR_LOCAL_INV invalidates a type 2 window");

	/* SEND with invalidate of mw2, then a READ through it fails. */
	struct ibv_sge rs = { (uintptr_t)bbuf + 6144, 64, bmr->lkey };
	struct ibv_recv_wr rw = { .wr_id = 70, .sg_list = &rs, .num_sge = 1 }, *rb;
	CHECK(!ibv_post_recv(b, &rw, &rb));
	struct ibv_sge ss = { (uintptr_t)abuf, 16, amr->lkey };
	struct ibv_send_wr sw = { .wr_id = 71, .sg_list = &ss, .num_sge = 1,
				  .opcode = IBV_WR_SEND_WITH_INV,
				  .send_flags = IBV_SEND_SIGNALED }, *sb;
	sw.invalidate_rkey = mw2->rkey;
	CHECK(!ibv_post_send(a, &sw, &sb));
	wc = wait_wc(acq);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_SEND);
	wc = wait_wc(bcq);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RECV && wc.wr_id == 70);
	CHECK(wc.wc_flags & IBV_WC_WITH_INV);
	CHECK(wc.invalidated_rkey == mw2->rkey);
	OK("SEND with invalidate: the receive completion names the invalidated rkey");
	rdma(a, IBV_WR_RDMA_READ, abuf + 2048, 256, (uintptr_t)bbuf + 4096, mw2->rkey);
	wc = wait_wc(acq);
	CHECK(wc.status == IBV_WC_REM_ACCESS_ERR);
	OK("a READ through the invalidated window is a remote access error");

	CHECK(!ibv_dealloc_mw(mw1) && !ibv_dealloc_mw(mw2) && !ibv_dealloc_mw(mw3));
	CHECK(!ibv_destroy_qp(a) && !ibv_destroy_qp(b));
	CHECK(!ibv_dereg_mr(bmr) && !ibv_dereg_mr(amr));
	printf("all memory window checks passed\n");
	return 0;
}
