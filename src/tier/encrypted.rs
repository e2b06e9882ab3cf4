//! The hot tier enciphered at rest (`--encrypt-cache`): [`DataFile`]'s operations over data
//! files whose bytes are [`CacheCipher`] blocks of 16 bytes, each enciphered under its inode
//! and offset. Everything above [`DataFile`] sees plaintext at the file's own offsets.
//!
//! Invariants:
//! - a data file is as long as the file's size rounded up to a [`CIPHER_BLOCK`] (a shorter one
//!   would read as ending early), and the bytes of its last block past the file's size are (enciphered) zeros, so
//!   a file that grows shows zeros there as POSIX wants ([`CacheEncryption::set_len`]; an open
//!   sizes every data file through it);
//! - a write that covers part of a block reads, merges and rewrites the whole block while it
//!   holds its inode's edge lock exclusively; writes of whole blocks hold it shared, so no
//!   write's bytes are ever lost to another write's merge of a block they share;
//! - holes stay holes: a hole is zeros on disk and zero ciphertext reads as zeros, so
//!   `SEEK_DATA`/`SEEK_HOLE`, punching and sparse copies work as on a plain data file. Only
//!   `copy_file_range` loses the kernel's in-place copy (and reflinks): the bytes are
//!   enciphered under their offset, so a copy is deciphered and enciphered again.

use parking_lot::RwLock;

use super::{DataFile, Result};
use crate::crypto::{CIPHER_BLOCK as B, CacheCipher};

/// Edge locks, by inode: enough that unrelated files rarely share one.
const EDGE_LOCKS: usize = 64;

/// Bytes deciphered and enciphered again per step of a copy or a shift.
const COPY_STEP: u64 = 1 << 20;

fn down(x: u64) -> u64 {
    x / B * B
}

fn up(x: u64) -> u64 {
    x.div_ceil(B) * B
}

/// The cipher of a hot tier and the locks of its partial-block writes.
pub struct CacheEncryption {
    cipher: CacheCipher,
    edges: Vec<RwLock<()>>,
}

impl CacheEncryption {
    pub fn new(cipher: CacheCipher) -> CacheEncryption {
        CacheEncryption { cipher, edges: (0..EDGE_LOCKS).map(|_| RwLock::new(())).collect() }
    }

    /// See [`CacheCipher::key_check`].
    pub fn key_check(&self) -> String {
        self.cipher.key_check()
    }

    fn edge(&self, d: &DataFile<'_>) -> &RwLock<()> {
        &self.edges[(d.ino as usize) % EDGE_LOCKS]
    }

    /// [`DataFile::read_into`]: the blocks around the range are read and deciphered. A torn
    /// last block (a data file whose length is not a multiple of a block, only ever seen
    /// after a crash and before the file's next open) reads as the end of the file.
    pub(super) fn read_into(&self, d: &DataFile<'_>, offset: u64, buf: &mut [u8]) -> Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let len = buf.len() as u64;
        let (start, stop) = (down(offset), up(offset + len));
        if start == offset && stop == offset + len {
            let n = d.raw_read_into(offset, buf)?;
            let whole = down(n as u64) as usize;
            buf[whole..n].fill(0);
            self.cipher.decrypt(d.ino, offset, &mut buf[..whole]);
            return Ok(whole);
        }
        let mut raw = vec![0u8; (stop - start) as usize];
        let n = down(d.raw_read_into(start, &mut raw)? as u64);
        self.cipher.decrypt(d.ino, start, &mut raw[..n as usize]);
        let skip = offset - start;
        let got = n.saturating_sub(skip).min(len) as usize;
        buf[..got].copy_from_slice(&raw[skip as usize..skip as usize + got]);
        Ok(got)
    }

    /// [`DataFile::write_at`].
    pub(super) fn write_at(&self, d: &DataFile<'_>, offset: u64, data: &[u8]) -> Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        let end = offset + data.len() as u64;
        if down(offset) == offset && up(end) == end {
            let _shared = self.edge(d).read();
            let mut buf = data.to_vec();
            self.cipher.encrypt(d.ino, offset, &mut buf);
            return d.raw_write_at(offset, &buf);
        }
        let _exclusive = self.edge(d).write();
        self.merge(d, offset, data)
    }

