/* Memory windows across two devices, for interop with kernel rxe: an "owner" binds a
 * type 2 window (IBV_WR_BIND_MW) over part of its buffer and hands the window's rkey to
 * a "user" over TCP; the user RDMA WRITEs a pattern through it, READs it back, then
 * sends a SEND with invalidate naming the rkey. The owner checks that the bytes landed,
 * that its receive completion carries IBV_WC_WITH_INV and the rkey, and tells the user,
 * whose next READ through the window must fail with IBV_WC_REM_ACCESS_ERR.
 *
 *   mw_peer owner <gid index> <tcp port>
 *   mw_peer user  <gid index> <owner ip> <tcp port>
 */
#include <arpa/inet.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define CHECK(x)                                                                  \
	do {                                                                      \
		if (!(x)) {                                                       \
			fprintf(stderr, "%s:%d: %s failed (errno %d)\n", __FILE__,  \
				__LINE__, #x, errno);                             \
			exit(1);                                                  \
		}                                                                 \
	} while (0)

#define LEN 4096
#define WIN_OFF 4096

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static struct ibv_cq *cq;
static struct ibv_qp *qp;
static struct ibv_mr *mr;
static char buf[3 * LEN];
static int gid_index;

static void setup(int owner)
{
	int n;
	struct ibv_device **list = ibv_get_device_list(&n);
	CHECK(list && n > 0);
	ctx = ibv_open_device(list[0]);
	CHECK(ctx);
	pd = ibv_alloc_pd(ctx);
	CHECK(pd);
	mr = ibv_reg_mr(pd, buf, sizeof buf,
			IBV_ACCESS_LOCAL_WRITE | (owner ? IBV_ACCESS_MW_BIND : 0));
	CHECK(mr);
	cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	CHECK(cq);
	struct ibv_qp_init_attr ia = {
		.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1,
			 .max_recv_sge = 1 },
	};
	qp = ibv_create_qp(pd, &ia);
	CHECK(qp);
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1,
				 .qp_access_flags = IBV_ACCESS_REMOTE_WRITE |
						    IBV_ACCESS_REMOTE_READ };
	CHECK(!ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
					 IBV_QP_ACCESS_FLAGS));
}

static void connect_qp(uint32_t dqpn, uint32_t dpsn, union ibv_gid *dgid)
{
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_1024, .dest_qp_num = dqpn,
		.rq_psn = dpsn, .max_dest_rd_atomic = 4, .min_rnr_timer = 12,
		.ah_attr = { .is_global = 1, .port_num = 1,
			     .grh = { .dgid = *dgid, .sgid_index = gid_index,
				      .hop_limit = 64 } },
	};
	CHECK(!ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
					 IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
					 IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.sq_psn = qp->qp_num & 0xffffff;
	a.max_rd_atomic = 4;
	CHECK(!ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
					 IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
					 IBV_QP_MAX_QP_RD_ATOMIC));
}

static struct ibv_wc wait_wc(void)
{
	struct ibv_wc wc;
	for (long spins = 0; spins < 2000000000L; spins++) {
		int n = ibv_poll_cq(cq, 1, &wc);
		CHECK(n >= 0);
		if (n == 1)
			return wc;
		if ((spins & 0xfff) == 0)
			usleep(100);
	}
	fprintf(stderr, "no completion\n");
	exit(1);
}

static void gid_hex(union ibv_gid *g, char *out)
{
	for (int i = 0; i < 16; i++)
		sprintf(out + 2 * i, "%02x", g->raw[i]);
}

static void hex_gid(const char *in, union ibv_gid *g)
{
	for (int i = 0; i < 16; i++) {
		unsigned v;
		CHECK(sscanf(in + 2 * i, "%2x", &v) == 1);
		g->raw[i] = (uint8_t)v;
	}
}

static void send_line(int fd, const char *s)
{
	CHECK(write(fd, s, strlen(s)) == (ssize_t)strlen(s));
}

