//! What a file written by `torch.save` records about itself: an integer kept
//! at the top level of its dict (Lightning's `global_step`, nanoGPT's
//! `iter_num`), read without running Python or unpickling anything.
//!
//! Theory of operation. `torch.save` writes a zip (stored, never compressed)
//! whose first record, `<archive>/data.pkl`, is the pickle of the saved object
//! with every tensor's data moved out to other records. A top-level dict key
//! is a pickled string (`X` + length + UTF-8, or `\x8c` + length + UTF-8)
//! followed, after an optional memo opcode, by its value; a small integer is
//! `K` (1 byte), `M` (2 bytes), `J` (4 bytes, signed) or `\x8a` (n bytes).
//! The first occurrence of the key as a pickled string whose value is an
//! integer is taken: both trainers write these keys before any nested dict
//! that could hold a key of the same name (Lightning: `epoch`, `global_step`
//! first; nanoGPT's model and optimizer state dicts hold no `iter_num`).
//! A file that is not such a zip, or whose key is not an integer, says nothing.

use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

/// The most of a checkpoint's pickle read (its tensors are elsewhere in the zip).
const MAX_PICKLE: u64 = 32 << 20;

/// The integer `key` holds in the dict `torch.save` wrote to `path`, if any.
pub fn top_level_int(path: &Path, key: &str) -> Option<u64> {
    let pickle = data_pkl(path)?;
    int_after_key(&pickle, key)
}

/// The bytes of the zip's `data.pkl` record (stored, so its bytes are the pickle's).
fn data_pkl(path: &Path) -> Option<Vec<u8>> {
    let (mut f, md) = crate::untrusted::open(path, crate::untrusted::Expect::any()).ok()?;
    if !md.is_file() {
        return None;
    }
    // The local header of the first record: PK\3\4, then the name at 30.
    let mut head = [0u8; 30];
    f.read_exact(&mut head).ok()?;
    if &head[..4] != b"PK\x03\x04" {
        return None;
    }
    let u16_at = |b: &[u8], i: usize| u16::from_le_bytes([b[i], b[i + 1]]) as u64;
    let u32_at =
        |b: &[u8], i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]) as u64;
    let method = u16_at(&head, 8);
    let (name_len, extra_len) = (u16_at(&head, 26), u16_at(&head, 28));
    let mut name = vec![0u8; name_len as usize];
    f.read_exact(&mut name).ok()?;
    if method != 0 || !name.ends_with(b"data.pkl") {
        return None;
    }
    // The size is in the local header unless a data descriptor follows (bit
    // 3) or it is a zip64 one: then read up to the cap and let the pickle's
    // STOP end it.
    let flags = u16_at(&head, 6);
    let size = u32_at(&head, 18);
    let want = if flags & 8 != 0 || size == 0 || size == 0xFFFF_FFFF {
        MAX_PICKLE
    } else {
        size.min(MAX_PICKLE)
    };
    f.seek(SeekFrom::Start(30 + name_len + extra_len)).ok()?;
    let mut out = Vec::new();
    f.take(want).read_to_end(&mut out).ok()?;
    Some(out)
}

