//! When a sent request reached the wire: the kernel's software transmit timestamps
//! (`SO_TIMESTAMPING`, `SOF_TIMESTAMPING_TX_SOFTWARE`).
//!
//! A network device driver stamps each packet as it hands it to the device (`skb_tx_timestamp`;
//! the loopback and veth drivers do too) and queues the stamp on the sending socket's error
//! queue. For a client on the same machine as its server that splits a request's *start* into
//! the client's own transmit path (send → on the wire) and what follows on the server's side
//! (on the wire → the server thread runs), which matters where the client's CPU shares caches
//! with the server's and a cold-making step on the server's CPU also evicts the client's path.
//!
//! The stamps are `CLOCK_REALTIME`; [`first_after`] converts them to `CLOCK_MONOTONIC` (the
//! clock of [`crate::time::now_ns`]) with an offset read when it is called (the tightest of a
//! few back-to-back reads, so the conversion is good to a fraction of a microsecond unless
//! the wall clock is stepped in between).

use std::io;
use std::os::fd::RawFd;

/// `SOF_TIMESTAMPING_*` bits (linux/net_tstamp.h).
const TX_SOFTWARE: u32 = 1 << 1;
const SOFTWARE: u32 = 1 << 4;
const OPT_TSONLY: u32 = 1 << 11;
/// `SCM_TIMESTAMPING` equals `SO_TIMESTAMPING` (the old value, 37, on x86_64 and arm64).
const SO_TIMESTAMPING: libc::c_int = libc::SO_TIMESTAMPING;

