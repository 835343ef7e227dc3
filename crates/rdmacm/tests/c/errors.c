/* Error paths of softhca's librdmacm, from C as a program sees them: each failure gives
 * the errno the kernel's rdma_cm gives, and nothing hangs. Run with SOFTHCA_ADDR=127.0.6.4
 * (the device's only GID). Prints "ALL OK" at the end. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <rdma/rdma_cma.h>
#include <rdma/rsocket.h>

#define CHECK(cond, ...)                                                        \
	do {                                                                    \
		if (!(cond)) {                                                  \
			printf("FAIL line %d: ", __LINE__);                     \
			printf(__VA_ARGS__);                                    \
			printf(" (errno %d %s)\n", errno, strerror(errno));     \
			exit(1);                                                \
		}                                                               \
	} while (0)

static struct sockaddr_in sin4(const char *ip, int port)
{
	struct sockaddr_in s;

	memset(&s, 0, sizeof(s));
	s.sin_family = AF_INET;
	s.sin_port = htons(port);
	inet_pton(AF_INET, ip, &s.sin_addr);
	return s;
}

/* The first IPv4 address of an up, non-loopback interface, if any. */
static int local_non_loopback(struct sockaddr_in *out)
{
	struct ifaddrs *list, *i;
	int found = 0;

	if (getifaddrs(&list))
		return 0;
	for (i = list; i && !found; i = i->ifa_next) {
		if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET ||
		    (i->ifa_flags & IFF_LOOPBACK) || !(i->ifa_flags & IFF_UP))
			continue;
		*out = *(struct sockaddr_in *)i->ifa_addr;
		out->sin_port = 0;
		found = 1;
	}
	freeifaddrs(list);
	return found;
}