/// The integer value after the first pickled string `key` in `pickle`.
fn int_after_key(pickle: &[u8], key: &str) -> Option<u64> {
    let k = key.as_bytes();
    let mut at = 0;
    while let Some(p) = memchr::memmem::find(&pickle[at..], k) {
        let start = at + p;
        at = start + 1;
        // The string's opcode and length stand right before it.
        let pickled_string = (start >= 5
            && pickle[start - 5] == b'X'
            && pickle[start - 4..start] == (k.len() as u32).to_le_bytes())
            || (start >= 2 && pickle[start - 2] == 0x8c && pickle[start - 1] as usize == k.len());
        if !pickled_string {
            continue;
        }
        let mut i = start + k.len();
        // A memo opcode may stand between the key and its value.
        match pickle.get(i) {
            Some(b'q') => i += 2,
            Some(b'r') => i += 5,
            Some(0x94) => i += 1,
            _ => {}
        }
        let b = |j: usize| pickle.get(i + j).copied();
        return match b(0)? {
            b'K' => Some(b(1)? as u64),
            b'M' => Some(u16::from_le_bytes([b(1)?, b(2)?]) as u64),
            b'J' => {
                let v = i32::from_le_bytes([b(1)?, b(2)?, b(3)?, b(4)?]);
                u64::try_from(v).ok()
            }
            0x8a => {
                let n = b(1)? as usize;
                if n == 0 || n > 8 {
                    return None;
                }
                let bytes = pickle.get(i + 2..i + 2 + n)?;
                if bytes[n - 1] & 0x80 != 0 {
                    return None; // negative
                }
                let mut v = [0u8; 8];
                v[..n].copy_from_slice(bytes);
                Some(u64::from_le_bytes(v))
            }
            _ => None,
        };
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stored zip with one `archive/data.pkl` record.
    fn zip(pickle: &[u8]) -> Vec<u8> {
        let name = b"archive/data.pkl";
        let mut z = Vec::new();
        z.extend_from_slice(b"PK\x03\x04");
        z.extend_from_slice(&[20, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        z.extend_from_slice(&(pickle.len() as u32).to_le_bytes());
        z.extend_from_slice(&(pickle.len() as u32).to_le_bytes());
        z.extend_from_slice(&(name.len() as u16).to_le_bytes());
        z.extend_from_slice(&0u16.to_le_bytes());
        z.extend_from_slice(name);
        z.extend_from_slice(pickle);
        z.extend_from_slice(b"PK\x05\x06");
        z
    }

    fn key(s: &str) -> Vec<u8> {
        let mut v = vec![b'X'];
        v.extend_from_slice(&(s.len() as u32).to_le_bytes());
        v.extend_from_slice(s.as_bytes());
        v
    }

    #[test]
    fn reads_the_integers_torch_save_pickles_after_a_key() {
        // {'epoch': 0, 'global_step': 5}, protocol 2 with memo opcodes.
        let mut p = b"\x80\x02}q\x00(".to_vec();
        p.extend(key("epoch"));
        p.extend_from_slice(b"q\x01K\x00");
        p.extend(key("global_step"));
        p.extend_from_slice(b"q\x02K\x05u.");
        let t = tempfile::tempdir().unwrap();
        let f = t.path().join("epoch=0-step=5.ckpt");
        std::fs::write(&f, zip(&p)).unwrap();
        assert_eq!(top_level_int(&f, "global_step"), Some(5));
        assert_eq!(top_level_int(&f, "epoch"), Some(0));
        assert_eq!(top_level_int(&f, "iter_num"), None);

        for (value, want) in [
            (&b"M\x10\x27"[..], Some(10000)),
            (b"J\x40\x42\x0f\x00", Some(1_000_000)),
            (b"J\xff\xff\xff\xff", None),
            (b"\x8a\x05\x00\xe4\x0b\x54\x02", Some(10_000_000_000)),
            (b"G@\x14\x00\x00\x00\x00\x00\x00", None),
        ] {
            let mut p = b"\x80\x02}q\x00".to_vec();
            p.extend(key("iter_num"));
            p.extend_from_slice(value);
            assert_eq!(int_after_key(&p, "iter_num"), want, "{value:?}");
        }
        // A key inside a longer string is not the key.
        let mut p = b"\x80\x02}q\x00".to_vec();
        p.extend(key("not_global_step"));
        p.extend_from_slice(b"K\x07");
        assert_eq!(int_after_key(&p, "global_step"), None);
        // Not a zip: nothing.
        std::fs::write(&f, b"not a checkpoint").unwrap();
        assert_eq!(top_level_int(&f, "global_step"), None);
    }
}