static void read_line(int fd, char *out, size_t cap)
{
	size_t n = 0;
	while (n + 1 < cap) {
		char c;
		CHECK(read(fd, &c, 1) == 1);
		if (c == '\n')
			break;
		out[n++] = c;
	}
	out[n] = 0;
}

static char pattern(int i)
{
	return (char)(i * 13 + 7);
}

static void rdma(enum ibv_wr_opcode op, char *local, uint64_t raddr, uint32_t rkey)
{
	struct ibv_sge sge = { (uintptr_t)local, LEN, mr->lkey };
	struct ibv_send_wr wr = { .wr_id = op, .sg_list = &sge, .num_sge = 1, .opcode = op,
				  .send_flags = IBV_SEND_SIGNALED }, *bad;
	wr.wr.rdma.remote_addr = raddr;
	wr.wr.rdma.rkey = rkey;
	CHECK(!ibv_post_send(qp, &wr, &bad));
}

static int owner(int port)
{
	setup(1);
	int ls = socket(AF_INET, SOCK_STREAM, 0), one = 1;
	CHECK(ls >= 0);
	setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(port) };
	CHECK(!bind(ls, (struct sockaddr *)&sa, sizeof sa) && !listen(ls, 1));
	int fd = accept(ls, NULL, NULL);
	CHECK(fd >= 0);
	char line[256], gh[33];
	unsigned dqpn, dpsn;
	union ibv_gid dgid, mygid;
	read_line(fd, line, sizeof line);
	CHECK(sscanf(line, "%x %x %32s", &dqpn, &dpsn, gh) == 3);
	hex_gid(gh, &dgid);
	connect_qp(dqpn, dpsn, &dgid);

	/* The receive for the peer's SEND with invalidate, then the window. */
	struct ibv_sge rs = { (uintptr_t)buf, 64, mr->lkey };
	struct ibv_recv_wr rw = { .wr_id = 9, .sg_list = &rs, .num_sge = 1 }, *rb;
	CHECK(!ibv_post_recv(qp, &rw, &rb));
	struct ibv_mw *mw = ibv_alloc_mw(pd, IBV_MW_TYPE_2);
	CHECK(mw);
	uint32_t rkey = ibv_inc_rkey(mw->rkey);
	struct ibv_send_wr bw = { .wr_id = 8, .opcode = IBV_WR_BIND_MW,
				  .send_flags = IBV_SEND_SIGNALED }, *bb;
	bw.bind_mw.mw = mw;
	bw.bind_mw.rkey = rkey;
	bw.bind_mw.bind_info = (struct ibv_mw_bind_info){
		.mr = mr, .addr = (uintptr_t)buf + WIN_OFF, .length = LEN,
		.mw_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ };
	CHECK(!ibv_post_send(qp, &bw, &bb));
	struct ibv_wc wc = wait_wc();
	CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_BIND_MW);
	mw->rkey = rkey;
	CHECK(!ibv_query_gid(ctx, 1, gid_index, &mygid));
	gid_hex(&mygid, gh);
	snprintf(line, sizeof line, "%x %x %s %x %llx\n", qp->qp_num, qp->qp_num & 0xffffff,
		 gh, rkey, (unsigned long long)(uintptr_t)buf + WIN_OFF);
	send_line(fd, line);
	printf("owner: window bound, rkey %#x\n", rkey);
	fflush(stdout);

	wc = wait_wc();
	CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RECV);
	printf("owner: receive wc_flags %#x, invalidated rkey %#x\n", wc.wc_flags,
	       wc.invalidated_rkey);
	/* Kernel rxe (6.1) writes the kernel's IB_WC_WITH_INVALIDATE (1 << 2) into the
	 * user CQ, which libibverbs reads as IBV_WC_IP_CSUM_OK; softhca sets
	 * IBV_WC_WITH_INV (1 << 3). The user's READ below proves the invalidation. */
	CHECK(wc.wc_flags & (IBV_WC_WITH_INV | IBV_WC_IP_CSUM_OK));
	CHECK(wc.invalidated_rkey == rkey);
	for (int i = 0; i < LEN; i++)
		CHECK(buf[WIN_OFF + i] == pattern(i));
	printf("owner: data landed through the window; invalidated by the peer's SEND\n");
	fflush(stdout);
	send_line(fd, "done\n");
	read_line(fd, line, sizeof line);
	CHECK(!strcmp(line, "bye"));
	printf("owner: ok\n");
	return 0;
}

