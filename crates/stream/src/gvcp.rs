//! A GigE Vision control (GVCP) client: discovery, register and memory access, and the
//! few GenICam lookups needed to stream from a real GigE Vision device (Aravis's
//! `arv-fake-gv-camera-0.8` is the one this is tested against).
//!
//! GVCP is UDP on port 3956 (GigE Vision 2.0 §15). Every command has an 8-byte header
//! `key 0x42 | flags | command u16 | length u16 | req_id u16`; every acknowledge
//! `status u16 | answer u16 | length u16 | ack_id u16`. Commands are answered one at a
//! time, so the client keeps one outstanding and retries on a timeout, like Aravis's
//! `arvgvdevice.c` (3 tries).
//!
//! Bootstrap registers (GigE Vision §28) give the stream channel's destination
//! (SCDA0 0x0D18, SCP0 0x0D00), its packet size (SCPS0 0x0D04) and the control
//! privilege (CCP 0x0A00). Image size, pixel format and acquisition start/stop are
//! camera features: their register addresses come from the device's GenICam XML, read
//! from the device memory the URL at 0x0200 names (`Local:name.xml;addr;len`).

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket};
use std::time::Duration;

use crate::StreamError;

/// GVCP's UDP port.
pub const GVCP_PORT: u16 = 3956;

const KEY: u8 = 0x42;
const FLAG_ACK_REQUIRED: u8 = 0x01;
const DISCOVERY_CMD: u16 = 0x0002;
const READREG_CMD: u16 = 0x0080;
const WRITEREG_CMD: u16 = 0x0082;
const READMEM_CMD: u16 = 0x0084;

/// Bootstrap register: first choice of URL for the GenICam XML (512 bytes).
pub const REG_XML_URL: u32 = 0x0200;
/// Bootstrap register: control channel privilege (2 = control access).
pub const REG_CCP: u32 = 0x0A00;
/// Bootstrap register: stream channel 0 host port.
pub const REG_SCP0: u32 = 0x0D00;
/// Bootstrap register: stream channel 0 packet size (low 16 bits).
pub const REG_SCPS0: u32 = 0x0D04;
/// Bootstrap register: stream channel 0 destination IPv4 address.
pub const REG_SCDA0: u32 = 0x0D18;
const CCP_CONTROL: u32 = 2;
/// The largest READMEM a device must serve (GigE Vision: 536 bytes, multiple of 4).
const READMEM_MAX: usize = 512;
const TRIES: usize = 3;

/// What a device says of itself in its discovery acknowledge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Manufacturer name (bootstrap 0x0048).
    pub manufacturer: String,
    /// Model name (0x0068).
    pub model: String,
    /// Serial number (0x00D8).
    pub serial: String,
    /// Current IPv4 address (0x0024).
    pub ip: Ipv4Addr,
}

fn be16(b: &[u8], o: usize) -> u16 {
    b.get(o..o + 2)
        .map_or(0, |s| u16::from_be_bytes([s[0], s[1]]))
}
fn be32(b: &[u8], o: usize) -> u32 {
    b.get(o..o + 4)
        .map_or(0, |s| u32::from_be_bytes([s[0], s[1], s[2], s[3]]))
}
fn cstr(b: &[u8], o: usize, n: usize) -> String {
    let s = b.get(o..(o + n).min(b.len())).unwrap_or(&[]);
    let end = s.iter().position(|&c| c == 0).unwrap_or(s.len());
    String::from_utf8_lossy(&s[..end]).into_owned()
}

/// One GVCP control connection to a device.
pub struct GvcpClient {
    sock: UdpSocket,
    device: SocketAddr,
    req_id: u16,
    timeout: Duration,
}

