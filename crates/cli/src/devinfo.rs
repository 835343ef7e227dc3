//! `softhca devinfo`: the device the way `ibv_devinfo` shows an rxe device.

use std::io::Write;

use softhca::{Context, Gid, Mtu};

use crate::args::DevinfoArgs;
use crate::error::CliError;

fn guid(v: u64) -> String {
    softhca::guid_text(v)
}

/// A GID in the colon form `ibv_devinfo -v` uses, then the IP address it stands for.
fn gid_text(g: &Gid) -> String {
    format!("{}, RoCE v2, {}", softhca::gid_words(g), g.to_ip())
}

fn mtu(m: Mtu) -> String {
    format!("{} ({})", m.bytes(), m as u32)
}

/// Prints the device; `-v` adds every attribute and counter.
pub fn run(a: &DevinfoArgs) -> Result<(), CliError> {
    let ctx = Context::open_default().map_err(CliError::verbs("cannot open device"))?;
    let mut out = std::io::stdout().lock();
    print(&mut out, &ctx, a.verbose)?;
    Ok(())
}

fn print(out: &mut impl Write, ctx: &Context, verbose: bool) -> Result<(), CliError> {
    let dev = ctx.query_device();
    let port = ctx.query_port(1).map_err(CliError::verbs("query_port"))?;
    writeln!(out, "hca_id:\t{}", ctx.name())?;
    writeln!(out, "\ttransport:\t\t\tInfiniBand (0)")?;
    writeln!(out, "\tfw_ver:\t\t\t\t{}", dev.fw_ver)?;
    writeln!(out, "\tnode_guid:\t\t\t{}", guid(dev.node_guid))?;
    writeln!(out, "\tsys_image_guid:\t\t\t{}", guid(dev.sys_image_guid))?;
    writeln!(out, "\tvendor_id:\t\t\t{:#x}", dev.vendor_id)?;
    writeln!(out, "\tvendor_part_id:\t\t\t{}", dev.vendor_part_id)?;
    writeln!(out, "\thw_ver:\t\t\t\t{:#x}", dev.hw_ver)?;
    writeln!(out, "\tphys_port_cnt:\t\t\t{}", dev.phys_port_cnt)?;
    if verbose {
        writeln!(out, "\tdevice attributes:")?;
        for line in format!("{dev:#?}").lines().skip(1) {
            let l = line.trim().trim_end_matches(',');
            if l.is_empty() || l == "}" {
                continue;
            }
            if let Some((k, v)) = l.split_once(": ") {
                writeln!(out, "\t\t{:<24}{v}", format!("{k}:"))?;
            }
        }
    }
    writeln!(out, "\t\tport:\t1")?;
    writeln!(
        out,
        "\t\t\tstate:\t\t\t{}",
        port_state(&format!("{:?}", port.state))
    )?;
    writeln!(out, "\t\t\tmax_mtu:\t\t{}", mtu(port.max_mtu))?;
    writeln!(out, "\t\t\tactive_mtu:\t\t{}", mtu(port.active_mtu))?;
    writeln!(out, "\t\t\tsm_lid:\t\t\t0")?;
    writeln!(out, "\t\t\tport_lid:\t\t0")?;
    writeln!(out, "\t\t\tport_lmc:\t\t0x00")?;
    writeln!(out, "\t\t\tlink_layer:\t\tEthernet")?;
    if verbose {
        for line in format!("{port:#?}").lines().skip(1) {
            let l = line.trim().trim_end_matches(',');
            match l.split_once(": ") {
                // Already printed above in ibv_devinfo's form.
                Some((
                    "state" | "max_mtu" | "active_mtu" | "sm_lid" | "lid" | "lmc" | "link_layer",
                    _,
                )) => {}
                Some((k, v)) => writeln!(out, "\t\t\t{:<24}{v}", format!("{k}:"))?,
                None => {}
            }
        }
    }
    for (i, g) in ctx.gids().iter().enumerate() {
        writeln!(out, "\t\t\tGID[{i:>3}]:\t\t{}", gid_text(g))?;
    }
    if verbose {
        let (gso, gro) = ctx.io_capabilities();
        writeln!(out, "\tio:\t\t\t\tUDP GSO {}, GRO {}", on(gso), on(gro))?;
        let cpu = ctx
            .placement()
            .map_or("not pinned".to_string(), |p| p.to_string());
        writeln!(out, "\tdatapath_cpu:\t\t\t{cpu}")?;
        writeln!(out, "\tcounters:")?;
        for (name, v) in ctx.counters() {
            writeln!(out, "\t\t{:<32}{v}", format!("{name}:"))?;
        }
        writeln!(out, "\tcongestion control per QP:")?;
        for (qpn, cc) in ctx.congestion() {
            writeln!(out, "\t\tqp {:#08x}:\t{cc}", qpn.value())?;
        }
        writeln!(out, "\tmultipath per QP:")?;
        for (qpn, mp) in ctx.multipath() {
            let text = mp.to_string().replace('\n', "\n\t\t");
            writeln!(out, "\t\tqp {:#08x}:\t{text}", qpn.value())?;
        }
    }
    Ok(())
}

fn on(b: bool) -> &'static str {
    if b {
        "on"
    } else {
        "off"
    }
}

/// `PORT_ACTIVE (4)` and friends from the state's name.
fn port_state(debug: &str) -> String {
    let (name, num) = match debug.to_ascii_lowercase().as_str() {
        "nop" => ("PORT_NOP", 0),
        "down" => ("PORT_DOWN", 1),
        "init" => ("PORT_INIT", 2),
        "armed" => ("PORT_ARMED", 3),
        "active" => ("PORT_ACTIVE", 4),
        "activedefer" | "active_defer" => ("PORT_ACTIVE_DEFER", 5),
        _ => return debug.to_string(),
    };
    format!("{name} ({num})")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats() {
        assert_eq!(guid(0x5054_00ff_fe12_3456), "5054:00ff:fe12:3456");
        assert_eq!(port_state("Active"), "PORT_ACTIVE (4)");
        let g = Gid::from_ip("127.0.0.2".parse().unwrap());
        assert_eq!(
            gid_text(&g),
            "0000:0000:0000:0000:0000:ffff:7f00:0002, RoCE v2, 127.0.0.2"
        );
    }
}
