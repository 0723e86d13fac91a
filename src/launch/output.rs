//! Where the child's bytes go: our stdout/stderr (live, byte-exact), then the bounded log.

use std::fs::File;
use std::io::{self, Write};
use std::ops::Range;
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// The most one read takes from the child's output (into the log's ring: `Log::read_from`).
pub(crate) const READ_BUF: usize = 64 * 1024;

/// One of our own output fds (1 or 2), written unbuffered. After EPIPE or another write error
/// it is marked dead and further writes are dropped, so the child keeps being drained.
pub(crate) struct Sink<W: Write> {
    out: W,
    dead: bool,
    /// Set once, when the sink died; the caller turns it into a warning.
    pub(crate) error: Option<io::Error>,
}

impl<W: Write> Sink<W> {
    pub(crate) fn new(out: W) -> Self {
        Sink {
            out,
            dead: false,
            error: None,
        }
    }

    /// Writes all of `chunk`, unless the sink is dead.
    pub(crate) fn write(&mut self, chunk: &[u8]) {
        if self.dead {
            return;
        }
        if let Err(e) = self.out.write_all(chunk).and_then(|()| self.out.flush()) {
            self.dead = true;
            self.error = Some(e);
        }
    }

    #[cfg(test)]
    pub(crate) fn into_inner(self) -> W {
        self.out
    }
}

/// Our fd 1 or 2, written with write(2) directly: no userspace buffering (a `\r` progress
/// bar shows immediately), and if the fd is non-blocking (someone set O_NONBLOCK on a shared
/// terminal) EAGAIN waits for POLLOUT instead of failing.
pub(crate) struct RawOut(RawFd);

impl RawOut {
    pub(crate) fn stdout() -> Self {
        RawOut(1)
    }
    pub(crate) fn stderr() -> Self {
        RawOut(2)
    }
}

impl Write for RawOut {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        loop {
            // SAFETY: buf is a valid slice; fd 1/2 are ours for the life of the process.
            let n = unsafe { libc::write(self.0, buf.as_ptr().cast(), buf.len()) };
            if n >= 0 {
                return Ok(n as usize);
            }
            let e = io::Error::last_os_error();
            match e.kind() {
                io::ErrorKind::Interrupted => continue,
                io::ErrorKind::WouldBlock => {
                    // SAFETY: fd stays open; we only borrow it for poll.
                    let fd = unsafe { BorrowedFd::borrow_raw(self.0) };
                    let mut fds = [nix::poll::PollFd::new(fd, nix::poll::PollFlags::POLLOUT)];
                    let _ = nix::poll::poll(&mut fds, nix::poll::PollTimeout::from(1000u16));
                }
                _ => return Err(e),
            }
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The bounded copy of the output: the first `head` bytes go to the file as they come; the
/// last bytes are kept in a ring in memory, and the last `tail` of them are written at the
/// end, after a marker saying how many bytes were left out. (A 4 MiB ring in a nameless
/// file beside the log kept the tail out of oomguard's memory, but writing every byte to
/// the file was the largest pass-through cost beyond `cat`'s: benches/README.md.) Write
/// errors turn into one warning and stop the file; they never stop supervision.
///
/// The ring is also where the attempt's last output is read from ([`Log::last`]): it
/// holds every byte from the first, whether or not there is a file, so the output is
/// copied once, not once for the log and once more for the report.
pub(crate) struct Log {
    file: Option<File>,
    head: u64,
    tail: usize,
    written_head: u64,
    ring: Ring,
    /// The ring's size: the largest of `tail`, what [`Log::last`] is asked for and
    /// [`READ_BUF`].
    keep: usize,
    total: u64,
    pub(crate) warning: Option<String>,
    path_shown: String,
}

impl Log {
    /// A log written to `path` (none: the ring alone); `keep`: the most [`Log::last`]
    /// will be asked for.
    pub(crate) fn open(path: Option<&Path>, head: u64, tail: u64, keep: usize) -> Log {
        let tail = usize::try_from(tail).unwrap_or(usize::MAX);
        let mut log = Log {
            file: None,
            head,
            tail,
            written_head: 0,
            ring: Ring::default(),
            // The ring is the read buffer too (`read_from`): at least one read's worth.
            keep: keep.max(tail).max(READ_BUF),
            total: 0,
            warning: None,
            path_shown: String::new(),
        };
        let Some(path) = path else {
            return log;
        };
        log.path_shown = path.display().to_string();
        let opened = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            // A symlink planted at the log's name is refused, never followed.
            .custom_flags(libc::O_NOFOLLOW)
            .open(path)
            // An existing file keeps its mode on open; the log must not be world-readable.
            // Only a regular file: never chmod a device someone pointed the log at.
            .and_then(|f| {
                if f.metadata()?.is_file() {
                    f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
                }
                Ok(f)
            });
        match opened {
            Ok(f) => log.file = Some(f),
            Err(e) => {
                log.warning = Some(format!("could not write log {}: {e}", log.path_shown));
            }
        }
        log
    }

