//! The datapath's I/O counters ([`Stats`]).

use std::sync::atomic::{AtomicU64, Ordering};

/// I/O counters of the datapath, updated once per batch.
#[derive(Debug, Default)]
pub(crate) struct Stats {
    pub rx_datagrams: AtomicU64,
    pub rx_packets: AtomicU64,
    pub rx_batches: AtomicU64,
    pub rx_gro_datagrams: AtomicU64,
    pub rx_truncated: AtomicU64,
    /// Datagrams received directly without a peek, as guessed, and those that turned
    /// out of another shape (see `datapath::direct`).
    pub rx_direct_guessed: AtomicU64,
    pub rx_direct_guess_missed: AtomicU64,
    pub rx_errors: AtomicU64,
    pub tx_transmits: AtomicU64,
    pub tx_batches: AtomicU64,
    pub tx_errors: AtomicU64,
    /// Sends refused for an earlier datagram's ICMP error (port or host unreachable)
    /// and made again.
    pub tx_refused: AtomicU64,
    pub tx_no_socket: AtomicU64,
    /// Packets dropped by fault injection ([`crate::Config::tx_drop_ppm`]).
    pub tx_injected_drops: AtomicU64,
    pub tx_would_block: AtomicU64,
    /// Transmits sent through a socket connected to their peer (see `datapath::senders`).
    pub tx_connected: AtomicU64,
    /// Connected sockets set up (each learns its IPv4 ID counter), and failed ones
    /// (not set up, or a send failed: the peer uses the device socket for a while).
    pub tx_connected_opened: AtomicU64,
    pub tx_connected_failed: AtomicU64,
    /// Bundles sent (several packets in one datagram, see `datapath::bundle`), and the
    /// transmits that went in them.
    pub tx_bundles: AtomicU64,
    pub tx_bundled_transmits: AtomicU64,
    /// Steps whose packets were held for the polling application's answer.
    pub tx_held: AtomicU64,
    /// Steps whose ACKs were held for the answer of an application served while it
    /// spins on memory (see `datapath::takeover`).
    pub tx_serve_held: AtomicU64,
    /// Posts whose UC WRITE completions were held for the peer's answer while the
    /// application is served (see `LockedEngine::hold_sends`).
    pub tx_sends_held: AtomicU64,
    /// Posts whose transmits waited for the application's next call: kept back to be
    /// filled by the next post, or not built yet within a burst.
    pub tx_deferred: AtomicU64,
    /// Steps that left the trailing ACKs of their last datagram for the next step, to
    /// hand the polling application its completion first.
    pub rx_acks_deferred: AtomicU64,
    /// Application polling windows that ended with packets waiting in the sockets, and
    /// periods in which the datapath thread served an application that waits without
    /// polling (see `datapath::takeover`).
    pub app_strandings: AtomicU64,
    pub app_served: AtomicU64,
    pub loop_iterations: AtomicU64,
    pub sleeps: AtomicU64,
    pub doorbells: AtomicU64,
    pub cq_overflows: AtomicU64,
    pub completions_no_cq: AtomicU64,
}

impl Stats {
    pub(crate) fn add(c: &AtomicU64, n: u64) {
        if n != 0 {
            c.fetch_add(n, Ordering::Relaxed);
        }
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        let r = |c: &AtomicU64| c.load(Ordering::Relaxed);
        [
            ("io_rx_datagrams", r(&self.rx_datagrams)),
            ("io_rx_packets", r(&self.rx_packets)),
            ("io_rx_batches", r(&self.rx_batches)),
            ("io_rx_gro_datagrams", r(&self.rx_gro_datagrams)),
            ("io_rx_truncated", r(&self.rx_truncated)),
            ("io_rx_errors", r(&self.rx_errors)),
            ("io_tx_transmits", r(&self.tx_transmits)),
            ("io_tx_batches", r(&self.tx_batches)),
            ("io_tx_errors", r(&self.tx_errors)),
            ("io_tx_refused", r(&self.tx_refused)),
            ("io_tx_no_socket", r(&self.tx_no_socket)),
            ("io_tx_injected_drops", r(&self.tx_injected_drops)),
            ("io_tx_would_block", r(&self.tx_would_block)),
            ("io_tx_connected", r(&self.tx_connected)),
            ("io_tx_connected_opened", r(&self.tx_connected_opened)),
            ("io_tx_connected_failed", r(&self.tx_connected_failed)),
            ("io_tx_bundles", r(&self.tx_bundles)),
            ("io_tx_bundled_transmits", r(&self.tx_bundled_transmits)),
            ("dp_rx_direct_guessed", r(&self.rx_direct_guessed)),
            ("dp_rx_direct_guess_missed", r(&self.rx_direct_guess_missed)),
            ("dp_tx_held", r(&self.tx_held)),
            ("dp_tx_serve_held", r(&self.tx_serve_held)),
            ("dp_tx_sends_held", r(&self.tx_sends_held)),
            ("dp_tx_deferred", r(&self.tx_deferred)),
            ("dp_rx_acks_deferred", r(&self.rx_acks_deferred)),
            ("dp_app_strandings", r(&self.app_strandings)),
            ("dp_app_served", r(&self.app_served)),
            ("dp_loop_iterations", r(&self.loop_iterations)),
            ("dp_sleeps", r(&self.sleeps)),
            ("dp_doorbells", r(&self.doorbells)),
            ("cq_overflows", r(&self.cq_overflows)),
            ("completions_no_cq", r(&self.completions_no_cq)),
        ]
        .into_iter()
    }
}
