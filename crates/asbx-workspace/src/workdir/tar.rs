//! A kept working directory as a tar archive (POSIX ustar, a PAX header
//! for names ustar can't hold), streamed: each file's blob is read as the
//! archive is sent, never held whole in memory.

use asbx_protocol::workdir::{WorkdirEntry, WorkdirManifest};
use bytes::Bytes;
use futures::stream::{self, BoxStream, StreamExt as _};
use tokio_util::io::ReaderStream;

use crate::files::blobs::BlobStore;

const BLOCK: usize = 512;

/// The archive of `manifest`, its files read from `blobs`.
pub(crate) fn archive(
    blobs: BlobStore,
    manifest: WorkdirManifest,
) -> BoxStream<'static, std::io::Result<Bytes>> {
    let entries = stream::iter(manifest.entries).flat_map(move |e| entry(blobs.clone(), e));
    entries
        .chain(stream::once(async {
            Ok(Bytes::from(vec![0u8; 2 * BLOCK]))
        }))
        .boxed()
}

fn entry(blobs: BlobStore, e: WorkdirEntry) -> BoxStream<'static, std::io::Result<Bytes>> {
    match e {
        WorkdirEntry::Dir { path, mode } => {
            stream::once(
                async move { Ok(Bytes::from(header(&format!("{path}/"), mode, 0, b'5', ""))) },
            )
            .boxed()
        }
        WorkdirEntry::Symlink { path, target } => {
            stream::once(async move { Ok(Bytes::from(header(&path, 0o777, 0, b'2', &target))) })
                .boxed()
        }
        WorkdirEntry::File {
            path,
            mode,
            size,
            sha256,
        } => {
            let head =
                stream::once(async move { Ok(Bytes::from(header(&path, mode, size, b'0', ""))) });
            let body = stream::once(async move {
                match blobs.open_blob(&sha256).await {
                    Ok(r) => ReaderStream::new(r).boxed(),
                    Err(e) => {
                        stream::once(async move { Err(std::io::Error::other(e.to_string())) })
                            .boxed()
                    }
                }
            })
            .flatten();
            let pad = (BLOCK - (size as usize % BLOCK)) % BLOCK;
            let tail = stream::once(async move { Ok(Bytes::from(vec![0u8; pad])) });
            head.chain(body).chain(tail).boxed()
        }
    }
}

/// One entry's header blocks: a PAX header first when its name or link
/// does not fit ustar's fields.
fn header(path: &str, mode: u32, size: u64, kind: u8, link: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(3 * BLOCK);
    let long = path.len() > 99 || link.len() > 99 || !path.is_ascii() || !link.is_ascii();
    if long {
        let mut records = String::new();
        records.push_str(&pax_record("path", path));
        if !link.is_empty() {
            records.push_str(&pax_record("linkpath", link));
        }
        out.extend(ustar(
            "././@PaxHeader",
            0o644,
            records.len() as u64,
            b'x',
            "",
        ));
        out.extend(records.as_bytes());
        out.resize(out.len() + (BLOCK - records.len() % BLOCK) % BLOCK, 0);
    }
    let (p, l) = if long {
        (truncate(path), truncate(link))
    } else {
        (path, link)
    };
    out.extend(ustar(p, mode, size, kind, l));
    out
}

fn truncate(s: &str) -> &str {
    let mut end = s.len().min(99);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// A PAX record: `"<len> <key>=<value>\n"`, its length counting itself.
fn pax_record(key: &str, value: &str) -> String {
    let body = format!(" {key}={value}\n");
    let mut len = body.len() + 1;
    while format!("{len}{body}").len() != len {
        len += 1;
    }
    format!("{len}{body}")
}

fn ustar(path: &str, mode: u32, size: u64, kind: u8, link: &str) -> [u8; BLOCK] {
    let mut h = [0u8; BLOCK];
    let put = |h: &mut [u8; BLOCK], at: usize, len: usize, v: &[u8]| {
        let n = v.len().min(len);
        h[at..at + n].copy_from_slice(&v[..n]);
    };
    put(&mut h, 0, 100, path.as_bytes());
    put(&mut h, 100, 8, format!("{mode:07o}\0").as_bytes());
    put(&mut h, 108, 8, b"0000000\0");
    put(&mut h, 116, 8, b"0000000\0");
    put(&mut h, 124, 12, format!("{size:011o}\0").as_bytes());
    put(&mut h, 136, 12, b"00000000000\0");
    h[156] = kind;
    put(&mut h, 157, 100, link.as_bytes());
    put(&mut h, 257, 8, b"ustar\x0000");
    // The checksum counts its own field as spaces.
    h[148..156].copy_from_slice(b"        ");
    let sum: u32 = h.iter().map(|&b| u32::from(b)).sum();
    put(&mut h, 148, 8, format!("{sum:06o}\0 ").as_bytes());
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pax_records_count_their_own_length() {
        let r = pax_record("path", "a");
        assert_eq!(r, "9 path=a\n");
        assert_eq!(r.len(), 9);
        let long = "x".repeat(95);
        let r = pax_record("path", &long);
        assert_eq!(r.len().to_string(), r.split(' ').next().unwrap());
    }

    #[test]
    fn headers_are_blocks_with_a_checksum() {
        let h = header("src/a.py", 0o644, 9, b'0', "");
        assert_eq!(h.len(), BLOCK);
        let stored = std::str::from_utf8(&h[148..154]).unwrap();
        let mut blank = h.clone();
        blank[148..156].copy_from_slice(b"        ");
        let sum: u32 = blank.iter().map(|&b| u32::from(b)).sum();
        assert_eq!(u32::from_str_radix(stored, 8).unwrap(), sum);
        let long = header(&"d/".repeat(80), 0o755, 0, b'5', "");
        assert_eq!(long.len(), 3 * BLOCK, "PAX header, its records, the entry");
    }
}