    pub(crate) fn feed(&mut self, chunk: &[u8]) {
        self.log_head(chunk);
        self.ring.push(chunk, self.keep);
    }

    /// Reads once from the non-blocking `fd` straight into the ring, where every byte is
    /// kept anyway (so it is not read into a buffer first and copied in: that copy was a
    /// sixth of oomguard's own CPU on progress lines). Returns the ring, taken out so the
    /// bytes can be read beside the log, with where they lie and whether the read filled
    /// all it asked for (more may be waiting); [`Log::put_back`] logs them and puts the
    /// ring back. Ok(None): nothing now; an empty range: end of file.
    pub(crate) fn read_from(
        &mut self,
        fd: RawFd,
    ) -> io::Result<Option<(Ring, Range<usize>, bool)>> {
        let Some((at, filled)) = self.ring.read_from(fd, READ_BUF, self.keep)? else {
            return Ok(None);
        };
        Ok(Some((std::mem::take(&mut self.ring), at, filled)))
    }

    /// The ring [`Log::read_from`] took out, back, with the bytes it read at `at` logged.
    pub(crate) fn put_back(&mut self, ring: Ring, at: Range<usize>) {
        self.log_head(ring.bytes(at));
        self.ring = ring;
    }

    /// Counts `chunk`, and writes what of it falls in the head to the file.
    fn log_head(&mut self, chunk: &[u8]) {
        self.total += chunk.len() as u64;
        if self.file.is_some() && self.written_head < self.head {
            let n = (self.head - self.written_head).min(chunk.len() as u64) as usize;
            self.write_file(&chunk[..n]);
            self.written_head += n as u64;
        }
    }

    /// The last `n` bytes of the output (fewer when there were fewer, or when `n` is more
    /// than the ring keeps).
    pub(crate) fn last(&self, n: usize) -> Vec<u8> {
        let (a, b) = self.ring.as_slices();
        let skip = (a.len() + b.len()).saturating_sub(n);
        if skip >= a.len() {
            b[skip - a.len()..].to_vec()
        } else {
            [&a[skip..], b].concat()
        }
    }

    /// Writes the tail (with the omitted marker when bytes were dropped) and closes the file.
    pub(crate) fn finish(&mut self) {
        if self.file.is_none() {
            return;
        }
        // What came after the head: its last `tail` bytes are written, from the ring.
        let after_head = self.total - self.written_head;
        let written = after_head.min(self.tail.min(self.ring.len()) as u64);
        let omitted = after_head - written;
        if omitted > 0 {
            self.write_file(&crate::run_folder::omitted_marker(omitted));
        }
        let tail = self.last(written as usize);
        self.write_file(&tail);
        // Flushed to the disk on a thread of its own: the next attempt must not wait for
        // the disk (an fsync on a busy machine took 30 ms of the gap between an attempt's
        // exit and the next one's exec). What the log holds is already visible to readers
        // (the page cache); only its durability across a power loss comes a moment later.
        if let Some(f) = self.file.take() {
            let path = self.path_shown.clone();
            let synced = std::thread::Builder::new()
                .name("log-sync".into())
                .spawn(move || {
                    if let Err(e) = f.sync_all() {
                        tracing::warn!("could not write log {path}: {e}");
                    }
                });
            if let Err(e) = synced {
                tracing::debug!("log sync thread: {e}");
            }
        }
    }

    fn write_file(&mut self, bytes: &[u8]) {
        if let Some(f) = self.file.as_mut()
            && let Err(e) = f.write_all(bytes)
        {
            self.fail(e);
        }
    }

    /// The file is given up; the ring goes on (the report still reads the last output).
    fn fail(&mut self, e: io::Error) {
        self.file = None;
        if self.warning.is_none() {
            self.warning = Some(format!("could not write log {}: {e}", self.path_shown));
        }
    }
}

/// The most a [`Ring`] reserves at once.
const RESERVE_AT_MOST: usize = 16 << 20;

/// The last `cap` bytes seen, in a buffer allocated once: each chunk costs one
/// or two `memcpy`s (a `VecDeque<u8>` drained and extended per chunk cost a
/// measurable share of oomguard's CPU on a multi-GB run).
#[derive(Default)]
pub(crate) struct Ring {
    buf: Vec<u8>,
    /// Next write position once `buf` is full.
    pos: usize,
}

impl Ring {
    fn len(&self) -> usize {
        self.buf.len()
    }

