//! A minimal PNG writer for 8-bit grayscale frames: stored (uncompressed) deflate
//! blocks, so no compression dependency; a 5 MP frame makes a ~5 MB file any viewer
//! opens. Bayer frames are written as their raw mosaic in gray.

use std::io::Write;

fn chunk(out: &mut Vec<u8>, kind: &[u8; 4], data: &[u8]) {
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    let start = out.len();
    out.extend_from_slice(kind);
    out.extend_from_slice(data);
    let crc = crc32fast::hash(&out[start..]);
    out.extend_from_slice(&crc.to_be_bytes());
}

fn adler32(data: &[u8]) -> u32 {
    let (mut a, mut b) = (1u32, 0u32);
    for block in data.chunks(5552) {
        for &x in block {
            a += u32::from(x);
            b += a;
        }
        a %= 65521;
        b %= 65521;
    }
    (b << 16) | a
}

/// Encodes a `width`×`height` 8-bit grayscale image (`pixels` row-major) as PNG bytes.
/// `None` if `pixels` is shorter than the image.
pub fn encode_gray8(width: u32, height: u32, pixels: &[u8]) -> Option<Vec<u8>> {
    let w = width as usize;
    let h = height as usize;
    let pixels = pixels.get(..w.checked_mul(h)?)?;
    // Raw scanlines: filter byte 0 (None) then the row.
    let mut raw = Vec::with_capacity((w + 1) * h);
    for row in pixels.chunks(w.max(1)).take(h) {
        raw.push(0);
        raw.extend_from_slice(row);
    }
    // zlib stream of stored blocks (RFC 1950/1951 §3.2.4), 65535 bytes each.
    let mut z = Vec::with_capacity(raw.len() + raw.len() / 65535 * 5 + 16);
    z.extend_from_slice(&[0x78, 0x01]);
    let mut blocks = raw.chunks(65535).peekable();
    if blocks.peek().is_none() {
        z.extend_from_slice(&[1, 0, 0, 0xff, 0xff]);
    }
    while let Some(b) = blocks.next() {
        z.push(u8::from(blocks.peek().is_none()));
        let len = b.len() as u16;
        z.extend_from_slice(&len.to_le_bytes());
        z.extend_from_slice(&(!len).to_le_bytes());
        z.extend_from_slice(b);
    }
    z.extend_from_slice(&adler32(&raw).to_be_bytes());

    let mut out = Vec::with_capacity(z.len() + 64);
    out.extend_from_slice(b"\x89PNG\r\n\x1a\n");
    let mut ihdr = Vec::with_capacity(13);
    ihdr.extend_from_slice(&width.to_be_bytes());
    ihdr.extend_from_slice(&height.to_be_bytes());
    ihdr.extend_from_slice(&[8, 0, 0, 0, 0]); // depth 8, grayscale, deflate, filter 0, no interlace
    chunk(&mut out, b"IHDR", &ihdr);
    chunk(&mut out, b"IDAT", &z);
    chunk(&mut out, b"IEND", &[]);
    Some(out)
}

/// Writes a grayscale PNG file.
pub fn write_gray8(
    path: &std::path::Path,
    width: u32,
    height: u32,
    pixels: &[u8],
) -> std::io::Result<()> {
    let bytes = encode_gray8(width, height, pixels).ok_or_else(|| {
        std::io::Error::new(std::io::ErrorKind::InvalidInput, "image shorter than WxH")
    })?;
    std::fs::File::create(path)?.write_all(&bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn png_structure() {
        let px: Vec<u8> = (0..300u32 * 250).map(|i| i as u8).collect();
        let p = encode_gray8(300, 250, &px).unwrap();
        assert_eq!(&p[..8], b"\x89PNG\r\n\x1a\n");
        assert_eq!(&p[12..16], b"IHDR");
        assert_eq!(&p[p.len() - 8..p.len() - 4], b"IEND");
        assert!(encode_gray8(300, 251, &px).is_none());
        assert_eq!(adler32(b"Wikipedia"), 0x11E6_0398);
    }
}
