//! Reading what oomguard did not write: checkpoints, trainer state, job files,
//! other runs' journals, kernel logs, config files.
//!
//! Theory of operation. A file someone else can put in oomguard's way may be a
//! FIFO (`open()` for reading waits for a writer, for ever, and with it the
//! whole supervisor: output stops passing through and signals are not acted
//! on), a link to `/dev/zero` (a read that never ends, growing oomguard's
//! memory until the machine kills something), or a sparse file of 20 GB. So
//! every such read here:
//!
//! - opens with `O_NONBLOCK` (a FIFO's open returns at once), and with
//!   `O_NOFOLLOW` where a link is not expected;
//! - checks the open file (`fstat`, never the path again) is a regular file,
//!   and of the expected owner where one is expected;
//! - reads at most a cap: larger is refused ([`read`]) or only its head and
//!   tail are read ([`read_head_tail`]).

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;

/// What a file must be.
#[derive(Debug, Clone, Copy, Default)]
pub struct Expect {
    /// Refuse a symbolic link at the last component.
    pub no_link: bool,
    /// The owner it must have (`Some(euid)`: the user's own).
    pub owner: Option<u32>,
    /// Refuse a file others may write (mode `0o022`).
    pub private: bool,
}

impl Expect {
    /// A file oomguard's own copies wrote: the user's, no link, writable by
    /// nobody else.
    pub fn own() -> Expect {
        Expect {
            no_link: true,
            owner: Some(euid()),
            private: true,
        }
    }

    /// A file the user's command wrote (a checkpoint's): a link is allowed
    /// (checkpoints kept on another disk are linked in), any owner.
    pub fn any() -> Expect {
        Expect::default()
    }
}

/// The most oomguard reads of a config file, a kernel log or a model's config.
pub const MAX_TEXT: u64 = 64 << 20;

/// A config file the command names: a regular file, not blocking, capped.
pub fn read_config(path: &Path) -> io::Result<String> {
    read(path, MAX_TEXT, Expect::any()).and_then(|b| {
        String::from_utf8(b).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
    })
}

pub fn euid() -> u32 {
    nix::unistd::geteuid().as_raw()
}

fn refuse(path: &Path, why: String) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("{} {why}", path.display()),
    )
}

/// Open `path` for reading without blocking, and check what it is.
pub fn open(path: &Path, expect: Expect) -> io::Result<(File, std::fs::Metadata)> {
    let mut flags = libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOCTTY;
    if expect.no_link {
        flags |= libc::O_NOFOLLOW;
    }
    let f = OpenOptions::new()
        .read(true)
        .custom_flags(flags)
        .open(path)
        .map_err(|e| {
            if e.raw_os_error() == Some(libc::ELOOP) {
                refuse(path, "is a symbolic link".into())
            } else {
                e
            }
        })?;
    let m = f.metadata()?;
    if !m.is_file() {
        return Err(refuse(
            path,
            "is not a regular file (a FIFO, a device or a folder)".into(),
        ));
    }
    if let Some(uid) = expect.owner
        && m.uid() != uid
    {
        return Err(refuse(
            path,
            format!("is owned by another user (uid {}, you are {uid})", m.uid()),
        ));
    }
    if expect.private && m.mode() & 0o022 != 0 {
        return Err(refuse(
            path,
            format!("is writable by others (mode {:o})", m.mode() & 0o7777),
        ));
    }
    Ok((f, m))
}

/// The whole of `path`, at most `cap` bytes: a larger file is refused.
pub fn read(path: &Path, cap: u64, expect: Expect) -> io::Result<Vec<u8>> {
    let (f, m) = open(path, expect)?;
    if m.len() > cap {
        return Err(refuse(
            path,
            format!("is {} bytes, more than the {cap} oomguard reads", m.len()),
        ));
    }
    let mut buf = Vec::new();
    f.take(cap + 1).read_to_end(&mut buf)?;
    if buf.len() as u64 > cap {
        return Err(refuse(path, format!("grew past {cap} bytes while read")));
    }
    Ok(buf)
}

/// A file of lines read with a cap: whole when at most `head + tail` bytes,
/// else its first `head` bytes up to the last newline and its last `tail`
/// bytes from the first newline, and how many bytes were left out between.
pub fn read_head_tail(
    path: &Path,
    head: u64,
    tail: u64,
    expect: Expect,
) -> io::Result<(Vec<u8>, u64)> {
    let (mut f, m) = open(path, expect)?;
    let len = m.len();
    if len <= head + tail {
        let mut buf = Vec::new();
        (&mut f).take(head + tail).read_to_end(&mut buf)?;
        return Ok((buf, 0));
    }
    let mut first = Vec::new();
    (&mut f).take(head).read_to_end(&mut first)?;
    if let Some(i) = first.iter().rposition(|&b| b == b'\n') {
        first.truncate(i + 1);
    }
    f.seek(SeekFrom::Start(len - tail))?;
    let mut last = Vec::new();
    f.take(tail).read_to_end(&mut last)?;
    let cut = last
        .iter()
        .position(|&b| b == b'\n')
        .map_or(last.len(), |i| i + 1);
    let left_out = len - first.len() as u64 - (last.len() - cut) as u64;
    first.extend_from_slice(&last[cut..]);
    Ok((first, left_out))
}

/// 16 random bytes as hex, from the kernel.
pub fn random_token() -> String {
    let mut b = [0u8; 16];
    let got = File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut b));
    if got.is_err() {
        // Never reached on Linux; a token still unique to this process and time.
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        b.copy_from_slice(&(t ^ (u128::from(std::process::id()) << 64)).to_le_bytes());
    }
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fifo_a_device_and_a_large_file_are_refused_without_blocking() {
        let t = tempfile::tempdir().unwrap();
        let fifo = t.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let e = read(&fifo, 1 << 20, Expect::any()).unwrap_err();
        assert!(e.to_string().contains("not a regular file"), "{e}");
        let zero = t.path().join("zero");
        std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
        assert!(read(&zero, 1 << 20, Expect::any()).is_err());
        assert!(read(&zero, 1 << 20, Expect::own()).is_err());
        let big = t.path().join("big");
        let f = File::create(&big).unwrap();
        f.set_len(20 << 30).unwrap();
        assert!(read(&big, 1 << 20, Expect::any()).is_err());
        std::fs::write(&big, b"a\nb\nc\nd\n").unwrap();
        let f = File::options().write(true).open(&big).unwrap();
        f.set_len(1 << 30).unwrap();
        drop(f);
        let (bytes, left) = read_head_tail(&big, 4, 16, Expect::any()).unwrap();
        assert_eq!(&bytes[..4], b"a\nb\n");
        assert!(bytes.len() <= 20 && left > 0);
    }
}
