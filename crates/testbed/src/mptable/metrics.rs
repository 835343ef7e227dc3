//! Figures from a flow's progress samples (Unix seconds, bytes done).

/// Bytes done at `t` (the last sample at or before it).
pub fn bytes_at(s: &[(f64, u64)], t: f64) -> u64 {
    let i = s.partition_point(|x| x.0 <= t);
    if i == 0 {
        0
    } else {
        s[i - 1].1
    }
}

/// Goodput over `[a, b)`, Gb/s.
pub fn rate(s: &[(f64, u64)], a: f64, b: f64) -> f64 {
    let bytes = bytes_at(s, b).saturating_sub(bytes_at(s, a));
    bytes as f64 * 8.0 / (b - a).max(1e-9) / 1e9
}

/// The longest time without progress that overlaps `[a, b)`; a pause that lasts past
/// the last sample counts up to `end` (when the flow stopped, or `b`).
pub fn longest_gap(s: &[(f64, u64)], a: f64, b: f64, end: f64) -> f64 {
    let mut gap: f64 = 0.0;
    for w in s.windows(2) {
        let (x, y) = (w[0], w[1]);
        if y.0 > a && x.0 < b && y.1 > x.1 {
            gap = gap.max(y.0 - x.0);
        }
    }
    if let Some(last) = s.last() {
        let stop = end.min(b);
        if last.0 < stop {
            gap = gap.max(stop - last.0);
        }
    }
    gap
}

/// Window over which "back to 90 %" is judged, and its step.
const WINDOW: f64 = 0.02;
const STEP: f64 = 0.005;

/// Seconds from `from` until a `WINDOW` of goodput first reaches `target` Gb/s (the
/// window's end), searching until `until`; `None` if it never does.
pub fn time_to(s: &[(f64, u64)], from: f64, until: f64, target: f64) -> Option<f64> {
    let mut t = from;
    while t + WINDOW <= until {
        if rate(s, t, t + WINDOW) >= target {
            return Some(t + WINDOW - from);
        }
        t += STEP;
    }
    None
}

/// The median and the largest of `v` (`None` if empty).
pub fn median_max(v: &[f64]) -> Option<(f64, f64)> {
    if v.is_empty() {
        return None;
    }
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    Some((v[v.len() / 2], v[v.len() - 1]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn samples() -> Vec<(f64, u64)> {
        // 1 Gb/s = 125 MB/s, a sample every 10 ms, with a pause from 1.00 to 1.20.
        let mut s = Vec::new();
        let mut bytes = 0;
        let mut t = 0.0;
        while t < 2.0 {
            if !(1.0..1.2).contains(&t) || t >= 1.195 {
                s.push((t, bytes));
            }
            if !(1.0..1.2).contains(&t) {
                bytes += 1_250_000;
            }
            t += 0.01;
        }
        s
    }

    #[test]
    fn gap_rate_and_recovery() {
        let s = samples();
        let g = longest_gap(&s, 0.9, 1.5, 2.0);
        assert!((g - 0.2).abs() < 0.011, "{g}");
        assert!(longest_gap(&s, 0.0, 0.5, 2.0) < 0.011);
        assert!((rate(&s, 0.1, 0.9) - 1.0).abs() < 0.02);
        assert!(rate(&s, 1.02, 1.18) < 1e-9);
        let back = time_to(&s, 1.0, 2.0, 0.9).unwrap();
        assert!((0.2..0.24).contains(&back), "{back}");
        assert_eq!(time_to(&s, 1.0, 1.15, 0.9), None);
        // A flow that stopped: the pause lasts to its end.
        let cut: Vec<_> = s.iter().copied().filter(|x| x.0 < 1.0).collect();
        assert!((longest_gap(&cut, 0.5, 2.0, 1.8) - 0.81).abs() < 0.02);
        assert_eq!(median_max(&[3.0, 1.0, 2.0]), Some((2.0, 3.0)));
    }
}
