//! Synthetic frames: geometry, a checkable pattern and the in-band trailer.
//!
//! Pattern: every byte of row `r` of frame `id` is [`row_value`]`(id, r)`. Filling is one
//! `memset` per row (cheap enough for 5 MP at hundreds of fps) and a receiver can check
//! every byte; consecutive frames and frames `N` apart differ in every row, so a stale
//! ring slot never passes as a new frame.
//!
//! Trailer (RDMA modes only, [`TRAILER_LEN`] bytes right after the image, inside the same
//! message): magic, frame id, camera timestamp, image length. With UC a lost packet makes
//! the responder drop the rest of the message (IBTA 9.7.5.1.1 / rxe: a PSN gap in a UC
//! message discards until the next FIRST/ONLY), so the trailer — carried by the *last*
//! packet — is present for this frame id only if every packet of the WRITE was placed.

/// Pixel formats (GenICam PFNC codes, as GVSP leaders carry them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum PixelFormat {
    /// 8-bit monochrome.
    Mono8,
    /// 8-bit Bayer RGGB.
    BayerRg8,
}

impl PixelFormat {
    /// PFNC code (Mono8 0x01080001, BayerRG8 0x01080009).
    pub fn pfnc(self) -> u32 {
        match self {
            PixelFormat::Mono8 => 0x0108_0001,
            PixelFormat::BayerRg8 => 0x0108_0009,
        }
    }
    /// The format of a PFNC code, if it is one of these.
    pub fn from_pfnc(code: u32) -> Option<PixelFormat> {
        [PixelFormat::Mono8, PixelFormat::BayerRg8]
            .into_iter()
            .find(|p| p.pfnc() == code)
    }
    /// Parses `mono8` / `bayerrg8`.
    pub fn parse(s: &str) -> Option<PixelFormat> {
        match s.to_ascii_lowercase().as_str() {
            "mono8" => Some(PixelFormat::Mono8),
            "bayerrg8" | "bayer_rg8" => Some(PixelFormat::BayerRg8),
            _ => None,
        }
    }
}

/// Frame geometry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FrameSpec {
    /// Pixels per row.
    pub width: u32,
    /// Rows.
    pub height: u32,
    /// Pixel format (both are 1 byte per pixel).
    pub pixel: PixelFormat,
}

impl Default for FrameSpec {
    /// 2448×2048 Mono8 (5 MP, a common 10GigE sensor).
    fn default() -> Self {
        FrameSpec {
            width: 2448,
            height: 2048,
            pixel: PixelFormat::Mono8,
        }
    }
}

/// Bytes of the in-band trailer of the RDMA modes.
pub const TRAILER_LEN: usize = 32;
const TRAILER_MAGIC: u64 = 0x5348_4341_4652_4d31; // "SHCAFRM1"

impl FrameSpec {
    /// Bytes per row.
    pub fn row_len(&self) -> usize {
        self.width as usize
    }
    /// Image bytes.
    pub fn image_len(&self) -> usize {
        self.width as usize * self.height as usize
    }
    /// Image plus trailer (the RDMA message / ring slot size).
    pub fn slot_len(&self) -> usize {
        self.image_len() + TRAILER_LEN
    }
}

/// The value of every byte of row `row` in frame `id`.
#[inline]
pub fn row_value(id: u64, row: u32) -> u8 {
    // 131 is odd, so ids 1..=255 apart always differ; the row term makes a visible ramp.
    (id.wrapping_mul(131) as u32).wrapping_add(row.wrapping_mul(3)) as u8
}

/// Fills `image` (at least `spec.image_len()` bytes) with frame `id`'s pattern.
pub fn fill(spec: &FrameSpec, id: u64, image: &mut [u8]) {
    let w = spec.row_len();
    if w == 0 {
        return;
    }
    for (r, row) in image
        .chunks_exact_mut(w)
        .take(spec.height as usize)
        .enumerate()
    {
        row.fill(row_value(id, r as u32));
    }
}

/// Checks `image` against frame `id`'s pattern; `Err(row)` names the first bad row
/// (`height` when the buffer is short).
pub fn verify(spec: &FrameSpec, id: u64, image: &[u8]) -> Result<(), u32> {
    let w = spec.row_len();
    if image.len() < spec.image_len() {
        return Err(spec.height);
    }
    if w == 0 {
        return Ok(());
    }
    for (r, row) in image.chunks_exact(w).take(spec.height as usize).enumerate() {
        let v = row_value(id, r as u32);
        let word = u64::from_ne_bytes([v; 8]);
        let (pre, rest) = row.split_at(row.len() % 8);
        let mid = rest.chunks_exact(8);
        let ok = pre.iter().all(|&b| b == v)
            && mid
                .map(|c| u64::from_ne_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
                .all(|x| x == word);
        if !ok {
            return Err(r as u32);
        }
    }
    Ok(())
}

/// The in-band trailer of the RDMA modes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Trailer {
    /// Frame id.
    pub frame_id: u64,
    /// Camera timestamp (ns, CLOCK_MONOTONIC).
    pub timestamp_ns: u64,
    /// Image bytes before the trailer.
    pub image_len: u32,
}

impl Trailer {
    /// Encodes into `out` (at least [`TRAILER_LEN`] bytes; shorter: nothing written).
    pub fn write(&self, out: &mut [u8]) {
        if out.len() < TRAILER_LEN {
            return;
        }
        out[0..8].copy_from_slice(&TRAILER_MAGIC.to_le_bytes());
        out[8..16].copy_from_slice(&self.frame_id.to_le_bytes());
        out[16..24].copy_from_slice(&self.timestamp_ns.to_le_bytes());
        out[24..28].copy_from_slice(&self.image_len.to_le_bytes());
        // A check over the fields so a torn trailer never validates.
        let crc = crc32fast::hash(&out[0..28]);
        out[28..32].copy_from_slice(&crc.to_le_bytes());
    }

    /// Decodes and checks magic and CRC.
    pub fn read(buf: &[u8]) -> Option<Trailer> {
        let b = buf.get(..TRAILER_LEN)?;
        let u64at = |o: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&b[o..o + 8]);
            u64::from_le_bytes(a)
        };
        let u32at = |o: usize| {
            let mut a = [0u8; 4];
            a.copy_from_slice(&b[o..o + 4]);
            u32::from_le_bytes(a)
        };
        if u64at(0) != TRAILER_MAGIC || u32at(28) != crc32fast::hash(&b[0..28]) {
            return None;
        }
        Some(Trailer {
            frame_id: u64at(8),
            timestamp_ns: u64at(16),
            image_len: u32at(24),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fill_verify_roundtrip_and_detects_damage() {
        let spec = FrameSpec {
            width: 13,
            height: 7,
            pixel: PixelFormat::Mono8,
        };
        let mut b = vec![0u8; spec.image_len()];
        fill(&spec, 42, &mut b);
        assert_eq!(verify(&spec, 42, &b), Ok(()));
        assert!(verify(&spec, 43, &b).is_err());
        b[5 * 13 + 12] ^= 1;
        assert_eq!(verify(&spec, 42, &b), Err(5));
    }

    #[test]
    fn trailer_roundtrip() {
        let t = Trailer {
            frame_id: 7,
            timestamp_ns: 99,
            image_len: 1000,
        };
        let mut b = [0u8; TRAILER_LEN];
        t.write(&mut b);
        assert_eq!(Trailer::read(&b), Some(t));
        b[9] ^= 1;
        assert_eq!(Trailer::read(&b), None);
    }
}