int main(void)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *a, *b, *c, *s, *l;
	struct rdma_cm_event *ev;
	struct sockaddr_in addr;
	int n, r;

	CHECK(ch, "rdma_create_event_channel");
	CHECK(!rdma_create_id(ch, &a, NULL, RDMA_PS_TCP), "create a");
	CHECK(!rdma_create_id(ch, &b, NULL, RDMA_PS_TCP), "create b");
	CHECK(!rdma_create_id(ch, &c, NULL, RDMA_PS_TCP), "create c");

	struct ibv_context **devs = rdma_get_devices(&n);
	CHECK(devs && n == 1 && devs[0], "rdma_get_devices: %d", n);
	rdma_free_devices(devs);

	/* Not an address of this host. */
	addr = sin4("192.0.2.1", 0);
	r = rdma_bind_addr(a, (struct sockaddr *)&addr);
	CHECK(r == -1 && errno == EADDRNOTAVAIL, "bind to a foreign address: %d", r);
	/* An address of this host that is not a GID of the device (when the host has a
	 * non-loopback IPv4 address: the device serves only 127.0.6.4). */
	if (local_non_loopback(&addr)) {
		r = rdma_bind_addr(a, (struct sockaddr *)&addr);
		CHECK(r == -1 && errno == ENODEV, "bind to a non-GID local address: %d", r);
		printf("non-GID bind: ENODEV\n");
	}
	/* A loopback address binds like the wildcard (the kernel's cma_any_addr): to no
	 * device, whether or not it is a GID. */
	CHECK(!rdma_create_id(ch, &l, NULL, RDMA_PS_TCP), "create l");
	addr = sin4("127.0.6.9", 0);
	CHECK(!rdma_bind_addr(l, (struct sockaddr *)&addr), "bind to a loopback address");
	CHECK(!l->verbs, "a loopback bind names no device");
	CHECK(!rdma_destroy_id(l), "destroy l");
	/* Port in use, on the address and on the wildcard. */
	addr = sin4("127.0.6.4", 7000);
	CHECK(!rdma_bind_addr(a, (struct sockaddr *)&addr), "bind a");
	CHECK(ntohs(rdma_get_src_port(a)) == 7000, "src port");
	r = rdma_bind_addr(b, (struct sockaddr *)&addr);
	CHECK(r == -1 && errno == EADDRINUSE, "second bind: %d", r);
	addr = sin4("0.0.0.0", 7000);
	r = rdma_bind_addr(b, (struct sockaddr *)&addr);
	CHECK(r == -1 && errno == EADDRINUSE, "wildcard bind: %d", r);
	/* Ephemeral port. */
	addr = sin4("127.0.6.4", 0);
	CHECK(!rdma_bind_addr(b, (struct sockaddr *)&addr), "bind b ephemeral");
	CHECK(ntohs(rdma_get_src_port(b)) >= 32768, "ephemeral port %d",
	      ntohs(rdma_get_src_port(b)));
	CHECK(!rdma_listen(b, 1), "listen");

	/* Non-blocking channel: EAGAIN when empty. */
	CHECK(!fcntl(ch->fd, F_SETFL, fcntl(ch->fd, F_GETFL) | O_NONBLOCK), "O_NONBLOCK");
	r = rdma_get_cm_event(ch, &ev);
	CHECK(r == -1 && errno == EAGAIN, "empty non-blocking channel: %d", r);

	/* A destination with no route: the call fails, no event (the kernel's
	 * rdma_resolve_ip). One whose route leaves from an interface that is not a device
	 * GID: ADDR_ERROR -ENODEV (cma's addr_handler). */
	addr = sin4("192.0.2.1", 7471);
	CHECK(!fcntl(ch->fd, F_SETFL, fcntl(ch->fd, F_GETFL) & ~O_NONBLOCK), "blocking");
	r = rdma_resolve_addr(c, NULL, (struct sockaddr *)&addr, 2000);
	if (r) {
		CHECK(errno == ENETUNREACH, "resolve: %d", r);
		printf("resolve: ENETUNREACH\n");
	} else {
		CHECK(!rdma_get_cm_event(ch, &ev), "get event");
		CHECK(ev->event == RDMA_CM_EVENT_ADDR_ERROR && ev->status == -ENODEV,
		      "event %s status %d", rdma_event_str(ev->event), ev->status);
		printf("ADDR_ERROR status %d\n", ev->status);
		rdma_ack_cm_event(ev);
	}

	/* Connect before the route is resolved. */
	struct rdma_conn_param p;
	memset(&p, 0, sizeof(p));
	r = rdma_connect(c, &p);
	CHECK(r == -1 && errno == EINVAL, "early connect: %d", r);

	/* Synchronous id: the error comes back from the call itself. */
	CHECK(!rdma_create_id(NULL, &s, NULL, RDMA_PS_TCP), "create sync");
	r = rdma_resolve_addr(s, NULL, (struct sockaddr *)&addr, 2000);
	CHECK(r == -1 && (errno == ENODEV || errno == ENETUNREACH), "sync resolve: %d", r);
	CHECK(!rdma_destroy_id(s), "destroy sync");

	/* Options. */
	unsigned char tos = 32;
	CHECK(!rdma_set_option(c, RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, &tos, 1), "TOS");
	r = rdma_set_option(c, RDMA_OPTION_ID, 99, &tos, 1);
	CHECK(r == -1 && errno == ENOSYS, "unknown option: %d", r);

	/* Multicast: an id resolved to the group joins; the event carries what to send
	 * to the group with, and the join's context. */
	struct sockaddr_in grp = sin4("239.6.6.6", 0);
	r = rdma_join_multicast(b, (struct sockaddr *)&grp, NULL);
	CHECK(r == -1 && errno == EINVAL, "join on a listener: %d", r);
	r = rdma_join_multicast(a, (struct sockaddr *)&grp, NULL);
	CHECK(r == -1 && errno == EINVAL, "join on an id with no device: %d", r);
	rdma_destroy_id(a);
	CHECK(!rdma_create_id(ch, &a, NULL, RDMA_PS_UDP), "create a again");
	addr = sin4("127.0.6.4", 0);
	CHECK(!rdma_resolve_addr(a, (struct sockaddr *)&addr, (struct sockaddr *)&grp, 2000),
	      "resolve the group");
	CHECK(!rdma_get_cm_event(ch, &ev) && ev->event == RDMA_CM_EVENT_ADDR_RESOLVED,
	      "group resolved: %s %d", rdma_event_str(ev->event), ev->status);
	rdma_ack_cm_event(ev);
	r = rdma_leave_multicast(a, (struct sockaddr *)&grp);
	CHECK(r == -1 && errno == EADDRNOTAVAIL, "leave before join: %d", r);
	struct rdma_cm_join_mc_attr_ex mc = {
		.comp_mask = RDMA_CM_JOIN_MC_ATTR_ADDRESS,
		.addr = (struct sockaddr *)&grp,
	};
	r = rdma_join_multicast_ex(a, &mc, NULL);
	CHECK(r == -1 && errno == EINVAL, "join_ex without flags: %d", r);
	struct sockaddr_in6 grp6 = { .sin6_family = AF_INET6,
				     .sin6_addr = { .s6_addr = { 0xff, 0x0e, [15] = 1 } } };
	r = rdma_join_multicast(a, (struct sockaddr *)&grp6, NULL);
	CHECK(r == -1 && errno == EOPNOTSUPP, "IPv6 group: %d", r);
	CHECK(!rdma_join_multicast(a, (struct sockaddr *)&grp, &grp), "join");
	CHECK(!rdma_get_cm_event(ch, &ev), "join event");
	CHECK(ev->event == RDMA_CM_EVENT_MULTICAST_JOIN && ev->status == 0 &&
		      ev->id == a, "join event: %s %d", rdma_event_str(ev->event), ev->status);
	CHECK(ev->param.ud.qp_num == 0xffffff && ev->param.ud.qkey == 0x01234567 &&
		      ev->param.ud.private_data == (void *)&grp, "join event parameters");
	static const unsigned char mgid[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff,
					       239, 6, 6, 6};
	CHECK(ev->param.ud.ah_attr.is_global &&
		      !memcmp(ev->param.ud.ah_attr.grh.dgid.raw, mgid, 16), "join event MGID");
	rdma_ack_cm_event(ev);
	CHECK(!rdma_leave_multicast(a, (struct sockaddr *)&grp), "leave");
	r = rdma_leave_multicast(a, (struct sockaddr *)&grp);
	CHECK(r == -1 && errno == EADDRNOTAVAIL, "leave twice: %d", r);

	/* Not supported: rsockets. */
	r = rsocket(AF_INET, SOCK_STREAM, 0);
	CHECK(r == -1 && errno == ENOSYS, "rsocket: %d", r);
	CHECK(!strcmp(rdma_event_str(RDMA_CM_EVENT_TIMEWAIT_EXIT),
		      "RDMA_CM_EVENT_TIMEWAIT_EXIT"), "event_str");

	/* The channel stays while ids use it. */
	rdma_destroy_event_channel(ch);
	CHECK(fcntl(ch->fd, F_GETFD) >= 0, "channel fd closed under its ids");

	CHECK(!rdma_destroy_id(a) && !rdma_destroy_id(b) && !rdma_destroy_id(c), "destroy");
	rdma_destroy_event_channel(ch);
	printf("ALL OK\n");
	return 0;
}
