//! Passing a file descriptor over a Unix stream socket (`SCM_RIGHTS`).
//!
//! The CLI hands an agent a connection its process serves: a prefork worker whose sibling
//! workers take every new connection the agent opens itself (the kernel wakes all of them; which
//! one accepts is the scheduler's choice, and under load one sibling can win every time), while
//! the CLI's own connection, the one it found the worker by, is served by that worker for sure.
//!
//! Both ends use the raw `sendmsg`/`recvmsg` system calls: the agent interposes the C
//! library's `recvmsg`, and its control thread must not run through its own hooks.

use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};

/// File descriptors one read takes at most; more that came with it are closed by the kernel.
const MAX_FDS: usize = 4;
/// Room for one `SCM_RIGHTS` message of [`MAX_FDS`] descriptors (`CMSG_SPACE(4 * 4)` is 32 on
/// x86-64), as `u64`s for the header's alignment.
const CMSG_WORDS: usize = 8;

/// Send all of `data` on the Unix stream socket `sock`, with `fd` attached to its first byte
/// (the receiver gets a duplicate of it; ours stays open).
pub fn send_with_fd(sock: RawFd, data: &[u8], fd: RawFd) -> io::Result<()> {
    if data.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "a descriptor travels with at least one byte",
        ));
    }
    let fd_len = std::mem::size_of::<libc::c_int>() as libc::c_uint;
    let mut cbuf = [0u64; CMSG_WORDS];
    let mut iov = libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    };
    let mut msg = header(&mut iov, &mut cbuf);
    // SAFETY: CMSG_SPACE only computes a size.
    msg.msg_controllen = unsafe { libc::CMSG_SPACE(fd_len) } as usize;
    // SAFETY: `msg_control` points at `cbuf` (64 bytes, 8-aligned), and `msg_controllen` (24 for
    // one descriptor) fits in it, so the first header is inside `cbuf`; CMSG_DATA of it lies
    // within the same `CMSG_SPACE(fd_len)` bytes, where the unaligned write of one c_int fits.
    unsafe {
        let c = libc::CMSG_FIRSTHDR(&msg);
        (*c).cmsg_level = libc::SOL_SOCKET;
        (*c).cmsg_type = libc::SCM_RIGHTS;
        (*c).cmsg_len = libc::CMSG_LEN(fd_len) as usize;
        std::ptr::write_unaligned(libc::CMSG_DATA(c) as *mut libc::c_int, fd);
    }
    // SAFETY: `msg` points at `iov` (over `data`, read only by the kernel) and `cbuf`, all alive
    // for the call; the kernel validates `sock` and `fd`.
    let r = unsafe { libc::syscall(libc::SYS_sendmsg, sock, &msg, libc::MSG_NOSIGNAL) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut sent = r as usize;
    while sent < data.len() {
        let rest = &data[sent..];
        // SAFETY: `rest` is a valid readable slice of the given length.
        let r = unsafe {
            libc::syscall(
                libc::SYS_sendto,
                sock,
                rest.as_ptr(),
                rest.len(),
                libc::MSG_NOSIGNAL,
                std::ptr::null::<libc::sockaddr>(),
                0,
            )
        };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        sent += r as usize;
    }
    Ok(())
}

/// Read from the Unix stream socket `sock` into `buf` (blocking or not, as the socket is),
/// appending the descriptors that came with the bytes to `fds` (close-on-exec). Returns the
/// bytes read; 0 when the peer closed.
pub fn recv_with_fds(sock: RawFd, buf: &mut [u8], fds: &mut Vec<OwnedFd>) -> io::Result<usize> {
    let mut cbuf = [0u64; CMSG_WORDS];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr() as *mut libc::c_void,
        iov_len: buf.len(),
    };
    let mut msg = header(&mut iov, &mut cbuf);
    // SAFETY: `msg` points at `iov` (over the writable `buf`) and `cbuf` (writable, its size in
    // `msg_controllen`), both alive for the call; the kernel validates `sock`.
    let r = unsafe { libc::syscall(libc::SYS_recvmsg, sock, &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    let fd_size = std::mem::size_of::<libc::c_int>();
    // SAFETY: the kernel filled `cbuf` with `msg_controllen` bytes of well-formed control
    // headers; CMSG_FIRSTHDR/CMSG_NXTHDR stay within them (null past the end), each header's
    // data holds `(cmsg_len - CMSG_LEN(0)) / 4` descriptors, read unaligned, each one now ours
    // (installed in our table by the kernel, owned by nobody else).
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let data_len = (*c).cmsg_len - libc::CMSG_LEN(0) as usize;
                let p = libc::CMSG_DATA(c) as *const libc::c_int;
                for i in 0..(data_len / fd_size).min(MAX_FDS) {
                    let fd = std::ptr::read_unaligned(p.add(i));
                    fds.push(OwnedFd::from_raw_fd(fd));
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    Ok(r as usize)
}

/// A message header over one buffer (`iov`) and the control buffer `cbuf` (its whole length;
/// the sender shortens it to the one message it writes).
fn header(iov: &mut libc::iovec, cbuf: &mut [u64; CMSG_WORDS]) -> libc::msghdr {
    // SAFETY: all-zero is a valid `msghdr` (null pointers, zero lengths).
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr() as *mut libc::c_void;
    msg.msg_controllen = std::mem::size_of_val(cbuf);
    msg
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::fd::AsRawFd;
    use std::os::unix::net::UnixStream;

    #[test]
    fn a_descriptor_travels_with_its_bytes() {
        let (a, b) = UnixStream::pair().unwrap();
        let (mut pr, mut pw) = std::io::pipe().unwrap();
        send_with_fd(a.as_raw_fd(), b"hello\n", pw.as_raw_fd()).unwrap();
        let mut buf = [0u8; 16];
        let mut fds = Vec::new();
        let n = recv_with_fds(b.as_raw_fd(), &mut buf, &mut fds).unwrap();
        assert_eq!(&buf[..n], b"hello\n");
        assert_eq!(fds.len(), 1);
        // The received descriptor is the pipe's write end: what is written through it arrives.
        let mut w = std::fs::File::from(fds.pop().unwrap());
        w.write_all(b"x").unwrap();
        drop(w);
        pw.write_all(b"y").unwrap();
        drop(pw);
        let mut got = String::new();
        pr.read_to_string(&mut got).unwrap();
        assert_eq!(got, "xy");
    }

    #[test]
    fn plain_bytes_bring_no_descriptor() {
        let (mut a, b) = UnixStream::pair().unwrap();
        a.write_all(b"abc").unwrap();
        let mut buf = [0u8; 8];
        let mut fds = Vec::new();
        assert_eq!(recv_with_fds(b.as_raw_fd(), &mut buf, &mut fds).unwrap(), 3);
        assert!(fds.is_empty());
        drop(a);
        assert_eq!(recv_with_fds(b.as_raw_fd(), &mut buf, &mut fds).unwrap(), 0);
    }

    #[test]
    fn a_descriptor_needs_a_byte() {
        let (a, _b) = UnixStream::pair().unwrap();
        assert!(send_with_fd(a.as_raw_fd(), b"", 0).is_err());
    }
}
