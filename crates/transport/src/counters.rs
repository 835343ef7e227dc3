//! Protocol counters, named like the rxe hardware counters (`rdma statistic`).

macro_rules! counters {
    ($($(#[$doc:meta])* $name:ident),* $(,)?) => {
        /// Engine counters. Names follow rxe's `rxe_hw_counters.c` where rxe has one.
        #[derive(Debug, Clone, Default, PartialEq, Eq)]
        pub struct Counters {
            $($(#[$doc])* pub $name: u64,)*
        }

        impl Counters {
            /// Every counter as `(name, value)`.
            pub fn iter(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
                [$((stringify!($name), self.$name)),*].into_iter()
            }
        }
    };
}

counters! {
    /// Packets sent.
    sent_pkts,
    /// Packets received and accepted by a QP.
    rcvd_pkts,
    /// Duplicate requests received.
    duplicate_request,
    /// Out-of-sequence requests received.
    out_of_seq_request,
    /// Out-of-sequence requests kept for later (reordering) instead of dropped.
    ooo_buffered,
    /// Kept out-of-sequence requests executed once the gap before them filled.
    ooo_placed,
    /// Packets not sent again going back N because the responder's SACK said it held
    /// them (selective repeat on one path between softhca devices).
    held_skipped,
    /// Packets received straight into registered memory and executed there.
    rx_direct,
    /// Bundles received (several packets in one datagram, see `softhca_wire::bundle`).
    rx_bundles,
    /// PSN sequence error NAKs received.
    rcvd_seq_err,
    /// PSN sequence error NAKs sent.
    seq_err_naks,
    /// RNR NAKs received.
    rcvd_rnr_err,
    /// RNR NAKs sent.
    send_rnr_err,
    /// ACKs coalesced (not sent for a packet that could have had one).
    ack_deferred,
    /// Transport retry count exceeded.
    retry_exceeded_err,
    /// RNR retry count exceeded.
    retry_rnr_exceeded_err,
    /// Retransmissions started by the completer.
    completer_retry_err,
    /// Local ACK timeouts.
    local_ack_timeout_err,
    /// READs re-requested alone (after a timeout, a silence or a hole in their
    /// responses) instead of going back N (a responder replays every READ asked again).
    read_probe,
    /// Resends asked for (a READ asked again, a sequence NAK) that proved needless: the
    /// late first copy arrived, then the resent one (each widens the reordering window).
    reorder_spurious,
    /// Resends after the responder fell silent during a retransmission (the
    /// retransmission or its answer was lost too).
    quiet_resend,
    /// Tail-loss probes: the last request packet sent again after two round trips of
    /// silence with nothing else to send (RFC 8985 7), to draw an ACK or a sequence NAK
    /// instead of waiting for the retransmit timeout.
    tail_probe,
    /// RNR NAK retries.
    rnr_nak_retry_err,
    /// Remote access error NAKs received.
    rcvd_remote_access_err_naks,
    /// Invalid request NAKs received.
    rcvd_invalid_request_naks,
    /// Remote operational error NAKs received.
    rcvd_remote_op_err_naks,
    /// Remote access error NAKs sent.
    sent_remote_access_err_naks,
    /// Invalid request NAKs sent.
    sent_invalid_request_naks,
    /// Dropped: ICRC mismatch.
    drop_bad_icrc,
    /// ICRC matched only after solving for a peer's unseen IPv4 ID (first contact, resync).
    icrc_ipv4_id_resync,
    /// ICRC matched with another IPv4 ID than the predicted one (a second check).
    icrc_ipv4_id_mispredicted,
    /// Dropped: header did not parse.
    drop_malformed,
    /// Dropped: no such QP.
    drop_unknown_qpn,
    /// Dropped: P_Key not in the partition.
    drop_bad_pkey,
    /// Dropped: Q_Key mismatch.
    drop_bad_qkey,
    /// Dropped: source is not the connected peer.
    drop_wrong_peer,
    /// Dropped: QP state does not accept packets.
    drop_bad_state,
    /// Dropped: opcode not valid for the QP type or sequence.
    drop_bad_opcode,
    /// Dropped: a READ/atomic beyond max_dest_rd_atomic responses still queued (flood).
    drop_rd_atomic_overflow,
    /// Congestion control: windows cut for a round trip over the delay target.
    cc_delay_decrease,
    /// Congestion control: windows cut for a loss (sequence NAK, response gap).
    cc_loss_decrease,
    /// Congestion control: windows reset by a retransmit timeout.
    cc_timeout,
    /// Congestion control: base probes (the window held at its least for two round
    /// trips so that the queue drains and the base round trip is measured again).
    cc_base_probe,
    /// Congestion control: times a requester waited for its window.
    cc_window_limited,
    /// Congestion control: times a requester waited for its pacer.
    cc_pacing_wait,
    /// Congestion control: READ response rate cuts (a READ asked again).
    cc_response_rate_cut,
    /// Multipath: negotiation MADs sent.
    mp_hello_sent,
    /// Multipath: QPs whose peer speaks the extension.
    mp_negotiated,
    /// Multipath: QPs that stayed plain RC (the peer said no or never answered).
    mp_fallback,
    /// Multipath: SACKs sent.
    mp_sack_sent,
    /// Multipath: SACKs received.
    mp_sack_rcvd,
    /// Multipath: packets found lost by the scoreboard.
    mp_lost,
    /// Multipath: packets resent selectively.
    mp_resent,
    /// Multipath: paths failed.
    mp_path_failed,
    /// Multipath: times a path went silent while others delivered (its packets moved).
    mp_path_silent,
    /// Multipath: failed paths readmitted.
    mp_path_readmitted,
    /// Multipath: path probes sent.
    mp_probe_sent,
    /// Multipath: path probes of the peer answered.
    mp_probe_answered,
}