impl GvcpClient {
    /// Opens a control socket towards `device` (port [`GVCP_PORT`] if 0).
    pub fn connect(mut device: SocketAddr) -> Result<GvcpClient, StreamError> {
        if device.port() == 0 {
            device.set_port(GVCP_PORT);
        }
        let sock = UdpSocket::bind(SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0)))
            .map_err(StreamError::io("bind GVCP socket"))?;
        sock.connect(device)
            .map_err(StreamError::io(format!("GVCP to {device}")))?;
        Ok(GvcpClient {
            sock,
            device,
            req_id: 0,
            timeout: Duration::from_millis(300),
        })
    }

    /// The device's control address.
    pub fn device(&self) -> SocketAddr {
        self.device
    }

    /// The local address the device sees (and can stream to).
    pub fn local_ip(&self) -> Result<Ipv4Addr, StreamError> {
        match self.sock.local_addr() {
            Ok(SocketAddr::V4(a)) => Ok(*a.ip()),
            Ok(a) => Err(StreamError::Invalid(format!("GVCP over IPv6 ({a})"))),
            Err(e) => Err(StreamError::Io {
                what: "GVCP local address".into(),
                source: e,
            }),
        }
    }

    /// Sends `command` with `data` and returns the acknowledge's data, retrying on a
    /// timeout; a non-zero status is an error naming the GVCP status code.
    fn transact(&mut self, command: u16, data: &[u8]) -> Result<Vec<u8>, StreamError> {
        self.req_id = self.req_id.wrapping_add(1).max(1);
        let mut cmd = Vec::with_capacity(8 + data.len());
        cmd.extend_from_slice(&[KEY, FLAG_ACK_REQUIRED]);
        cmd.extend_from_slice(&command.to_be_bytes());
        cmd.extend_from_slice(&(data.len() as u16).to_be_bytes());
        cmd.extend_from_slice(&self.req_id.to_be_bytes());
        cmd.extend_from_slice(data);
        self.sock
            .set_read_timeout(Some(self.timeout))
            .map_err(StreamError::io("GVCP timeout"))?;
        let mut buf = [0u8; 1024];
        for _ in 0..TRIES {
            self.sock
                .send(&cmd)
                .map_err(StreamError::io(format!("GVCP to {}", self.device)))?;
            loop {
                let n = match self.sock.recv(&mut buf) {
                    Ok(n) => n,
                    Err(e)
                        if matches!(
                            e.kind(),
                            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                        ) =>
                    {
                        break
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                        return Err(StreamError::Invalid(format!(
                            "no GigE Vision device at {} (nothing listens on its GVCP port)",
                            self.device
                        )))
                    }
                    Err(e) => {
                        return Err(StreamError::Io {
                            what: format!("GVCP from {}", self.device),
                            source: e,
                        })
                    }
                };
                let ack = &buf[..n];
                // A late answer to an earlier try carries an older id: skip it.
                if n < 8 || be16(ack, 6) != self.req_id || be16(ack, 2) != command + 1 {
                    continue;
                }
                let status = be16(ack, 0);
                if status != 0 {
                    return Err(StreamError::Invalid(format!(
                        "GVCP command {command:#06x} refused by {}: status {status:#06x}",
                        self.device
                    )));
                }
                let len = usize::from(be16(ack, 4)).min(n - 8);
                return Ok(ack[8..8 + len].to_vec());
            }
        }
        Err(StreamError::Timeout(format!(
            "no GVCP answer from {} to command {command:#06x} after {TRIES} tries",
            self.device
        )))
    }

    /// DISCOVERY_CMD sent straight to the device.
    pub fn discover(&mut self) -> Result<DeviceInfo, StreamError> {
        let d = self.transact(DISCOVERY_CMD, &[])?;
        if d.len() < 0xF8 {
            return Err(StreamError::Invalid(format!(
                "short discovery answer from {} ({} bytes)",
                self.device,
                d.len()
            )));
        }
        Ok(DeviceInfo {
            manufacturer: cstr(&d, 0x48, 32),
            model: cstr(&d, 0x68, 32),
            serial: cstr(&d, 0xD8, 16),
            ip: Ipv4Addr::from(be32(&d, 0x24)),
        })
    }

    /// READREG of one register.
    pub fn read_register(&mut self, addr: u32) -> Result<u32, StreamError> {
        let d = self.transact(READREG_CMD, &addr.to_be_bytes())?;
        if d.len() < 4 {
            return Err(StreamError::Invalid(format!(
                "short READREG answer for {addr:#x}"
            )));
        }
        Ok(be32(&d, 0))
    }

    /// WRITEREG of one register.
    pub fn write_register(&mut self, addr: u32, value: u32) -> Result<(), StreamError> {
        let mut d = [0u8; 8];
        d[..4].copy_from_slice(&addr.to_be_bytes());
        d[4..].copy_from_slice(&value.to_be_bytes());
        self.transact(WRITEREG_CMD, &d).map(|_| ())
    }

    /// READMEM of `len` bytes from `addr`, in chunks the device must accept.
    pub fn read_memory(&mut self, addr: u32, len: usize) -> Result<Vec<u8>, StreamError> {
        let mut out = Vec::with_capacity(len);
        while out.len() < len {
            let want = (len - out.len()).min(READMEM_MAX);
            // GigE Vision: the count is a multiple of 4.
            let count = want.div_ceil(4) * 4;
            let a = addr + out.len() as u32;
            let mut d = [0u8; 8];
            d[..4].copy_from_slice(&a.to_be_bytes());
            d[6..].copy_from_slice(&(count as u16).to_be_bytes());
            let r = self.transact(READMEM_CMD, &d)?;
            // Answer: address u32, then the bytes.
            let bytes = r.get(4..).unwrap_or(&[]);
            if bytes.is_empty() {
                return Err(StreamError::Invalid(format!(
                    "empty READMEM answer at {a:#x}"
                )));
            }
            out.extend_from_slice(&bytes[..bytes.len().min(want)]);
        }
        Ok(out)
    }

    /// The device's GenICam XML, from the first-choice URL (`Local:` only).
    pub fn genicam_xml(&mut self) -> Result<String, StreamError> {
        let url = self.read_memory(REG_XML_URL, 512)?;
        let url = cstr(&url, 0, 512);
        let (name, addr, len) = parse_local_url(&url).ok_or_else(|| {
            StreamError::Invalid(format!("unsupported GenICam URL {url:?} (only Local:)"))
        })?;
        if name.to_ascii_lowercase().ends_with(".zip") {
            return Err(StreamError::Invalid(format!(
                "GenICam file {name} is zipped; only plain XML is supported"
            )));
        }
        let bytes = self.read_memory(addr, len)?;
        let end = bytes.iter().position(|&c| c == 0).unwrap_or(bytes.len());
        String::from_utf8(bytes[..end].to_vec())
            .map_err(|_| StreamError::Invalid(format!("GenICam file {name} is not UTF-8")))
    }
}