    /// Writes `data` at `offset`, merging the partial blocks at its edges with the bytes they
    /// hold (zeros past the end or in a hole). The caller holds the edge lock exclusively.
    fn merge(&self, d: &DataFile<'_>, offset: u64, data: &[u8]) -> Result<()> {
        let end = offset + data.len() as u64;
        let (start, stop) = (down(offset), up(end));
        let mut buf = vec![0u8; (stop - start) as usize];
        let last = buf.len() - B as usize;
        if offset != start {
            self.read_into(d, start, &mut buf[..B as usize])?;
        }
        if end != stop && (last != 0 || offset == start) {
            self.read_into(d, stop - B, &mut buf[last..])?;
        }
        buf[(offset - start) as usize..(end - start) as usize].copy_from_slice(data);
        self.cipher.encrypt(d.ino, start, &mut buf);
        d.raw_write_at(start, &buf)
    }

    /// [`DataFile::set_len`]: the data file ends at `size` rounded up to a block, and the
    /// bytes of that last block past `size` are zeros.
    pub(super) fn set_len(&self, d: &DataFile<'_>, size: u64) -> Result<()> {
        let _exclusive = self.edge(d).write();
        d.raw_set_len(up(size))?;
        self.zero_padding(d, size)
    }

    fn zero_padding(&self, d: &DataFile<'_>, size: u64) -> Result<()> {
        let keep = (size % B) as usize;
        if keep == 0 {
            return Ok(());
        }
        let at = down(size);
        let mut block = [0u8; B as usize];
        self.read_into(d, at, &mut block)?;
        if block[keep..].iter().all(|&b| b == 0) {
            return Ok(());
        }
        block[keep..].fill(0);
        self.cipher.encrypt(d.ino, at, &mut block);
        d.raw_write_at(at, &block)
    }

    /// [`DataFile::fallocate`]. Punching and zeroing act on whole blocks in the kernel and
    /// write enciphered zeros into the partial blocks at the edges; allocation covers the
    /// blocks around the range; collapse and insert shift whole disk blocks in the kernel and
    /// then encipher the moved bytes again under their new offsets.
    pub(super) fn fallocate(&self, d: &DataFile<'_>, mode: i32, offset: u64, len: u64) -> Result<()> {
        let end = offset + len;
        let _exclusive = self.edge(d).write();
        if mode & (libc::FALLOC_FL_COLLAPSE_RANGE | libc::FALLOC_FL_INSERT_RANGE) != 0 {
            return self.shift(d, mode, offset, len);
        }
        if mode & (libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_ZERO_RANGE) == 0 {
            return d.raw_fallocate(mode, down(offset), up(end) - down(offset));
        }
        let (inner_start, inner_end) = (up(offset), down(end));
        if inner_start < inner_end {
            d.raw_fallocate(mode, inner_start, inner_end - inner_start)?;
        }
        let physical = d.raw_len()?;
        let edges =
            if inner_start < inner_end { [offset..inner_start, inner_end..end] } else { [offset..end, end..end] };
        for edge in edges {
            // Punching (and zeroing that keeps the size) never extends the file: past its end
            // there are only zeros anyway.
            let edge_end = if mode & libc::FALLOC_FL_KEEP_SIZE != 0 { edge.end.min(physical) } else { edge.end };
            if edge.start < edge_end {
                self.merge(d, edge.start, &vec![0u8; (edge_end - edge.start) as usize])?;
            }
        }
        if mode & libc::FALLOC_FL_KEEP_SIZE == 0 && d.raw_len()? < up(end) {
            d.raw_set_len(up(end))?;
        }
        Ok(())
    }

    /// Collapse or insert of `len` bytes at `offset` (both multiples of the disk's block
    /// size, which the kernel checks, so of a cipher block).
    fn shift(&self, d: &DataFile<'_>, mode: i32, offset: u64, len: u64) -> Result<()> {
        let before = d.raw_len()?;
        d.raw_fallocate(mode, offset, len)?;
        // Where the moved bytes are now, and how far they moved.
        let (moved, from_new_to_old): (_, fn(u64, u64) -> u64) = if mode & libc::FALLOC_FL_COLLAPSE_RANGE != 0 {
            (offset..before.saturating_sub(len), |at, len| at + len)
        } else {
            (offset + len..before + len, |at, len| at - len)
        };
        for run in d.data_extents(moved)? {
            let mut at = run.start;
            while at < run.end {
                let step = (run.end - at).min(COPY_STEP);
                let mut buf = vec![0u8; step as usize];
                let n = down(d.raw_read_into(at, &mut buf)? as u64) as usize;
                self.cipher.decrypt(d.ino, from_new_to_old(at, len), &mut buf[..n]);
                self.cipher.encrypt(d.ino, at, &mut buf[..n]);
                d.raw_write_at(at, &buf[..n])?;
                at += step;
            }
        }
        Ok(())
    }