    /// Room to fill toward `cap`, once the room there is has been used: the whole size
    /// at once (growing by doubling copied what was kept at each step and held the old
    /// and the new buffer at once: peak RSS). Pages not written yet take no memory. A
    /// cap meant as "everything" grows by steps.
    fn reserve(&mut self, cap: usize) {
        if self.buf.len() == self.buf.capacity() && self.buf.len() < cap {
            self.buf
                .reserve_exact((cap - self.buf.len()).min(RESERVE_AT_MOST));
        }
    }

    pub(crate) fn push(&mut self, chunk: &[u8], cap: usize) {
        let chunk = &chunk[chunk.len().saturating_sub(cap)..];
        self.reserve(cap);
        // Filling up: append.
        let room = cap - self.buf.len();
        let (fill, rest) = chunk.split_at(chunk.len().min(room));
        self.buf.extend_from_slice(fill);
        if rest.is_empty() {
            return;
        }
        // Full: overwrite the oldest bytes, wrapping once at most.
        let first = rest.len().min(cap - self.pos);
        self.buf[self.pos..self.pos + first].copy_from_slice(&rest[..first]);
        let second = rest.len() - first;
        self.buf[..second].copy_from_slice(&rest[first..]);
        self.pos = (self.pos + rest.len()) % cap;
    }

    /// Reads once from `fd` into the ring (at most `max` bytes, up to the end of its
    /// buffer): the range the bytes went to, and whether the read got all it asked for.
    fn read_from(
        &mut self,
        fd: RawFd,
        max: usize,
        cap: usize,
    ) -> io::Result<Option<(Range<usize>, bool)>> {
        assert!(cap > 0, "a ring read into keeps something");
        if self.buf.len() < cap {
            // Filling up: into the spare capacity.
            self.reserve(cap);
            let start = self.buf.len();
            let spare = self.buf.spare_capacity_mut();
            let ask = spare.len().min(cap - start).min(max);
            // SAFETY: `spare` is writable memory of the buffer, `ask` bytes long; read(2)
            // writes at most that many, and only the `n` it wrote are then taken in.
            let got = unsafe { read_raw(fd, spare.as_mut_ptr().cast(), ask)? };
            return Ok(got.map(|n| {
                // SAFETY: the first `n` bytes of the spare capacity were written by read(2).
                unsafe { self.buf.set_len(start + n) };
                (start..start + n, n == ask)
            }));
        }
        // Full: over the oldest bytes, up to the end of the buffer.
        let start = self.pos;
        let ask = (cap - start).min(max);
        let got = read_some(fd, &mut self.buf[start..start + ask])?;
        Ok(got.map(|n| {
            self.pos = (start + n) % cap;
            (start..start + n, n == ask)
        }))
    }

    /// The bytes at `at` (a range [`Ring::read_from`] returned).
    pub(crate) fn bytes(&self, at: Range<usize>) -> &[u8] {
        &self.buf[at]
    }