/// Ask the kernel for software transmit stamps of everything sent on `fd` (a TCP or UDP
/// socket), stamps only (not the payload) on the error queue. Idempotent.
pub fn enable(fd: RawFd) -> io::Result<()> {
    let flags: u32 = TX_SOFTWARE | SOFTWARE | OPT_TSONLY;
    // SAFETY: `flags` is a valid local of the size passed; an invalid fd only yields an error.
    let r = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            SO_TIMESTAMPING,
            (&flags as *const u32).cast(),
            std::mem::size_of::<u32>() as libc::socklen_t,
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// `CLOCK_REALTIME` − `CLOCK_MONOTONIC`, ns: the tightest bracket of three back-to-back reads.
fn realtime_offset_ns() -> i128 {
    let read = |clock| {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid, writable local; both clocks always exist on Linux.
        unsafe { libc::clock_gettime(clock, &mut ts) };
        ts.tv_sec as i128 * 1_000_000_000 + ts.tv_nsec as i128
    };
    let mut best: Option<(i128, i128)> = None;
    for _ in 0..3 {
        let a = read(libc::CLOCK_MONOTONIC);
        let r = read(libc::CLOCK_REALTIME);
        let b = read(libc::CLOCK_MONOTONIC);
        let width = b - a;
        if best.is_none_or(|(w, _)| width < w) {
            best = Some((width, r - (a + b) / 2));
        }
    }
    best.map_or(0, |(_, off)| off)
}

/// Read every queued transmit stamp of `fd` without blocking (emptying its error queue) and
/// return the earliest at or after `from_ns` (`CLOCK_MONOTONIC`), converted to that clock.
/// `None`: no stamp queued (not enabled, or the device stamps nothing).
pub fn first_after(fd: RawFd, from_ns: u64) -> Option<u64> {
    let off = realtime_offset_ns();
    let mut first: Option<u64> = None;
    // Bounded: a queue holds at most a socket buffer's worth of stamps.
    for _ in 0..4096 {
        let Some(real) = recv_stamp(fd) else {
            break;
        };
        let Some(mono) = real.checked_sub(off).and_then(|v| u64::try_from(v).ok()) else {
            continue;
        };
        if mono >= from_ns && first.is_none_or(|f| mono < f) {
            first = Some(mono);
        }
    }
    first
}

/// Drop every queued stamp of `fd` (before a measured send, so only its stamps remain).
pub fn clear(fd: RawFd) {
    for _ in 0..4096 {
        if recv_stamp(fd).is_none() {
            break;
        }
    }
}

/// A client connection's stamping, for the clients that send requests (the lab's driver
/// connection, the launcher's raw client): enabled once per connection, and each send's stamp
/// read right after the send, before the reply. A stamp left on the error queue counts against
/// the socket's receive memory, and the kernel then holds back the ACK a drained receive buffer
/// would send at once: a server writing its reply in pieces with Nagle on would wait for the
/// client's delayed-ACK timer (40 ms).
#[derive(Debug, Default)]
pub struct SendStamps {
    on: bool,
    last: Option<u64>,
}

impl SendStamps {
    /// Stamp the sends on `fd` from now on (once; queued stamps are dropped); false where the
    /// kernel refuses.
    pub fn enable(&mut self, fd: RawFd) -> bool {
        if !self.on {
            self.on = enable(fd).is_ok();
            clear(fd);
        }
        self.on
    }

    /// A send on `fd` has completed: read its stamp (nothing while not enabled).
    pub fn sent(&mut self, fd: RawFd) {
        if self.on {
            self.last = first_after(fd, 0);
        }
    }

    /// When the last send reached the wire (`CLOCK_MONOTONIC` ns), where stamped.
    pub fn last_ns(&self) -> Option<u64> {
        self.last
    }
}

/// One message of the error queue: its software stamp (`CLOCK_REALTIME` ns), if it has one;
/// `None` when the queue is empty. A message without a stamp yields `Some(i128::MIN)`, which
/// no caller accepts.
fn recv_stamp(fd: RawFd) -> Option<i128> {
    // Room for cmsgs of a timestamping message (scm_timestamping, sock_extended_err + addr).
    let mut control = [0u64; 64];
    let mut data = [0u8; 64];
    let mut iov = libc::iovec {
        iov_base: data.as_mut_ptr().cast(),
        iov_len: data.len(),
    };
    // SAFETY: an all-zero msghdr is valid (null name, no iovecs yet), filled in below.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control);
    // SAFETY: `msg` points at the valid locals `iov`, `data` and `control` of the sizes it
    // names; MSG_DONTWAIT never blocks.
    let r = unsafe { libc::recvmsg(fd, &mut msg, libc::MSG_ERRQUEUE | libc::MSG_DONTWAIT) };
    if r < 0 {
        return None;
    }
    let mut found = i128::MIN;
    // SAFETY: the CMSG_* macros walk the control buffer the kernel filled, within
    // `msg_controllen`; each header they return lies inside `control`.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            let h = &*c;
            if h.cmsg_level == libc::SOL_SOCKET && h.cmsg_type == SO_TIMESTAMPING {
                // struct scm_timestamping { struct timespec ts[3]; }: ts[0] is software.
                let ts = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<libc::timespec>());
                if ts.tv_sec != 0 || ts.tv_nsec != 0 {
                    found = ts.tv_sec as i128 * 1_000_000_000 + ts.tv_nsec as i128;
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    Some(found)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::os::fd::AsRawFd;

    #[test]
    fn a_loopback_send_is_stamped_between_send_and_reply() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mut s, _) = l.accept().unwrap();
        enable(c.as_raw_fd()).unwrap();
        for _ in 0..3 {
            clear(c.as_raw_fd());
            let t0 = crate::time::now_ns();
            c.write_all(b"ping").unwrap();
            let mut b = [0u8; 4];
            s.read_exact(&mut b).unwrap();
            let t1 = crate::time::now_ns();
            let stamp = first_after(c.as_raw_fd(), t0).expect("loopback stamps what it sends");
            // The clock conversion is good to well under a millisecond.
            assert!(
                stamp + 1_000_000 >= t0 && stamp <= t1 + 1_000_000,
                "{t0} {stamp} {t1}"
            );
            assert_eq!(first_after(c.as_raw_fd(), 0), None, "the queue was emptied");
        }
    }

    #[test]
    fn a_socket_without_stamps_has_none() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let _s = l.accept().unwrap();
        c.write_all(b"x").unwrap();
        assert_eq!(first_after(c.as_raw_fd(), 0), None);
        assert!(enable(-1).is_err());
    }
}