    /// [`DataFile::copy_to`]: the source's data runs are deciphered and enciphered again
    /// under the destination's inode and offsets; its holes become holes there.
    pub(super) fn copy_to(
        &self,
        src: &DataFile<'_>,
        off_in: u64,
        out: &DataFile<'_>,
        off_out: u64,
        len: u64,
    ) -> Result<u64> {
        let end = off_in + len;
        let mut at = off_in;
        let mut runs = src.data_extents(off_in..end)?;
        runs.push(end..end);
        for run in runs {
            let (start, stop) = (run.start.max(at), run.end.min(end));
            if at < start {
                let hole = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
                self.fallocate(out, hole, off_out + (at - off_in), start - at)?;
            }
            let mut pos = start;
            while pos < stop {
                let step = (stop - pos).min(COPY_STEP);
                let mut buf = vec![0u8; step as usize];
                let n = self.read_into(src, pos, &mut buf)?;
                self.write_at(out, off_out + (pos - off_in), &buf[..n])?;
                pos += step;
            }
            at = at.max(stop);
        }
        // Like the kernel's copy, a copy that ends in a hole past the end still extends the file.
        let _exclusive = self.edge(out).write();
        if out.raw_len()? < up(off_out + len) {
            out.raw_set_len(up(off_out + len))?;
        }
        Ok(len)
    }
}

#[cfg(test)]
mod tests {
    use std::fs::File;

    use super::*;

    struct Rng(u64);

