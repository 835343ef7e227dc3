//! Packet captures with tshark for the wire checks: capture on an interface while a
//! program runs, then ask tshark's dissectors what the packets are and whether any is
//! malformed or carries an error-level expert entry.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The display filter of packets tshark could not dissect cleanly.
pub const PROBLEMS: &str = "_ws.malformed || _ws.expert.severity >= error";

/// Whether `tshark` runs here.
pub fn have_tshark() -> bool {
    Command::new("tshark")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// A running `tshark -i <iface> -f <filter> -w <file>`.
pub struct Capture {
    child: Child,
    file: PathBuf,
}

impl Capture {
    /// Starts the capture and waits until it runs. `Err`: why it cannot (no tshark, no
    /// permission to capture): the caller skips.
    pub fn start(iface: &str, filter: &str, file: &Path) -> Result<Capture, String> {
        if !have_tshark() {
            return Err("tshark not installed".into());
        }
        let _ = std::fs::remove_file(file);
        let mut child = Command::new("tshark")
            .args(["-i", iface, "-f", filter, "-w"])
            .arg(file)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("tshark: {e}"))?;
        let mut err = BufReader::new(child.stderr.take().ok_or("tshark stderr")?);
        // tshark prints "Capturing on '<iface>'" once the capture runs.
        let start = Instant::now();
        let mut line = String::new();
        while start.elapsed() < Duration::from_secs(30) {
            line.clear();
            if err.read_line(&mut line).unwrap_or(0) == 0 || line.contains("Capturing on") {
                break;
            }
        }
        let mut cap = Capture {
            child,
            file: file.to_path_buf(),
        };
        if !line.contains("Capturing on") {
            cap.interrupt();
            return Err(format!("tshark cannot capture on {iface}: {}", line.trim()));
        }
        // Keep draining tshark's stderr so it never blocks on a full pipe.
        std::thread::spawn(move || {
            let mut sink = String::new();
            while err.read_line(&mut sink).unwrap_or(0) > 0 {
                sink.clear();
            }
        });
        // "Capturing on" comes slightly before dumpcap's filter is live.
        std::thread::sleep(Duration::from_millis(500));
        Ok(cap)
    }

    /// Lets the last packets reach the capture, then stops tshark with SIGINT so that
    /// it finishes the file; returns the file.
    pub fn stop(mut self) -> PathBuf {
        std::thread::sleep(Duration::from_millis(1000));
        self.interrupt();
        self.file.clone()
    }

    fn interrupt(&mut self) {
        // SAFETY: plain kill(2) on the child this process spawned.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
        let _ = self.child.wait();
    }
}

/// `tshark -r file [-d decode_as] -Y filter -T fields -e ...`: one line per packet,
/// its fields separated by tabs.
pub fn fields(file: &Path, decode_as: Option<&str>, filter: &str, fields: &[&str]) -> Vec<String> {
    let mut c = Command::new("tshark");
    c.arg("-r").arg(file);
    if let Some(d) = decode_as {
        c.args(["-d", d]);
    }
    c.args(["-Y", filter, "-T", "fields"]);
    for f in fields {
        c.args(["-e", f]);
    }
    let out = c.output().expect("run tshark");
    assert!(
        out.status.success(),
        "tshark -r: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect()
}

/// The packets of `file` matching [`PROBLEMS`], with the full dissection of the first
/// three: empty when every packet dissects cleanly.
pub fn problems(file: &Path, decode_as: Option<&str>) -> String {
    let summary = fields(file, decode_as, PROBLEMS, &["frame.number", "_ws.col.info"]);
    if summary.is_empty() {
        return String::new();
    }
    let mut c = Command::new("tshark");
    c.arg("-r").arg(file);
    if let Some(d) = decode_as {
        c.args(["-d", d]);
    }
    let detail = c
        .args(["-V", "-x", "-Y", PROBLEMS, "-c", "3"])
        .output()
        .expect("run tshark");
    format!(
        "{}\n{}",
        summary.join("\n"),
        String::from_utf8_lossy(&detail.stdout)
    )
}
