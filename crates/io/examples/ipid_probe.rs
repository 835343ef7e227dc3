//! Sends one GSO Transmit and a few plain datagrams, to inspect with tcpdump the IPv4 ID
//! Linux writes on them (the RoCE ICRC covers the IP ID, so we must know it).
//!
//! `ipid_probe <bind addr:port> <dst addr:port> [segment size] [segments]`

use softhca_io::{RoceSocket, Transmit};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 2 {
        return Err(
            "usage: ipid_probe <bind addr:port> <dst addr:port> [segment size] [segments]".into(),
        );
    }
    let sock = RoceSocket::bind(args[0].parse()?)?;
    let dst = args[1].parse()?;
    let seg: usize = args.get(2).map_or(Ok(1000), |a| a.parse())?;
    let n: usize = args.get(3).map_or(Ok(5), |a| a.parse())?;
    println!("{:?}", sock.capabilities());
    let data: Vec<u8> = (0..seg * n).map(|i| (i / seg) as u8).collect();
    let gso = [Transmit {
        dst,
        src_ip: None,
        tos: 0,
        contents: &data,
        pieces: &[],
        segment_size: Some(seg),
    }];
    println!("GSO send of {n} x {seg}: {:?}", sock.send(&gso));
    for i in 0..3u8 {
        let plain = [Transmit {
            dst,
            src_ip: None,
            tos: 0,
            contents: &[i; 100],
            pieces: &[],
            segment_size: None,
        }];
        println!("plain send {i}: {:?}", sock.send(&plain));
    }
    println!(
        "after: {:?}, GSO fallbacks {}",
        sock.capabilities(),
        sock.gso_fallbacks()
    );
    Ok(())
}
