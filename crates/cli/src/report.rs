//! perftest-like tables of perf results.

use std::io::Write;

use softhca_perf::{Mode, PerfResult};

const RULE: &str =
    "---------------------------------------------------------------------------------------";

/// Prints one result the way perftest does (header, column titles, one row).
pub fn print_table(
    out: &mut impl Write,
    r: &PerfResult,
    extra: &[(&str, String)],
) -> std::io::Result<()> {
    writeln!(out, "{RULE}")?;
    writeln!(out, "{:>40}", r.title())?;
    writeln!(
        out,
        " Number of qps   : {:<8} Transport type : RoCEv2 (softhca)",
        r.qps
    )?;
    for (k, v) in extra {
        writeln!(out, " {k:<16}: {v}")?;
    }
    writeln!(
        out,
        " Data verified   : {}",
        match r.verified {
            Some(true) => "yes (every byte)",
            Some(false) => "FAILED",
            None => "no (use --verify)",
        }
    )?;
    writeln!(out, "{RULE}")?;
    match (r.mode, r.lat) {
        (Mode::Lat, Some(l)) => {
            writeln!(
                out,
                " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec]"
            )?;
            writeln!(
                out,
                " {:<6} {:<10}     {:<10.2}     {:<10.2}   {:<10.2}         {:<10.2}     {:<10.2}      {:<10.2}             {:<10.2}",
                r.size, r.iters, l.min, l.max, l.p50, l.avg, l.stdev, l.p99, l.p999
            )?;
        }
        _ => {
            writeln!(
                out,
                " #bytes     #iterations    BW average[Gb/sec]   MsgRate[Mpps]"
            )?;
            writeln!(
                out,
                " {:<10} {:<10}     {:<10.2}           {:<10.6}",
                r.size,
                r.iters,
                r.gbps(),
                r.mpps()
            )?;
        }
    }
    writeln!(out, "{RULE}")
}

/// Prints `perf all`'s summary: one row per test.
pub fn print_summary(out: &mut impl Write, rs: &[PerfResult]) -> std::io::Result<()> {
    writeln!(out, "{RULE}")?;
    writeln!(
        out,
        " {:<7} {:<4} {:>8} {:>7} {:>10} {:>9} {:>9} {:>9} {:>9}  verified",
        "op", "mode", "#bytes", "#iters", "Gb/s", "Mpps", "p50[us]", "p99[us]", "avg[us]",
    )?;
    writeln!(out, "{RULE}")?;
    for r in rs {
        let (p50, p99, avg) = match r.lat {
            Some(l) => (
                format!("{:.2}", l.p50),
                format!("{:.2}", l.p99),
                format!("{:.2}", l.avg),
            ),
            None => ("-".into(), "-".into(), "-".into()),
        };
        writeln!(
            out,
            " {:<7} {:<4} {:>8} {:>7} {:>10.2} {:>9.4} {:>9} {:>9} {:>9}  {}",
            r.op,
            r.mode.as_str(),
            r.size,
            r.iters,
            r.gbps(),
            r.mpps(),
            p50,
            p99,
            avg,
            match r.verified {
                Some(true) => "yes",
                Some(false) => "FAILED",
                None => "-",
            }
        )?;
    }
    writeln!(out, "{RULE}")
}