static int user(const char *host, int port)
{
	setup(0);
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	CHECK(fd >= 0);
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(port) };
	CHECK(inet_pton(AF_INET, host, &sa.sin_addr) == 1);
	int tries = 0;
	while (connect(fd, (struct sockaddr *)&sa, sizeof sa)) {
		CHECK(++tries < 60);
		sleep(1);
		close(fd);
		fd = socket(AF_INET, SOCK_STREAM, 0);
	}
	union ibv_gid mygid, dgid;
	char gh[33], line[256];
	CHECK(!ibv_query_gid(ctx, 1, gid_index, &mygid));
	gid_hex(&mygid, gh);
	snprintf(line, sizeof line, "%x %x %s\n", qp->qp_num, qp->qp_num & 0xffffff, gh);
	send_line(fd, line);
	unsigned dqpn, dpsn, rkey;
	unsigned long long addr;
	read_line(fd, line, sizeof line);
	CHECK(sscanf(line, "%x %x %32s %x %llx", &dqpn, &dpsn, gh, &rkey, &addr) == 5);
	hex_gid(gh, &dgid);
	connect_qp(dqpn, dpsn, &dgid);

	for (int i = 0; i < LEN; i++)
		buf[i] = pattern(i);
	rdma(IBV_WR_RDMA_WRITE, buf, addr, rkey);
	struct ibv_wc wc = wait_wc();
	CHECK(wc.status == IBV_WC_SUCCESS);
	memset(buf + LEN, 0, LEN);
	rdma(IBV_WR_RDMA_READ, buf + LEN, addr, rkey);
	wc = wait_wc();
	CHECK(wc.status == IBV_WC_SUCCESS);
	CHECK(!memcmp(buf, buf + LEN, LEN));
	printf("user: WRITE and READ through the window (rkey %#x) match\n", rkey);
	fflush(stdout);

	struct ibv_sge ss = { (uintptr_t)buf, 16, mr->lkey };
	struct ibv_send_wr sw = { .wr_id = 5, .sg_list = &ss, .num_sge = 1,
				  .opcode = IBV_WR_SEND_WITH_INV,
				  .send_flags = IBV_SEND_SIGNALED }, *sb;
	sw.invalidate_rkey = rkey;
	CHECK(!ibv_post_send(qp, &sw, &sb));
	wc = wait_wc();
	CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_SEND);
	read_line(fd, line, sizeof line);
	CHECK(!strcmp(line, "done"));
	rdma(IBV_WR_RDMA_READ, buf + LEN, addr, rkey);
	wc = wait_wc();
	printf("user: READ after invalidation: %s\n", ibv_wc_status_str(wc.status));
	CHECK(wc.status == IBV_WC_REM_ACCESS_ERR);
	send_line(fd, "bye\n");
	printf("user: ok\n");
	return 0;
}

int main(int argc, char **argv)
{
	if (argc == 4 && !strcmp(argv[1], "owner")) {
		gid_index = atoi(argv[2]);
		return owner(atoi(argv[3]));
	}
	if (argc == 5 && !strcmp(argv[1], "user")) {
		gid_index = atoi(argv[2]);
		return user(argv[3], atoi(argv[4]));
	}
	fprintf(stderr, "usage: mw_peer owner <gid index> <port> | user <gid index> <ip> <port>\n");
	return 2;
}