    /// Oldest first.
    fn as_slices(&self) -> (&[u8], &[u8]) {
        let (newer, older) = self.buf.split_at(self.pos);
        (older, newer)
    }
}

/// Reads once from a non-blocking fd into `buf`. Ok(None): nothing now. Ok(Some(0)): EOF
/// (EIO from a pty master whose slave side is all closed counts as EOF).
pub(crate) fn read_some(fd: RawFd, buf: &mut [u8]) -> io::Result<Option<usize>> {
    // SAFETY: buf is a valid, writable slice of buf.len() bytes.
    unsafe { read_raw(fd, buf.as_mut_ptr(), buf.len()) }
}

/// [`read_some`] into `len` bytes at `ptr`.
///
/// # Safety
/// `ptr` must be valid for writes of `len` bytes.
unsafe fn read_raw(fd: RawFd, ptr: *mut u8, len: usize) -> io::Result<Option<usize>> {
    loop {
        // SAFETY: the caller's promise.
        let n = unsafe { libc::read(fd, ptr.cast(), len) };
        if n >= 0 {
            return Ok(Some(n as usize));
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EAGAIN) => return Ok(None),
            Some(libc::EIO) => return Ok(Some(0)),
            _ => return Err(e),
        }
    }
}

/// Grow a pipe we read from to 1 MiB (the unprivileged maximum on Linux): a chatty
/// command then blocks less often on a full pipe, and oomguard wakes less often
/// (measured: about a third of `cat`'s context switches on a 1 GiB log). The read
/// size stays at 64 KiB: 256 KiB measured slower (the copy out of the pipe no
/// longer stays in cache for the scan and the log). Output still passes
/// through as soon as it is written (poll wakes on any data). Best effort: a pty
/// or an old kernel keeps its size. Returns the pipe's size now (0: not a pipe).
pub(crate) fn grow_pipe(fd: &impl AsRawFd) -> usize {
    // SAFETY: fcntl on an fd we own; failure only leaves the size as it was.
    let size = unsafe {
        libc::fcntl(fd.as_raw_fd(), libc::F_SETPIPE_SZ, PIPE_SIZE as libc::c_int);
        libc::fcntl(fd.as_raw_fd(), libc::F_GETPIPE_SZ)
    };
    usize::try_from(size).unwrap_or(0)
}

/// The size [`grow_pipe`] asks for.
pub(crate) const PIPE_SIZE: usize = 1 << 20;

pub(crate) fn set_nonblocking(fd: &impl AsRawFd) -> io::Result<()> {
    let fd = fd.as_raw_fd();
    // SAFETY: fcntl on an fd we own.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        if flags < 0 || libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

#[cfg(test)]
mod ring_tests {
    use super::{Log, Ring};

    #[test]
    fn the_tail_is_kept_in_memory_and_written_after_the_marker() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("l");
        let data: Vec<u8> = (0..5_000u32).map(|i| (i % 251) as u8).collect();
        let mut log = Log::open(Some(&path), 100, 300, 0);
        for c in data.chunks(77) {
            log.feed(c);
        }
        // The ring is also the read buffer: it keeps at least a read's worth (here all).
        assert!(log.ring.len() == 5_000);
        assert!(log.last(1000) == data[5_000 - 1000..]);
        assert!(log.last(7) == data[5_000 - 7..]);
        log.finish();
        assert!(log.warning.is_none());
        let mut want = data[..100].to_vec();
        want.extend_from_slice(b"\n[oomguard: 4600 bytes omitted]\n");
        want.extend_from_slice(&data[5_000 - 300..]);
        assert!(std::fs::read(&path).unwrap() == want);
    }

    #[test]
    fn reads_into_the_ring_hand_out_each_byte_once_and_keep_the_last_cap_in_order() {
        use std::io::Write;
        let data: Vec<u8> = (0..50_000u32).map(|i| (i % 253) as u8).collect();
        for (cap, max, piece) in [(1_000, 300, 77), (1_000, 4096, 999), (4096, 1000, 5000)] {
            let (r, w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_NONBLOCK).unwrap();
            let mut w = std::fs::File::from(w);
            let mut ring = Ring::default();
            let mut seen = Vec::new();
            for c in data.chunks(piece) {
                w.write_all(c).unwrap();
                while let Some((at, filled)) = ring
                    .read_from(std::os::fd::AsRawFd::as_raw_fd(&r), max, cap)
                    .unwrap()
                {
                    assert!(at.len() <= max && !at.is_empty());
                    seen.extend_from_slice(ring.bytes(at.clone()));
                    // A short read emptied the pipe; a full one may have left some.
                    if !filled {
                        assert!(at.len() < max.min(cap));
                        break;
                    }
                }
            }
            assert!(seen == data, "cap {cap}, max {max}, piece {piece}");
            let (a, b) = ring.as_slices();
            assert!([a, b].concat() == data[data.len() - cap..], "cap {cap}");
            drop(w);
            let end = ring.read_from(std::os::fd::AsRawFd::as_raw_fd(&r), max, cap);
            assert!(matches!(end, Ok(Some((at, false))) if at.is_empty()));
        }
    }

    #[test]
    fn a_ring_without_a_real_cap_keeps_everything() {
        let mut r = Ring::default();
        for c in [b"ab".as_slice(), b"cde", b"f"] {
            r.push(c, usize::MAX);
        }
        let (a, b) = r.as_slices();
        assert_eq!([a, b].concat(), b"abcdef");
    }

    #[test]
    fn keeps_the_last_cap_bytes_in_order_for_any_chunking() {
        let data: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
        for cap in [1usize, 7, 64, 1000, 4096, 20_000] {
            for chunk in [1usize, 3, 63, 64, 999, 5000, 10_000] {
                let mut r = Ring::default();
                for c in data.chunks(chunk) {
                    r.push(c, cap);
                }
                let (a, b) = r.as_slices();
                let got: Vec<u8> = a.iter().chain(b).copied().collect();
                let want = &data[data.len().saturating_sub(cap)..];
                assert_eq!(got, want, "cap {cap} chunk {chunk}");
                assert!(r.len() <= cap);
            }
        }
    }
}
