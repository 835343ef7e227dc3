/* The parts of the libibverbs C API that <infiniband/verbs.h> defines as static inline
 * functions (they dispatch through the context's ops tables): compiled against the system
 * header so that librdmacm calls them exactly as any C program does. */
#include <errno.h>
#include <string.h>
#include <infiniband/verbs.h>

struct ibv_qp *softhca_rdmacm_create_qp_ex(struct ibv_context *ctx,
					   struct ibv_qp_init_attr_ex *attr)
{
	return ibv_create_qp_ex(ctx, attr);
}

struct ibv_srq *softhca_rdmacm_create_srq_ex(struct ibv_context *ctx,
					     struct ibv_srq_init_attr_ex *attr)
{
	return ibv_create_srq_ex(ctx, attr);
}

int softhca_rdmacm_query_port(struct ibv_context *ctx, uint8_t port,
			      struct ibv_port_attr *attr)
{
	return ibv_query_port(ctx, port, attr);
}

int softhca_rdmacm_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc)
{
	return ibv_poll_cq(cq, n, wc);
}

int softhca_rdmacm_req_notify_cq(struct ibv_cq *cq, int solicited)
{
	return ibv_req_notify_cq(cq, solicited);
}

/* One receive of `len` bytes at `addr`. */
int softhca_rdmacm_post_recv1(struct ibv_qp *qp, uint64_t wr_id, void *addr,
			      uint32_t len, uint32_t lkey)
{
	struct ibv_sge sge = { .addr = (uintptr_t)addr, .length = len, .lkey = lkey };
	struct ibv_recv_wr wr = { .wr_id = wr_id, .sg_list = &sge, .num_sge = 1 };
	struct ibv_recv_wr *bad;

	return ibv_post_recv(qp, &wr, &bad);
}

/* One signalled UD SEND of `len` bytes at `addr` to (ah, qpn, qkey). */
int softhca_rdmacm_post_ud_send(struct ibv_qp *qp, uint64_t wr_id, struct ibv_ah *ah,
				uint32_t qpn, uint32_t qkey, void *addr, uint32_t len,
				uint32_t lkey)
{
	struct ibv_sge sge = { .addr = (uintptr_t)addr, .length = len, .lkey = lkey };
	struct ibv_send_wr wr, *bad;

	memset(&wr, 0, sizeof(wr));
	wr.wr_id = wr_id;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.opcode = IBV_WR_SEND;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.wr.ud.ah = ah;
	wr.wr.ud.remote_qpn = qpn;
	wr.wr.ud.remote_qkey = qkey;
	return ibv_post_send(qp, &wr, &bad);
}