/// Parses `Local:name;addr;len` (hex address and length, GenICam URL scheme).
fn parse_local_url(url: &str) -> Option<(String, u32, usize)> {
    let rest = url
        .strip_prefix("Local:")
        .or_else(|| url.strip_prefix("local:"))?;
    let mut it = rest.split(';');
    let name = it.next()?.to_string();
    let hex = |s: &str| u64::from_str_radix(s.trim().trim_start_matches("0x"), 16).ok();
    let addr = u32::try_from(hex(it.next()?)?).ok()?;
    let len = usize::try_from(hex(it.next()?)?).ok()?;
    Some((name, addr, len))
}

/// A register a GenICam feature lives in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FeatureRegister {
    /// Register address.
    pub address: u32,
    /// For a Command feature: the value that executes it.
    pub command_value: Option<u32>,
}

/// Resolves feature `name` of a GenICam XML to its register: the node named `name`, then
/// its `pValue` chain (at most 4 hops), to the first node with an `Address`. Covers the
/// plain `Integer → IntReg` / `Command → IntReg` layouts of simple devices; selectors,
/// swiss knives and converters are not followed.
pub fn resolve_feature(xml: &str, name: &str) -> Result<FeatureRegister, StreamError> {
    let doc = roxmltree::Document::parse(xml)
        .map_err(|e| StreamError::Invalid(format!("GenICam XML: {e}")))?;
    let find = |n: &str| {
        doc.descendants()
            .find(|d| d.is_element() && d.attribute("Name") == Some(n))
    };
    let child_text = |node: roxmltree::Node, tag: &str| {
        node.children()
            .find(|c| c.is_element() && c.tag_name().name() == tag)
            .and_then(|c| c.text())
            .map(|t| t.trim().to_string())
    };
    let num = |s: &str| {
        s.strip_prefix("0x")
            .or_else(|| s.strip_prefix("0X"))
            .map_or_else(
                || s.parse::<u64>().ok(),
                |h| u64::from_str_radix(h, 16).ok(),
            )
            .and_then(|v| u32::try_from(v).ok())
    };
    let mut node = find(name)
        .ok_or_else(|| StreamError::Invalid(format!("GenICam XML has no feature {name}")))?;
    let command_value = child_text(node, "CommandValue").and_then(|s| num(&s));
    for _ in 0..4 {
        if let Some(a) = child_text(node, "Address") {
            let address = num(&a).ok_or_else(|| {
                StreamError::Invalid(format!("feature {name}: bad address {a:?}"))
            })?;
            return Ok(FeatureRegister {
                address,
                command_value,
            });
        }
        let Some(p) = child_text(node, "pValue") else {
            break;
        };
        node = find(&p)
            .ok_or_else(|| StreamError::Invalid(format!("feature {name}: pValue {p} not found")))?;
    }
    Err(StreamError::Invalid(format!(
        "feature {name}: no plain register behind it"
    )))
}