    impl Rng {
        fn below(&mut self, n: u64) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0 % n.max(1)
        }
    }

    /// One file kept twice: enciphered, and plain as the reference.
    struct Twin {
        enc: File,
        plain: File,
        ino: u64,
        size: u64,
    }

    fn twin(dir: &std::path::Path, ino: u64) -> Twin {
        let open = |name: &str| {
            File::options().read(true).write(true).create(true).truncate(true).open(dir.join(name)).expect("create")
        };
        Twin { enc: open(&format!("enc{ino}")), plain: open(&format!("plain{ino}")), ino, size: 0 }
    }

    impl Twin {
        fn enc<'a>(&'a self, e: &'a CacheEncryption) -> DataFile<'a> {
            DataFile { file: &self.enc, ino: self.ino, encryption: Some(e) }
        }

        fn plain(&self) -> DataFile<'_> {
            DataFile::plain(&self.plain, self.ino)
        }

        /// Both copies read the same up to the size, the enciphered one reads zeros in its
        /// padding, and its length is the size rounded up to a block at most.
        fn check(&self, e: &CacheEncryption, what: &str) {
            let size = self.size as usize;
            let mut want = vec![0u8; size];
            self.plain().read_into(0, &mut want).expect("read plain");
            let mut got = vec![0u8; size];
            self.enc(e).read_into(0, &mut got).expect("read enc");
            let diff = want.iter().zip(&got).position(|(a, b)| a != b);
            assert!(diff.is_none(), "after {what}: byte {} differs (size {size})", diff.unwrap_or(0));
            let len = self.enc.metadata().expect("stat").len();
            assert_eq!(len, up(self.size), "after {what}: length for size {size}");
            let mut pad = vec![0xFFu8; (up(self.size) - self.size) as usize];
            let n = self.enc(e).read_into(self.size, &mut pad).expect("read padding");
            assert!(pad[..n].iter().all(|&b| b == 0), "after {what}: padding not zero");
        }
    }

    fn encryption() -> CacheEncryption {
        CacheEncryption::new(CacheCipher::new(&[3; 32]))
    }

    /// Supported by the reference file's filesystem (tmpfs has no collapse or insert).
    fn refused(r: Result<()>) -> bool {
        match r {
            Ok(()) => false,
            Err(super::super::HotTierError::Io { source, .. })
                if source.raw_os_error() == Some(libc::EOPNOTSUPP) || source.raw_os_error() == Some(libc::EINVAL) =>
            {
                true
            }
            Err(e) => panic!("reference fallocate: {e}"),
        }
    }

    #[test]
    fn every_operation_reads_back_as_on_a_plain_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let e = encryption();
        let mut files = [twin(dir.path(), 1), twin(dir.path(), 2)];
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        for step in 0..3000 {
            let i = rng.below(2) as usize;
            let span = 96 << 10;
            let (offset, len) = (rng.below(span), 1 + rng.below(9000));
            let what = match rng.below(8) {
                0..=2 => {
                    let data: Vec<u8> = (0..len).map(|_| 1 + rng.below(255) as u8).collect();
                    files[i].plain().write_at(offset, &data).expect("write plain");
                    files[i].enc(&e).write_at(offset, &data).expect("write enc");
                    files[i].size = files[i].size.max(offset + len);
                    "write"
                }
                3 => {
                    files[i].plain().set_len(offset).expect("truncate plain");
                    files[i].enc(&e).set_len(offset).expect("truncate enc");
                    files[i].size = offset;
                    "truncate"
                }
                4 => {
                    let mode = [
                        libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                        libc::FALLOC_FL_ZERO_RANGE,
                        libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE,
                        0,
                    ][rng.below(4) as usize];
                    if refused(files[i].plain().fallocate(mode, offset, len)) {
                        continue;
                    }
                    files[i].enc(&e).fallocate(mode, offset, len).expect("fallocate enc");
                    if mode & libc::FALLOC_FL_KEEP_SIZE == 0 {
                        files[i].size = files[i].size.max(offset + len);
                    }
                    "punch, zero or allocate"
                }
                5 => {
                    let (at, n) = (rng.below(8) * 4096, (1 + rng.below(3)) * 4096);
                    let collapse = rng.below(2) == 0;
                    if collapse && at + n >= files[i].size || !collapse && at >= files[i].size {
                        continue;
                    }
                    let mode = if collapse { libc::FALLOC_FL_COLLAPSE_RANGE } else { libc::FALLOC_FL_INSERT_RANGE };
                    if refused(files[i].plain().fallocate(mode, at, n)) {
                        continue;
                    }
                    files[i].enc(&e).fallocate(mode, at, n).expect("shift enc");
                    files[i].size = if collapse { files[i].size - n } else { files[i].size + n };
                    "collapse or insert"
                }
                _ => {
                    let (src, dst) = (&files[i], &files[1 - i]);
                    let len = len.min(src.size.saturating_sub(offset));
                    if len == 0 {
                        continue;
                    }
                    let to = rng.below(span);
                    src.plain().copy_to(offset, &dst.plain(), to, len).expect("copy plain");
                    let n = src.enc(&e).copy_to(offset, &dst.enc(&e), to, len).expect("copy enc");
                    assert_eq!(n, len);
                    files[1 - i].size = files[1 - i].size.max(to + len);
                    "copy"
                }
            };
            files[i].check(&e, &format!("step {step}, {what}"));
            files[1 - i].check(&e, &format!("step {step}, {what} (other file)"));
        }
        // The disk holds no plaintext: a written pattern is not found in the enciphered file.
        let pattern = [0x5Au8; 64];
        files[0].enc(&e).write_at(5, &pattern).expect("write");
        let raw = std::fs::read(dir.path().join("enc1")).expect("read");
        assert!(!raw.windows(16).any(|w| w == &pattern[..16]), "plaintext on disk");
    }

    #[test]
    fn concurrent_writes_into_shared_blocks_lose_nothing() {
        let dir = tempfile::tempdir().expect("tempdir");
        let e = encryption();
        let t = twin(dir.path(), 9);
        // 8 writers, each owning every 8th 3-byte run, so every block is shared by several.
        std::thread::scope(|s| {
            for w in 0..8u64 {
                let (t, e) = (&t, &e);
                s.spawn(move || {
                    for round in 0..200u64 {
                        let run = round * 8 + w;
                        t.enc(e).write_at(run * 3, &[w as u8 + 1; 3]).expect("write");
                    }
                });
            }
        });
        let mut got = vec![0u8; 1600 * 3];
        t.enc(&e).read_into(0, &mut got).expect("read");
        for (i, b) in got.iter().enumerate() {
            assert_eq!(*b, ((i / 3) % 8) as u8 + 1, "byte {i}");
        }
    }
}