/// Image geometry and stream settings read from a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CameraSettings {
    /// Width in pixels.
    pub width: u32,
    /// Height in rows.
    pub height: u32,
    /// PFNC pixel format.
    pub pixel_format: u32,
    /// GVSP packet size (IP packet bytes, SCPS0).
    pub packet_size: u32,
}

/// A GigE Vision camera under this host's control: control privilege taken on
/// [`GigeCamera::open`], acquisition stopped and privilege released on drop.
pub struct GigeCamera {
    gvcp: GvcpClient,
    info: DeviceInfo,
    width: FeatureRegister,
    height: FeatureRegister,
    pixel_format: FeatureRegister,
    start: FeatureRegister,
    stop: FeatureRegister,
    frame_period_us: Option<FeatureRegister>,
    streaming: bool,
}

impl GigeCamera {
    /// Discovers the device at `addr`, takes control (CCP = control access) and reads
    /// its GenICam XML to find the image and acquisition registers.
    pub fn open(addr: SocketAddr) -> Result<GigeCamera, StreamError> {
        let mut gvcp = GvcpClient::connect(addr)?;
        let info = gvcp.discover()?;
        gvcp.write_register(REG_CCP, CCP_CONTROL)?;
        let xml = gvcp.genicam_xml()?;
        let start = resolve_feature(&xml, "AcquisitionStart")?;
        let stop = resolve_feature(&xml, "AcquisitionStop")?;
        Ok(GigeCamera {
            width: resolve_feature(&xml, "Width")?,
            height: resolve_feature(&xml, "Height")?,
            pixel_format: resolve_feature(&xml, "PixelFormat")?,
            // Aravis's fake camera's own frame-period feature; absent on others.
            frame_period_us: resolve_feature(&xml, "AcquisitionFramePeriod").ok(),
            start,
            stop,
            gvcp,
            info,
            streaming: false,
        })
    }

    /// What the device said in discovery.
    pub fn info(&self) -> &DeviceInfo {
        &self.info
    }

    /// Sets width and height.
    pub fn set_size(&mut self, width: u32, height: u32) -> Result<(), StreamError> {
        self.gvcp.write_register(self.width.address, width)?;
        self.gvcp.write_register(self.height.address, height)
    }

    /// Sets the GVSP packet size (SCPS0, IP packet bytes).
    pub fn set_packet_size(&mut self, bytes: u32) -> Result<(), StreamError> {
        let cur = self.gvcp.read_register(REG_SCPS0)?;
        self.gvcp
            .write_register(REG_SCPS0, (cur & 0xFFFF_0000) | (bytes & 0xFFFF))
    }

    /// Sets the frame period where the device has a plain register for it.
    pub fn set_frame_period_us(&mut self, us: u32) -> Result<(), StreamError> {
        match self.frame_period_us {
            Some(r) => self.gvcp.write_register(r.address, us),
            None => Err(StreamError::Invalid(
                "this camera has no AcquisitionFramePeriod register".into(),
            )),
        }
    }

    /// Current geometry and packet size, as the device reports them.
    pub fn settings(&mut self) -> Result<CameraSettings, StreamError> {
        Ok(CameraSettings {
            width: self.gvcp.read_register(self.width.address)?,
            height: self.gvcp.read_register(self.height.address)?,
            pixel_format: self.gvcp.read_register(self.pixel_format.address)?,
            packet_size: self.gvcp.read_register(REG_SCPS0)? & 0xFFFF,
        })
    }

    /// Points stream channel 0 at `dest` and starts acquisition.
    pub fn start(&mut self, dest: SocketAddrV4) -> Result<(), StreamError> {
        self.gvcp.write_register(REG_SCDA0, u32::from(*dest.ip()))?;
        self.gvcp.write_register(REG_SCP0, u32::from(dest.port()))?;
        self.gvcp
            .write_register(self.start.address, self.start.command_value.unwrap_or(1))?;
        self.streaming = true;
        Ok(())
    }

    /// Keeps the control privilege alive (a CCP read, as Aravis's heartbeat does; the
    /// device drops a silent controller after its heartbeat timeout, 3 s by default).
    pub fn heartbeat(&mut self) -> Result<(), StreamError> {
        self.gvcp.read_register(REG_CCP).map(|_| ())
    }

    /// Stops acquisition.
    pub fn stop(&mut self) -> Result<(), StreamError> {
        self.streaming = false;
        self.gvcp
            .write_register(self.stop.address, self.stop.command_value.unwrap_or(1))?;
        self.gvcp.write_register(REG_SCP0, 0)
    }

    /// The local address the camera can reach this host at.
    pub fn local_ip(&self) -> Result<Ipv4Addr, StreamError> {
        self.gvcp.local_ip()
    }
}

impl Drop for GigeCamera {
    fn drop(&mut self) {
        if self.streaming {
            let _ = self.stop();
        }
        let _ = self.gvcp.write_register(REG_CCP, 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_url() {
        assert_eq!(
            parse_local_url("Local:arv-fake-camera.xml;10000;3a2b"),
            Some(("arv-fake-camera.xml".into(), 0x10000, 0x3a2b))
        );
        assert_eq!(parse_local_url("http://x/y.xml"), None);
        assert_eq!(parse_local_url("Local:a.xml;zz;1"), None);
    }

    #[test]
    fn feature_chain() {
        let xml = r#"<RegisterDescription>
            <Integer Name="Width"><pValue>WidthReg</pValue></Integer>
            <IntReg Name="WidthReg"><Address>0x100</Address><Length>4</Length></IntReg>
            <Command Name="AcquisitionStart"><pValue>Acq</pValue><CommandValue>1</CommandValue></Command>
            <IntReg Name="Acq"><Address>292</Address></IntReg>
            <Integer Name="Loop"><pValue>Loop</pValue></Integer>
        </RegisterDescription>"#;
        assert_eq!(
            resolve_feature(xml, "Width").unwrap(),
            FeatureRegister {
                address: 0x100,
                command_value: None
            }
        );
        assert_eq!(
            resolve_feature(xml, "AcquisitionStart").unwrap(),
            FeatureRegister {
                address: 292,
                command_value: Some(1)
            }
        );
        assert!(resolve_feature(xml, "Loop").is_err());
        assert!(resolve_feature(xml, "Height").is_err());
    }
}
